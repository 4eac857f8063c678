"""Core's cross-worker planning flow (contract.md#core-flow).

Core merges the workers' layer specs, asks a builder for global groups,
projects them onto each worker, turns profiled memory into a block count
(override, null block, auto-fit, admission check) and makes every worker
agree on the smallest count.

A builder may be given as an instance, as a class, or as ``None``: with a
class every phase gets a fresh instance, and with ``None`` a fresh instance
of the builder the config selects (:mod:`kvref.resolution`), as vLLM does
(contract.md#the-builder-interface), so a stateful builder shows its bugs here too.

Deliberate differences from vLLM (contract.md#deliberate-differences): a projected
uniform-type group with no layers on a worker stays empty (no tensors; vLLM 0.34.0 agrees),
a worker holding no KV layer
while others do takes the others' block count instead of dividing by zero, and every failure is a
typed :class:`~kvref.errors.KVRefError`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import attrs

from kvref._math import cdiv
from kvref.builder import KVCacheConfigBuilder
from kvref.config import PlanningConfig
from kvref.errors import (
    ConfigError,
    InsufficientMemoryError,
    KVRefError,
    PartitionError,
    PlanningError,
    WorkerSpecMismatchError,
)
from kvref.partition import (
    check_exact_partition,
    check_layer_spec,
    check_spec_fields,
    check_spec_registry,
    check_wrapped_layers,
)
from kvref.placement import pool_bytes_per_block
from kvref.records import KVCacheConfig, KVCacheGroupSpec
from kvref.resolution import get_kv_cache_config_builder
from kvref.specs import (
    AttentionSpec,
    KVCacheSpec,
    SlidingWindowSpec,
    UniformTypeKVCacheSpecs,
)

__all__ = [
    "BuilderLike",
    "KVCachePlan",
    "WorkerPlan",
    "check_exact_partition",
    "fresh_builder",
    "get_global_kv_cache_groups",
    "get_kv_cache_configs",
    "max_memory_usage_bytes_from_groups",
    "plan_kv_cache",
    "pool_bytes_per_block_from_builder",
    "project_kv_cache_groups_to_worker",
]

#: A builder instance, a builder class instantiated afresh for every phase,
#: or ``None``: the builder the config selects, resolved afresh for every phase.
BuilderLike = KVCacheConfigBuilder | type[KVCacheConfigBuilder] | None

_GIB = 2**30


def fresh_builder(builder: BuilderLike, config: PlanningConfig) -> KVCacheConfigBuilder:
    """The builder for one phase: a new instance of a class, resolved from ``config`` for ``None``.

    Raises:
        BuilderResolutionError: ``builder`` is ``None`` and the config's
            builder qualname does not resolve (see :mod:`kvref.resolution`).
    """
    if builder is None:
        return get_kv_cache_config_builder(config)
    if isinstance(builder, type):
        return builder()
    return builder


@attrs.frozen(kw_only=True)
class WorkerPlan:
    """What Core computed for one worker (the figures behind its config).

    Attributes:
        available_memory: bytes profiled for the KV cache.
        effective_available_memory: after the override (``K * bpb``), else the same.
        pool_bytes_per_block: the probe's bytes per block (0 without layers).
        check_memory: effective memory less the null block.
        needed_memory: bytes one request at the final ``max_model_len`` needs.
        num_blocks_before_min: the worker's own block count before convergence.
    """

    available_memory: int
    effective_available_memory: int
    pool_bytes_per_block: int
    check_memory: int
    needed_memory: int
    num_blocks_before_min: int | None


@attrs.frozen(kw_only=True)
class KVCachePlan:
    """The result of Core's flow: global groups, per-worker configs and figures.

    Attributes:
        global_groups: the builder's groups over all workers' layers.
        configs: one config per worker, all with ``num_blocks``.
        workers: Core's figures per worker.
        max_model_len: the length planned for (lowered by auto-fit).
        num_blocks: the block count every worker ends with.
    """

    global_groups: tuple[KVCacheGroupSpec, ...]
    configs: tuple[KVCacheConfig, ...]
    workers: tuple[WorkerPlan, ...]
    max_model_len: int
    num_blocks: int


def _merge_workers(
    kv_cache_specs: Sequence[Mapping[str, KVCacheSpec]],
) -> dict[str, KVCacheSpec]:
    if isinstance(kv_cache_specs, Mapping) or not isinstance(kv_cache_specs, (list, tuple)):
        raise ConfigError(
            "kv_cache_specs must be a list with one {layer name: spec} dict per worker, "
            f"got {type(kv_cache_specs).__name__}"
        )
    if not kv_cache_specs:
        raise ConfigError("kv_cache_specs=[] has no worker")
    merged: dict[str, KVCacheSpec] = {}
    owner: dict[str, int] = {}
    for worker, specs in enumerate(kv_cache_specs):
        if not isinstance(specs, Mapping):
            raise ConfigError(f"kv_cache_specs[{worker}]={specs!r} must be a dict of layer specs")
        for name, spec in specs.items():
            check_layer_spec(f"kv_cache_specs[{worker}]", name, spec)
            if name in merged and merged[name] != spec:
                raise WorkerSpecMismatchError(
                    f"layer {name!r} has different specs on worker {owner[name]} "
                    f"({merged[name]!r}) and worker {worker} ({spec!r})"
                )
            merged.setdefault(name, spec)
            owner.setdefault(name, worker)
    return merged


def get_global_kv_cache_groups(
    builder: BuilderLike,
    config: PlanningConfig,
    kv_cache_specs: Sequence[Mapping[str, KVCacheSpec]],
) -> list[KVCacheGroupSpec]:
    """Group all workers' layers with ``builder`` (contract.md#core-flow).

    The workers' dicts are not mutated: the builder gets a merged copy with
    sliding windows tagged with ``config.extra_retained_tokens``.

    Raises:
        WorkerSpecMismatchError: one layer has different specs on two workers.
        SpecError: a spec class is not registered for planning, or a spec sets a
            field the release planned as does not have (``config.vllm_version``).
        PartitionError: the builder's groups do not partition the layers.
        LayoutResolutionError: the config leaves the layout to planning and no
            layout meets its requirements (:meth:`PlanningConfig.with_resolved_layout`).
    """
    config = config.with_resolved_layout(kv_cache_specs)
    merged = _merge_workers(kv_cache_specs)
    check_spec_registry(merged)
    check_spec_fields(merged, config.rules)
    extra = config.extra_retained_tokens
    tagged: dict[str, KVCacheSpec] = {
        name: (
            attrs.evolve(spec, extra_retained_tokens=extra)
            if isinstance(spec, SlidingWindowSpec) and spec.extra_retained_tokens != extra
            else spec
        )
        for name, spec in merged.items()
    }
    groups = list(fresh_builder(builder, config).get_kv_cache_groups(config, dict(tagged)))
    check_exact_partition(groups, list(tagged))
    check_wrapped_layers(groups)
    if config.eagle_block_drop:
        groups = [
            attrs.evolve(g, is_eagle_group=any(merged[n].is_draft for n in g.layer_names))
            for g in groups
        ]
    return groups


def project_kv_cache_groups_to_worker(
    global_groups: Sequence[KVCacheGroupSpec], worker_specs: Mapping[str, KVCacheSpec]
) -> list[KVCacheGroupSpec]:
    """Each global group restricted to the worker's layers, in order (contract.md#core-flow).

    A group whose layers are all on the worker is kept as is.  A uniform-type
    group is re-wrapped over the worker's subset; one with no layer on the
    worker keeps the global wrapper (block IDs are global, so it still counts
    for admission) but names no layer, so placement emits nothing for it.
    """
    projected: list[KVCacheGroupSpec] = []
    for group in global_groups:
        names = [n for n in group.layer_names if n in worker_specs]
        if len(names) == len(group.layer_names):
            projected.append(group)
            continue
        spec = group.kv_cache_spec
        if isinstance(spec, UniformTypeKVCacheSpecs) and names:
            # vLLM's projection keeps the wrapper's own block size.
            spec = UniformTypeKVCacheSpecs(
                kv_cache_specs={n: spec.kv_cache_specs[n] for n in names},
                declared_block_size=spec.declared_block_size,
            )
        projected.append(attrs.evolve(group, layer_names=names, kv_cache_spec=spec))
    return projected


def pool_bytes_per_block_from_builder(
    builder: KVCacheConfigBuilder, config: PlanningConfig, groups: Sequence[KVCacheGroupSpec]
) -> int:
    """Device bytes per block as Core learns them (contract.md#core-flow, the probe).

    ``[]`` gives 0; a builder that overrides ``_get_pool_bytes_per_block``
    answers directly; otherwise one block is placed with the override unset
    and the single device backing size is the answer (0 without device tensors).

    Under HiSparse Core skips the builder and uses the pure
    :func:`~kvref.placement.pool_bytes_per_block`: a placement probe would
    check the host pool against a ``max_model_len`` auto-fit may still shorten
    (contract.md#hisparse).

    Raises:
        PlanningError: the one-block placement has several device backing sizes.
    """
    if not groups:
        return 0
    if config.hisparse is not None:
        return pool_bytes_per_block(config, groups)
    declared = builder._get_pool_bytes_per_block(config, groups)
    if declared is not None:
        return declared
    probe_config = attrs.evolve(config, num_gpu_blocks_override=None)
    probe = builder.get_kv_cache_config_from_groups(probe_config, groups, 1)
    sizes = sorted({t.size for t in probe.kv_cache_tensors if not t.host_resident})
    if len(sizes) > 1:
        raise PlanningError(
            f"device tensors must share one device backing allocation, but got sizes {sizes}; "
            "a builder with several allocations must override _get_pool_bytes_per_block"
        )
    return sizes[0] if sizes else 0


def _group_blocks_per_request(group: KVCacheGroupSpec, config: PlanningConfig) -> int:
    spec = group.kv_cache_spec
    if isinstance(spec, UniformTypeKVCacheSpecs):
        return spec.max_memory_usage_pages(config)
    return cdiv(spec.max_memory_usage_bytes(config), spec.page_size_bytes)


def max_memory_usage_bytes_from_groups(
    config: PlanningConfig, groups: Sequence[KVCacheGroupSpec], pool_bytes_per_block: int
) -> int:
    """Bytes one request at ``config.max_model_len`` needs: ``bpb * Σ blocks(g)``.

    See contract.md#core-admission.

    Every non-host group counts, even one with no layer on this worker,
    because block IDs are shared by all groups.
    """
    blocks = sum(_group_blocks_per_request(g, config) for g in groups if not g.host_resident)
    return pool_bytes_per_block * blocks


def _hisparse_places(
    builder: KVCacheConfigBuilder,
    config: PlanningConfig,
    groups: Sequence[KVCacheGroupSpec],
    bpb: int,
    check: int,
) -> bool:
    """Whether the builder can place ``check // bpb`` blocks (HiSparse's host pool must fit)."""
    num_blocks = check // bpb if bpb else 0
    if num_blocks < 1:
        # Not even one block: the memory test fails too, whatever placement says.
        return False
    try:
        builder.get_kv_cache_config_from_groups(config, groups, num_blocks)
    except KVRefError:
        return False
    return True


def _estimate_max_model_len(
    builder: KVCacheConfigBuilder,
    config: PlanningConfig,
    groups: Sequence[KVCacheGroupSpec],
    bpb: int,
    check: int,
) -> int:
    """Largest length in ``[1, config.max_model_len]`` whose need fits ``check`` (0 if none).

    Under HiSparse a length also needs a placement that succeeds: its host
    pool must hold one request at that length.
    """

    def fits(length: int) -> bool:
        at_length = config.with_max_model_len(length)
        if config.hisparse is not None and not _hisparse_places(
            builder, at_length, groups, bpb, check
        ):
            return False
        need = max_memory_usage_bytes_from_groups(at_length, groups, bpb)
        return need <= check

    low, high, best = 1, config.max_model_len, 0
    while low <= high:
        mid = (low + high) // 2
        if fits(mid):
            best, low = mid, mid + 1
        else:
            high = mid - 1
    return best


def _kv_tp_replicas(config: PlanningConfig, specs: Sequence[KVCacheSpec]) -> int:
    replicas = 0
    for spec in specs:
        value = 1
        if (
            isinstance(spec, AttentionSpec)
            and spec.max_tp_shards is not None
            and not (spec.dcp_sharded and config.decode_context_parallel_size > 1)
        ):
            value = max(1, config.tensor_parallel_size // spec.max_tp_shards)
        replicas = math.gcd(replicas, value)
    return replicas or 1


def _available_per_worker(available_memory: int | Sequence[int], workers: int) -> list[int]:
    if isinstance(available_memory, int) and not isinstance(available_memory, bool):
        values = [available_memory] * workers
    elif isinstance(available_memory, (list, tuple)):
        values = list(available_memory)
        if len(values) != workers:
            raise ConfigError(f"available_memory has {len(values)} entries for {workers} workers")
    else:
        raise ConfigError(f"available_memory={available_memory!r} must be an int or a list of ints")
    for index, value in enumerate(values):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(f"available_memory[{index}]={value!r} must be an int >= 0")
    return values


def _insufficient(
    config: PlanningConfig, needed: int, check: int, estimated: int
) -> InsufficientMemoryError:
    message = (
        f"one request at max_model_len={config.max_model_len} needs "
        f"{round(needed / _GIB, 2)} GiB of KV cache, more than the "
        f"{round(check / _GIB, 2)} GiB available"
    )
    if estimated > 0:
        message += f"; the estimated maximum model length is {estimated}"
    message += ". Increase gpu_memory_utilization or decrease max_model_len."
    return InsufficientMemoryError(
        message,
        max_model_len=config.max_model_len,
        needed_bytes=needed,
        available_bytes=check,
        estimated_max_model_len=estimated,
    )


def plan_kv_cache(
    builder: BuilderLike,
    config: PlanningConfig,
    kv_cache_specs: Sequence[Mapping[str, KVCacheSpec]],
    available_memory: int | Sequence[int],
    global_groups: Sequence[KVCacheGroupSpec] | None = None,
) -> KVCachePlan:
    """Run Core's whole flow and return the configs with the figures behind them.

    The steps carry the numbers vLLM gives them in ``get_kv_cache_configs``
    (the finer list of contract.md#core-flow splits them further).  Before
    step 1 the config's layout is resolved once, from all workers' specs.

    1. Merge the workers' specs into one spec per layer and check each
       spec's fields (inside :func:`get_global_kv_cache_groups`, or here when
       ``global_groups`` is given).
    2. Group the whole model's layers with a fresh builder
       (:func:`get_global_kv_cache_groups`), unless ``global_groups`` is given.
    3. Project the groups onto each worker and check that they hold all its
       layers; learn each worker's bytes per block, apply
       ``num_gpu_blocks_override`` and reserve the null block; auto-fit
       ``max_model_len`` when asked, then check that one request fits on
       every worker (:func:`_admit`).
    4. Place each worker's own block count (memory // bytes per block; a
       worker with no layer takes the others' smallest) with the builder.
    5. Place again, at the smallest block count of all workers, each worker
       that got more; under 0.34.0 every worker also gets one answer to
       whether its blocks need zeroing.

    Args:
        builder: a builder instance, a class to instantiate for every phase, or
            ``None`` for the builder the config selects (fresh for every phase).
        config: the planning config; auto-fit works on copies of it.
        kv_cache_specs: one ``{layer name: spec}`` dict per worker (not mutated).
        available_memory: bytes for the KV cache, one int for all workers or one per worker.
        global_groups: groups from :func:`get_global_kv_cache_groups` (computed if ``None``).

    Raises:
        InsufficientMemoryError: one request at ``max_model_len`` does not fit, or
            auto-fit finds no length that fits.
        ConfigError, SpecError, PartitionError, PlanningError: bad input or a builder
            that breaks the contract.
        LayoutResolutionError: the config leaves the layout to planning and no
            layout meets its requirements.
    """
    # Core resolves the layout once, before grouping (step 2).
    config = config.with_resolved_layout(kv_cache_specs)
    memory = _available_per_worker(available_memory, len(kv_cache_specs))
    # Steps 1 and 2.
    if global_groups is None:
        global_groups = get_global_kv_cache_groups(builder, config, kv_cache_specs)
    else:
        check_spec_fields(_merge_workers(kv_cache_specs), config.rules)
    groups_global = list(global_groups)
    # Step 3.
    worker_builder = fresh_builder(builder, config)
    projected = [project_kv_cache_groups_to_worker(groups_global, w) for w in kv_cache_specs]
    for index, (groups, specs) in enumerate(zip(projected, kv_cache_specs, strict=True)):
        placed = sum(len(g.layer_names) for g in groups)
        if placed != len(specs):
            raise PartitionError(
                f"worker {index} has {len(specs)} layers but its projected groups hold {placed}: "
                "some layers are not assigned to any group"
            )
    bpbs = [pool_bytes_per_block_from_builder(worker_builder, config, g) for g in projected]
    # A worker counts as "with groups" only if it holds a layer: a zero-layer
    # worker needs nothing and takes the others' block count (vLLM divides by 0).
    active = [bool(g) and bpb > 0 for g, bpb in zip(projected, bpbs, strict=True)]

    effective = list(memory)
    override = config.num_gpu_blocks_override
    if override is not None:
        effective = [
            override * bpb if on else mem for mem, bpb, on in zip(memory, bpbs, active, strict=True)
        ]
    check = [mem - bpb if on else mem for mem, bpb, on in zip(effective, bpbs, active, strict=True)]

    if config.auto_fit_max_model_len and any(active):
        config = _auto_fit(worker_builder, config, projected, bpbs, check, active)
    needed = _admit(worker_builder, config, projected, bpbs, memory, check, active)
    before_min: list[int | None] = [
        1 if not groups else (effective[w] // bpbs[w] if active[w] else None)
        for w, groups in enumerate(projected)
    ]
    # Steps 4 and 5 (_place_workers), then the one zeroing answer of step 5.
    configs = _place_workers(worker_builder, config, projected, before_min)
    target = min(c.num_blocks for c in configs)
    # vLLM 0.34.0: every worker gets the scheduler's blocks to zero, so one answer for all.
    zeroing = (
        any(c.needs_kv_cache_zeroing for c in configs)
        if config.rules.zeroing_across_workers
        else None
    )
    finished = []
    for c in configs:
        layer_specs = [s for g in c.kv_cache_groups for _, s in g.layer_specs()]
        finished.append(
            attrs.evolve(
                c,
                kv_cache_layout=config.kv_cache_layout,
                kv_tp_replicas=_kv_tp_replicas(config, layer_specs),
                resolved_kv_cache_zeroing=zeroing,
            )
        )
    workers = tuple(
        WorkerPlan(
            available_memory=memory[w],
            effective_available_memory=effective[w],
            pool_bytes_per_block=bpbs[w],
            check_memory=check[w],
            needed_memory=needed[w],
            num_blocks_before_min=before_min[w],
        )
        for w in range(len(projected))
    )
    return KVCachePlan(
        global_groups=tuple(groups_global),
        configs=tuple(finished),
        workers=workers,
        max_model_len=config.max_model_len,
        num_blocks=target,
    )


def _auto_fit(
    builder: KVCacheConfigBuilder,
    config: PlanningConfig,
    projected: Sequence[Sequence[KVCacheGroupSpec]],
    bpbs: Sequence[int],
    check: Sequence[int],
    active: Sequence[bool],
) -> PlanningConfig:
    """The config with the longest ``max_model_len`` every active worker fits (auto-fit)."""
    fitted = min(
        _estimate_max_model_len(builder, config, projected[w], bpbs[w], check[w])
        for w in range(len(projected))
        if active[w]
    )
    if fitted <= 0:
        worst = min((w for w in range(len(projected)) if active[w]), key=lambda w: check[w])
        one_token = config.with_max_model_len(1)
        raise InsufficientMemoryError(
            f"cannot auto-fit max_model_len: not even one token fits in "
            f"{round(check[worst] / _GIB, 2)} GiB on worker {worst}",
            max_model_len=1,
            needed_bytes=max_memory_usage_bytes_from_groups(
                one_token, projected[worst], bpbs[worst]
            ),
            available_bytes=max(check[worst], 0),
            estimated_max_model_len=0,
        )
    return config.with_max_model_len(fitted) if fitted < config.max_model_len else config


def _admit(
    builder: KVCacheConfigBuilder,
    config: PlanningConfig,
    projected: Sequence[Sequence[KVCacheGroupSpec]],
    bpbs: Sequence[int],
    memory: Sequence[int],
    check: Sequence[int],
    active: Sequence[bool],
) -> list[int]:
    """Each worker's need for one request; raises when a worker cannot hold it."""
    needed = [
        max_memory_usage_bytes_from_groups(config, g, bpb) if on else 0
        for g, bpb, on in zip(projected, bpbs, active, strict=True)
    ]
    for w in range(len(projected)):
        if not active[w]:
            continue
        if check[w] <= 0:
            raise InsufficientMemoryError(
                f"no available memory for the cache blocks on worker {w} "
                f"(available_memory={memory[w]}, one block takes {bpbs[w]} bytes); "
                "increase gpu_memory_utilization",
                max_model_len=config.max_model_len,
                needed_bytes=needed[w],
                available_bytes=max(check[w], 0),
                estimated_max_model_len=0,
            )
        if needed[w] > check[w]:
            estimated = _estimate_max_model_len(builder, config, projected[w], bpbs[w], check[w])
            raise _insufficient(config, needed[w], check[w], estimated)
    return needed


def _place_workers(
    builder: KVCacheConfigBuilder,
    config: PlanningConfig,
    projected: Sequence[Sequence[KVCacheGroupSpec]],
    before_min: Sequence[int | None],
) -> list[KVCacheConfig]:
    """Every worker's config, placed again at the smallest block count where they differ.

    A worker without an active group (``None``) takes the others' smallest count.
    """
    known = [b for b in before_min if b is not None]
    if not known:
        raise PlanningError("no worker holds a KV cache layer, but the global groups are not empty")
    configs = [
        builder.get_kv_cache_config_from_groups(
            config, groups, own if own is not None else min(known)
        )
        for own, groups in zip(before_min, projected, strict=True)
    ]
    target = min(c.num_blocks for c in configs)
    return [
        c
        if c.num_blocks == target
        else builder.get_kv_cache_config_from_groups(config, c.kv_cache_groups, target)
        for c in configs
    ]


def get_kv_cache_configs(
    builder: BuilderLike,
    config: PlanningConfig,
    kv_cache_specs: Sequence[Mapping[str, KVCacheSpec]],
    available_memory: int | Sequence[int],
) -> list[KVCacheConfig]:
    """One :class:`KVCacheConfig` per worker, all with the same ``num_blocks``.

    See contract.md#core-flow.

    See :func:`plan_kv_cache` for the arguments, the errors and the figures
    behind the configs (including the auto-fitted ``max_model_len``).
    """
    return list(plan_kv_cache(builder, config, kv_cache_specs, available_memory).configs)
