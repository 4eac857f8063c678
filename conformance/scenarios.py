"""Turn a generated planning problem into observations of a builder.

Each function makes the builder calls one scenario needs, through a
:class:`~conformance.guard.Guard`, on deep copies of the inputs, and returns
an observation for the invariants to read.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from conformance.guard import CallResult, Guard, deep_copy, snapshot_differs
from conformance.observations import (
    CoreObservation,
    GroupingObservation,
    HostObservation,
    PlacementObservation,
)
from kvref.builder import KVCacheConfigBuilder, ReferenceKVCacheConfigBuilder
from kvref.config import PlanningConfig
from kvref.errors import KVRefError
from kvref.planning import plan_kv_cache
from kvref.records import KVCacheConfig, KVCacheGroupSpec
from kvref.specs import KVCacheSpec

__all__ = [
    "BuilderFactory",
    "observe_core",
    "observe_grouping",
    "observe_host",
    "observe_placement",
]

#: Makes a fresh builder, as vLLM does for every phase.
BuilderFactory = Callable[[], KVCacheConfigBuilder]

_REFERENCE = ReferenceKVCacheConfigBuilder()


def _groups_validator(value: Any) -> str | None:
    if not isinstance(value, list) or not all(isinstance(g, KVCacheGroupSpec) for g in value):
        return f"{type(value).__name__} ({value!r:.80}), not a list of KVCacheGroupSpec"
    return None


def _config_validator(value: Any) -> str | None:
    if not isinstance(value, KVCacheConfig):
        return f"{type(value).__name__} ({value!r:.80}), not a KVCacheConfig"
    return None


def _pool_validator(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        return f"{value!r}, not a positive int of bytes per block"
    return None


def _group(guard: Guard, builder: KVCacheConfigBuilder, config: PlanningConfig, specs: Mapping[str, KVCacheSpec]) -> tuple[CallResult, bool]:
    given = dict(deep_copy(dict(specs)))
    pristine = deep_copy(given)
    result = guard.call(
        "get_kv_cache_groups", builder.get_kv_cache_groups, config, given, validate=_groups_validator
    )
    return result, snapshot_differs(pristine, given)


def observe_grouping(
    factory: BuilderFactory, guard: Guard, config: PlanningConfig, specs: Mapping[str, KVCacheSpec]
) -> GroupingObservation:
    """Call ``get_kv_cache_groups`` twice on one instance and once on a fresh one."""
    builder = factory()
    first, mutated = _group(guard, builder, config, specs)
    second, mutated_again = _group(guard, builder, config, specs)
    fresh, _ = _group(guard, factory(), config, specs)
    return GroupingObservation(
        config=config,
        specs=dict(specs),
        first=first,
        second=second,
        fresh=fresh,
        mutated=mutated or mutated_again,
    )


def _partitions(groups: Sequence[KVCacheGroupSpec], specs: Mapping[str, KVCacheSpec]) -> bool:
    names = [n for g in groups for n in g.layer_names]
    return len(names) == len(set(names)) and set(names) == set(specs) and all(
        g.layer_names for g in groups
    )


def _overrides_pool_bytes(builder: KVCacheConfigBuilder) -> bool:
    return type(builder)._get_pool_bytes_per_block is not KVCacheConfigBuilder._get_pool_bytes_per_block


def _place(
    guard: Guard,
    builder: KVCacheConfigBuilder,
    config: PlanningConfig,
    groups: Sequence[KVCacheGroupSpec],
    num_blocks: int,
) -> tuple[CallResult, bool]:
    given = list(deep_copy(list(groups)))
    pristine = deep_copy(given)
    result = guard.call(
        "get_kv_cache_config_from_groups",
        builder.get_kv_cache_config_from_groups,
        config,
        given,
        num_blocks,
        validate=_config_validator,
    )
    return result, snapshot_differs(pristine, given)


def builder_or_reference_groups(
    factory: BuilderFactory, guard: Guard, config: PlanningConfig, specs: Mapping[str, KVCacheSpec]
) -> tuple[tuple[KVCacheGroupSpec, ...], str]:
    """The builder's groups when they partition the layers, else the reference's.

    Placement is checked on valid groups so that a grouping bug is reported
    once, by the grouping invariants, and placement is still exercised.
    """
    result, _ = _group(guard, factory(), config, specs)
    if result.ok and _partitions(result.value, specs):
        return tuple(result.value), "builder"
    return tuple(_REFERENCE.get_kv_cache_groups(config, dict(specs))), "reference"


def observe_placement(
    factory: BuilderFactory,
    guard: Guard,
    config: PlanningConfig,
    specs: Mapping[str, KVCacheSpec],
    num_blocks: int,
) -> PlacementObservation:
    """Place the groups at 1, ``num_blocks`` and a larger count; repeat; fresh; empty."""
    config = attrs.evolve(config, num_gpu_blocks_override=None)
    groups, source = builder_or_reference_groups(factory, guard, config, specs)
    builder = factory()
    counts = sorted({1, num_blocks, num_blocks + 1 + num_blocks // 2})
    results: dict[int, CallResult] = {}
    mutated = False
    for n in counts:
        results[n], changed = _place(guard, builder, config, groups, n)
        mutated = mutated or changed
    repeat, changed = _place(guard, builder, config, groups, num_blocks)
    fresh, _ = _place(guard, factory(), config, groups, num_blocks)
    pool: CallResult | None = None
    if _overrides_pool_bytes(builder):
        pool = guard.call(
            "_get_pool_bytes_per_block",
            builder._get_pool_bytes_per_block,
            config,
            list(deep_copy(list(groups))),
            validate=_pool_validator,
        )
    empty, _ = _place(guard, builder, config, [], 1)
    return PlacementObservation(
        config=config,
        specs=dict(specs),
        groups=groups,
        groups_source=source,
        num_blocks=num_blocks,
        results=results,
        repeat=repeat,
        fresh=fresh,
        mutated=mutated or changed,
        pool_bytes=pool,
        empty=empty,
    )


def observe_host(
    factory: BuilderFactory,
    guard: Guard,
    config: PlanningConfig,
    specs: Mapping[str, KVCacheSpec],
    num_blocks: int,
) -> HostObservation:
    """Group and place a model whose config keeps some layers on the host."""
    builder = factory()
    groups_result, _ = _group(guard, builder, config, specs)
    placed = device_only = None
    if groups_result.ok:
        groups = list(groups_result.value)
        placed, _ = _place(guard, builder, config, groups, num_blocks)
        device_groups = [g for g in groups if not g.host_resident]
        device_only, _ = _place(guard, builder, config, device_groups, num_blocks)
    return HostObservation(
        config=config,
        specs=dict(specs),
        groups=groups_result,
        placed=placed,
        device_only=device_only,
        num_blocks=num_blocks,
    )


def observe_core(
    factory: BuilderFactory,
    guard: Guard,
    config: PlanningConfig,
    workers: Sequence[Mapping[str, KVCacheSpec]],
    available_memory: Sequence[int],
) -> CoreObservation:
    """Run Core's flow (kvref's) with a fresh builder per phase, as one guarded call."""

    class _Fresh(KVCacheConfigBuilder):
        # Core instantiates a builder per phase; route each to the factory.
        def __new__(cls) -> Any:  # type: ignore[misc]
            return factory()

        def get_kv_cache_groups(self, config: PlanningConfig, kv_cache_spec: Mapping[str, KVCacheSpec]) -> list[KVCacheGroupSpec]:  # pragma: no cover - never instantiated
            raise NotImplementedError

        def get_kv_cache_config_from_groups(self, config: PlanningConfig, kv_cache_groups: Sequence[KVCacheGroupSpec], num_blocks: int) -> KVCacheConfig:  # pragma: no cover
            raise NotImplementedError

    copies = [dict(deep_copy(dict(w))) for w in workers]
    result = guard.call("core", plan_kv_cache, _Fresh, config, copies, list(available_memory))
    if result.error_type is not None and not issubclass(result.error_type, KVRefError):
        # The builder raised inside Core: that is KV-CALL-RAISES's finding from
        # the grouping and placement scenarios, not a Core-flow result.
        result = attrs.evolve(result, hook="core-builder")
    return CoreObservation(
        config=config,
        workers=tuple(dict(w) for w in workers),
        available_memory=tuple(available_memory),
        result=result,
    )
