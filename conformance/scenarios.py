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


def _group(
    guard: Guard,
    builder: KVCacheConfigBuilder,
    config: PlanningConfig,
    specs: Mapping[str, KVCacheSpec],
) -> tuple[CallResult, bool]:
    given = dict(deep_copy(dict(specs)))
    names = list(given)
    result = guard.call(
        "get_kv_cache_groups",
        builder.get_kv_cache_groups,
        config,
        given,
        validate=_groups_validator,
    )
    # vLLM's contract lets grouping rewrite the specs in place (promotion,
    # unification; Core hands it a merged copy), but not drop or add layers.
    return result, snapshot_differs(names, list(given))


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
    return (
        len(names) == len(set(names))
        and set(names) == set(specs)
        and all(g.layer_names for g in groups)
    )


def _valid_groups(
    config: PlanningConfig, specs: Mapping[str, KVCacheSpec], result: CallResult
) -> bool:
    """Whether the builder's groups keep every grouping invariant (so placement can use them)."""
    from conformance.invariants import CATALOG

    if not _partitions(result.value, specs):
        return False
    obs = GroupingObservation(
        config=config, specs=specs, first=result, second=result, fresh=result, mutated=False
    )
    return not any(
        inv.check(obs)
        for inv in CATALOG
        if inv.scenario == "grouping" and not inv.id.startswith("KV-CALL")
    )


def _overrides_pool_bytes(builder: KVCacheConfigBuilder) -> bool:
    return (
        type(builder)._get_pool_bytes_per_block
        is not KVCacheConfigBuilder._get_pool_bytes_per_block
    )


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
    if result.ok and _valid_groups(config, specs, result):
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
    if groups_result.ok and _valid_groups(config, specs, groups_result):
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


from conformance.bounds import absurd_size, size_bound  # noqa: E402


class _ContractBrokenError(Exception):
    """The builder broke a hook-level promise inside Core's flow."""


class _Checked(KVCacheConfigBuilder):
    """Delegates to a builder and stops Core's flow when a hook breaks its contract.

    Core-flow invariants judge Core given honest hooks; a hook that lies is
    reported by the grouping and placement invariants, so Core's result is
    then inconclusive instead of a second report of the same bug.
    """

    def __init__(self, inner: KVCacheConfigBuilder) -> None:
        self.inner = inner
        self.declared: int | None = None

    def get_kv_cache_groups(
        self, config: PlanningConfig, kv_cache_spec: Mapping[str, KVCacheSpec]
    ) -> list[KVCacheGroupSpec]:
        try:
            groups = self.inner.get_kv_cache_groups(config, kv_cache_spec)
        except Exception as exc:
            raise _ContractBrokenError(f"get_kv_cache_groups raised {exc!r}") from exc
        if _groups_validator(groups) is not None:
            raise _ContractBrokenError("get_kv_cache_groups returned the wrong type")
        return groups

    def get_kv_cache_config_from_groups(
        self, config: PlanningConfig, kv_cache_groups: Sequence[KVCacheGroupSpec], num_blocks: int
    ) -> KVCacheConfig:
        given = list(kv_cache_groups)
        try:
            result = self.inner.get_kv_cache_config_from_groups(config, list(given), num_blocks)
        except Exception as exc:
            raise _ContractBrokenError(f"placement raised {exc!r}") from exc
        if _config_validator(result) is not None:
            raise _ContractBrokenError("placement returned the wrong type")
        if result.num_blocks != num_blocks or list(result.kv_cache_groups) != given:
            raise _ContractBrokenError("placement changed num_blocks or the groups")
        sizes = {t.size for t in result.device_tensors}
        if self.declared is None and len(sizes) > 1:
            raise _ContractBrokenError("several device backings")
        total = sum(sizes)
        if self.declared is not None and total != self.declared * num_blocks:
            raise _ContractBrokenError("pool bytes per block disagree with the placement")
        placed = [n for t in result.device_tensors for n in t.layers]
        wanted = [n for g in given if not g.host_resident for n in g.layer_names]
        if sorted(placed) != sorted(wanted):
            raise _ContractBrokenError("device tensors do not hold each device layer once")
        if absurd_size(total, num_blocks, size_bound(given)):
            raise _ContractBrokenError("absurd backing size")
        if total % max(num_blocks, 1):
            raise _ContractBrokenError("backing not a whole number of blocks")
        if num_blocks != 1:
            # Core's arithmetic assumes size(n) == n * size(1) (SPEC 2 #3-4).
            try:
                one = self.inner.get_kv_cache_config_from_groups(config, list(given), 1)
            except Exception as exc:
                raise _ContractBrokenError(f"placement raised {exc!r}") from exc
            if _config_validator(one) is not None or total != num_blocks * sum(
                {t.size for t in one.device_tensors}
            ):
                raise _ContractBrokenError("backing size not linear in num_blocks")
        return result

    def _get_pool_bytes_per_block(
        self, config: PlanningConfig, kv_cache_groups: Sequence[KVCacheGroupSpec]
    ) -> int | None:
        try:
            declared = self.inner._get_pool_bytes_per_block(config, kv_cache_groups)
        except Exception as exc:
            raise _ContractBrokenError(f"_get_pool_bytes_per_block raised {exc!r}") from exc
        if declared is not None:
            self.declared = declared
        return declared


def observe_core(
    factory: BuilderFactory,
    guard: Guard,
    config: PlanningConfig,
    workers: Sequence[Mapping[str, KVCacheSpec]],
    available_memory: Sequence[int],
    core: Callable[..., Any] | None = None,
) -> CoreObservation:
    """Run Core's flow (kvref's by default) with a fresh builder per phase, as one guarded call.

    ``core`` replaces :func:`kvref.planning.plan_kv_cache` (the kit's own
    tests use it to show the Core invariants catch a broken flow).
    """

    class _Fresh(KVCacheConfigBuilder):
        # Core instantiates a builder per phase; route each to the factory.
        def __new__(cls) -> Any:
            return _Checked(factory())

        def get_kv_cache_groups(  # pragma: no cover - never instantiated
            self, config: PlanningConfig, kv_cache_spec: Mapping[str, KVCacheSpec]
        ) -> list[KVCacheGroupSpec]:
            raise NotImplementedError

        def get_kv_cache_config_from_groups(  # pragma: no cover - never instantiated
            self,
            config: PlanningConfig,
            kv_cache_groups: Sequence[KVCacheGroupSpec],
            num_blocks: int,
        ) -> KVCacheConfig:
            raise NotImplementedError

    copies = [dict(deep_copy(dict(w))) for w in workers]
    flow = core or plan_kv_cache
    # Core makes many hook calls; give the whole flow a proportionally longer deadline.
    result = guard.call(
        "core", flow, _Fresh, config, copies, list(available_memory), timeout=guard.timeout * 20
    )
    if result.error_type is not None and issubclass(result.error_type, _ContractBrokenError):
        # A hook raised or broke its contract inside Core: the grouping and
        # placement scenarios report that; Core's result says nothing.
        result = attrs.evolve(result, hook="core-builder")
    return CoreObservation(
        config=config,
        workers=tuple(dict(w) for w in workers),
        available_memory=tuple(available_memory),
        result=result,
    )
