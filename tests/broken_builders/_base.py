"""What the deliberately broken builders share: base classes, and how a meta-test judges one."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from kvref import (
    KVCacheConfig,
    KVCacheGroupSpec,
    PlanningConfig,
    ReferenceKVCacheConfigBuilder,
)
from kvref.specs import KVCacheSpec

if TYPE_CHECKING:
    from conformance.report.model import Report

Groups = list[KVCacheGroupSpec]


class _Base(ReferenceKVCacheConfigBuilder):
    CAUGHT_BY = ""
    #: Invariants that see the same bug from another side (a stride that both
    #: overlaps and is not the layout's, the same page beside host groups).
    ALSO: frozenset[str] = frozenset()
    #: Examples the meta-test needs to meet the bug at its seed.
    EXAMPLES = 25


def _with_tensors(config: KVCacheConfig, tensors: Sequence[Any], **changes: Any) -> KVCacheConfig:
    return attrs.evolve(config, kv_cache_tensors=list(tensors), **changes)


def assert_caught(report: Report, meant: str, also: frozenset[str]) -> None:
    """``meant`` failed with a counterexample and a reproduce line; nothing unmeant failed.

    The same assertions as tests/kit/test_meta.py's, so that a builder proven here
    need not be run there again in the default suite.
    """
    failed = set(report.failed_ids)
    assert meant in failed, failed
    assert failed <= {meant} | also, failed
    failure = next(r for r in report.failures if r.id == meant)
    assert failure.violations and failure.counterexample and failure.counterexample_python
    assert failure.reproduce and meant in failure.reproduce


def meta_timeout(builder: type) -> float:
    """The per-call deadline the meta runs give ``builder``: short only for the one that hangs.

    A tight deadline for every builder made honest calls time out on a cold or
    loaded machine (a fresh-clone CI run failed GroupsNotEchoed that way, H2 and
    H4 saw it under load), which reads as a second, unmeant failure.  Used by
    tests/kit/test_meta.py and tests/kit/run/test_reproduce.py, whose runs must match.
    """
    return 0.5 if getattr(builder, "CAUGHT_BY", None) == "KV-CALL-TIMEOUT" else 5.0


class _Placement(_Base):
    def fix(self, config: PlanningConfig, result: KVCacheConfig, num_blocks: int) -> KVCacheConfig:
        raise NotImplementedError

    def get_kv_cache_config_from_groups(
        self, config: PlanningConfig, kv_cache_groups: Sequence[KVCacheGroupSpec], num_blocks: int
    ) -> KVCacheConfig:
        result = super().get_kv_cache_config_from_groups(config, kv_cache_groups, num_blocks)
        if not result.kv_cache_tensors:
            return result
        return self.fix(config, result, num_blocks)


def _layer_specs(group: KVCacheGroupSpec) -> list[KVCacheSpec]:
    from kvref import UniformTypeKVCacheSpecs

    spec = group.kv_cache_spec
    if isinstance(spec, UniformTypeKVCacheSpecs):
        return list(spec.kv_cache_specs.values())
    return [spec]


def _with_layer_specs(
    group: KVCacheGroupSpec, change: Callable[[KVCacheSpec], KVCacheSpec]
) -> KVCacheGroupSpec:
    """``group`` with ``change(spec)`` applied to every layer spec (wrapper included)."""
    from kvref import UniformTypeKVCacheSpecs

    spec = group.kv_cache_spec
    if isinstance(spec, UniformTypeKVCacheSpecs):
        inner = {n: change(s) for n, s in spec.kv_cache_specs.items()}
        return attrs.evolve(group, kv_cache_spec=UniformTypeKVCacheSpecs(kv_cache_specs=inner))
    return attrs.evolve(group, kv_cache_spec=change(spec))
