"""What the deliberately broken builders share: base classes, and how a meta-test judges one."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import attrs

from kvref import (
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheTensor,
    PlanningConfig,
    ReferenceKVCacheConfigBuilder,
)
from kvref.specs import KVCacheSpec

if TYPE_CHECKING:
    from conformance.report.model import Report

Groups = list[KVCacheGroupSpec]
#: The layer specs a grouping hook is given.
Specs = Mapping[str, KVCacheSpec]


class _Base(ReferenceKVCacheConfigBuilder):
    CAUGHT_BY = ""
    #: Invariants that see the same bug from another side (a stride that both
    #: overlaps and is not the layout's, the same page beside host groups).
    ALSO: frozenset[str] = frozenset()
    #: Examples the meta-test needs to meet the bug at its seed.
    EXAMPLES = 25


#: The collections the meta-tests draw broken builders from; broken_builders
#: reads each as a tuple (``ALL``, ``POWER``...), by module, then in definition order.
Collection = Literal["all", "power", "field", "field_regimes", "reproduced"]

#: Each collection's builders, filled where each is defined (``@member_of``).
COLLECTIONS: dict[Collection, list[type[_Base]]] = {
    # The meta-tests' broken builders (tests/kit/test_meta.py): each caught at its
    # ``EXAMPLES`` (seed 11) by exactly its invariant.  Of the power ones,
    # RaisesOnEmptyGroup needs Core's rare empty projections:
    # tests/kit/check/test_power.py only.
    "all": [],
    # One broken builder per class of once-invisible bug
    # (tests/kit/check/test_power.py: caught at 50 examples).
    "power": [],
    # The broken builders of bugs seen in the field, each caught by its new invariant.
    "field": [],
    # The field regimes the default generation reaches as classes
    # (tests/kit/generate/test_field_generation.py: caught at 50 examples, seeds 1-5).
    "field_regimes": [],
    # Builders whose printed reproduce line the default suite reruns in a fresh
    # process (tests/kit/test_meta.py); every builder's line is rerun under `-m slow`
    # (tests/kit/run/test_reproduce.py).  One per kind of failure: grouping, placement,
    # a hang, Core's flow.
    "reproduced": [],
}

_Builder = TypeVar("_Builder", bound="type[_Base]")


def member_of(*collections: Collection) -> Callable[[_Builder], _Builder]:
    """A class decorator: the broken builder joins each of ``collections``.

    The builder says where it is defined which runs take it, so that adding
    one is one place, not a class and a list entry elsewhere.
    """

    def join(builder: _Builder) -> _Builder:
        for name in collections:
            COLLECTIONS[name].append(builder)
        return builder

    return join


def _with_tensors(config: KVCacheConfig, tensors: Sequence[Any], **changes: Any) -> KVCacheConfig:
    return attrs.evolve(config, kv_cache_tensors=list(tensors), **changes)


def _on_host(tensor: KVCacheTensor) -> bool:
    return tensor.host_resident


def _on_device(tensor: KVCacheTensor) -> bool:
    return not tensor.host_resident


def _change_tensors(
    config: KVCacheConfig,
    change: Callable[[KVCacheTensor], KVCacheTensor],
    only: Callable[[KVCacheTensor], bool] | None = None,
) -> KVCacheConfig:
    """``config`` with ``change(t)`` for every tensor ``only`` picks (every tensor without it).

    Most placement bugs corrupt one field of some tensors and keep the others
    as placed: the tensors not picked stay in place, in order.
    """
    return _with_tensors(
        config,
        [change(t) if only is None or only(t) else t for t in config.kv_cache_tensors],
    )


def _change_fields(config: KVCacheConfig, field: Callable[[int], int]) -> KVCacheConfig:
    """``config`` with every tensor's offset and strides passed through ``field``.

    How a descriptor that narrows its integers (32-bit, signed) writes a plan.
    """
    return _change_tensors(
        config,
        lambda t: attrs.evolve(
            t,
            offset=field(t.offset),
            layer_stride=field(t.layer_stride),
            block_stride=field(t.block_stride),
        ),
    )


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


class _Grouping(_Base):
    """A builder whose bug is in the groups: ``regroup`` changes the reference's."""

    def regroup(self, config: PlanningConfig, kv_cache_spec: Specs, groups: Groups) -> Groups:
        raise NotImplementedError

    def get_kv_cache_groups(
        self, config: PlanningConfig, kv_cache_spec: Mapping[str, KVCacheSpec]
    ) -> Groups:
        groups = super().get_kv_cache_groups(config, kv_cache_spec)
        return self.regroup(config, kv_cache_spec, groups)


class _LayerSpecs(_Grouping):
    """A builder whose bug is in every layer spec of its groups: ``respec`` changes each."""

    def respec(self, spec: KVCacheSpec) -> KVCacheSpec:
        raise NotImplementedError

    def regroup(self, config: PlanningConfig, kv_cache_spec: Specs, groups: Groups) -> Groups:
        return [_with_layer_specs(g, self.respec) for g in groups]


class _Regiven(_Base):
    """A builder that places other groups than it is given, and reports the given ones.

    ``regive`` says what it places instead; the bug is in the placement only.
    """

    def regive(self, config: PlanningConfig, kv_cache_groups: Sequence[KVCacheGroupSpec]) -> Groups:
        raise NotImplementedError

    def get_kv_cache_config_from_groups(
        self, config: PlanningConfig, kv_cache_groups: Sequence[KVCacheGroupSpec], num_blocks: int
    ) -> KVCacheConfig:
        given = self.regive(config, kv_cache_groups)
        result = super().get_kv_cache_config_from_groups(config, given, num_blocks)
        return attrs.evolve(result, kv_cache_groups=list(kv_cache_groups))


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


class _LayerOuter(_Placement):
    """A builder that misplaces device tensors in layer-outer layouts only.

    ``restep`` changes each device tensor given the spec of its first layer;
    tensors of no known layer, host tensors and block-outer plans stay as placed.
    """

    def restep(
        self, result: KVCacheConfig, tensor: KVCacheTensor, spec: KVCacheSpec
    ) -> KVCacheTensor:
        raise NotImplementedError

    def fix(self, config: PlanningConfig, result: KVCacheConfig, num_blocks: int) -> KVCacheConfig:
        if config.kv_cache_layout.is_block_outermost:
            return result
        specs = result.layer_specs()

        def change(t: KVCacheTensor) -> KVCacheTensor:
            spec = specs.get(t.layers[0]) if t.layers else None
            return t if spec is None else self.restep(result, t, spec)

        return _change_tensors(result, change, _on_device)
