"""Turn a generated example into observations of a builder, one scenario at a time.

Each observer makes the builder calls one scenario needs, through the run's
:class:`~conformance.harness.guard.Guard`, each call on fresh copies of its
inputs (every layer its own spec object), and returns an observation for the
catalog to judge.  :data:`OBSERVERS` maps scenario names to observers.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from conformance.check.observations import (
    CallResult,
    ConstructFailure,
    CoreObservation,
    GroupingObservation,
    HostObservation,
    PlacementObservation,
)
from conformance.harness.guard import Guard, deep_copy
from kvref.builder import KVCacheConfigBuilder, ReferenceKVCacheConfigBuilder
from kvref.config import PlanningConfig
from kvref.planning import project_kv_cache_groups_to_worker
from kvref.records import KVCacheConfig, KVCacheGroupSpec, KVCacheTensor
from kvref.specs import KVCacheSpec, UniformTypeKVCacheSpecs

__all__ = [
    "OBSERVERS",
    "BuilderFactory",
    "ConstructionFailedError",
    "Context",
    "groups_validator",
    "make_factory",
    "observe",
    "observe_core",
    "observe_grouping",
    "observe_host",
    "observe_placement",
]

#: Makes a fresh builder, as vLLM does for every phase.
BuilderFactory = Callable[[], KVCacheConfigBuilder]

_REFERENCE = ReferenceKVCacheConfigBuilder()


class ConstructionFailedError(Exception):
    """Constructing the builder raised, hung or returned something else."""

    def __init__(self, result: CallResult) -> None:
        super().__init__(result.describe())
        self.result = result


def make_factory(
    builder: KVCacheConfigBuilder | type[KVCacheConfigBuilder], guard: Guard
) -> BuilderFactory:
    """A factory of fresh builders; every construction goes through ``guard``.

    A class is instantiated with no arguments, as vLLM does for every phase.
    For an instance, its class is instantiated likewise; when that fails the
    instance itself is reused (it is all the caller gave).

    The factory raises :class:`ConstructionFailedError` when construction fails.
    """
    cls = builder if isinstance(builder, type) else type(builder)

    def validate(value: Any) -> str | None:
        if not isinstance(value, KVCacheConfigBuilder):
            return f"{type(value).__name__}, not a KVCacheConfigBuilder"
        return None

    def fresh() -> KVCacheConfigBuilder:
        result = guard.call("__init__", cls, validate=validate)
        if result.not_called:
            # The builder hung earlier; the guard makes no call to it any more,
            # so this stand-in is never used, and the observation keeps the hang.
            return _HungBuilder()
        if result.ok:
            made: KVCacheConfigBuilder = result.value
            return made
        if not isinstance(builder, type):
            return builder
        raise ConstructionFailedError(result)

    # Resolution of a vLLM-native builder follows vLLM's rule (profiling.py).
    fresh.kvref_native = getattr(cls, "native_cls", None)  # type: ignore[attr-defined]
    return fresh


class _HungBuilder(KVCacheConfigBuilder):
    """Stands in for a builder that hung; the guard never calls it."""

    def get_kv_cache_groups(  # pragma: no cover - the guard never calls it
        self, config: PlanningConfig, kv_cache_spec: Mapping[str, KVCacheSpec]
    ) -> list[KVCacheGroupSpec]:
        raise RuntimeError("the builder hung earlier")

    def get_kv_cache_config_from_groups(  # pragma: no cover - the guard never calls it
        self, config: PlanningConfig, kv_cache_groups: Sequence[KVCacheGroupSpec], num_blocks: int
    ) -> KVCacheConfig:
        raise RuntimeError("the builder hung earlier")


@attrs.frozen(kw_only=True)
class Context:
    """What every observer needs: how to make builders and call them, and the run's device.

    Attributes:
        factory: makes fresh builders.
        guard: runs every call with a deadline.
        device: torch device of the device checks.
        max_alloc_bytes: cap of one allocation of the device checks.
        core: Core's flow (``None``: kvref's :func:`~kvref.planning.plan_kv_cache`;
            the vLLM adapter brings vLLM's).
        qualname: the builder's qualname when kvref's resolution gives the class
            under check (the profiling scenario then resolves builders by it).
        qualname_note: why there is no such qualname, when there is none.
        resolver: the isolated proxy class whose worker process resolves
            ``qualname`` (``None``: resolution runs in this process).
        twin: whether the processes scenario asks a twin process (only an
            invariant that reads the twin's answers needs one; the scenario's
            own calls are judged either way).
    """

    factory: BuilderFactory
    guard: Guard
    device: str = "cpu"
    max_alloc_bytes: int | None = None
    core: Callable[..., Any] | None = None
    qualname: str | None = None
    qualname_note: str = "the builder was given without a qualname"
    resolver: type[Any] | None = None
    twin: bool = True


# -- fresh inputs and mutation reports -------------------------------------------


def fresh_specs(specs: Mapping[str, KVCacheSpec]) -> dict[str, KVCacheSpec]:
    """A new dict whose every layer has its own deep-copied spec object."""
    return {name: deep_copy(spec) for name, spec in specs.items()}


def _spec_changes(where: str, given: Any, pristine: Any) -> list[str]:
    """Field-by-field differences between a spec object handed out and its pristine copy."""
    if given == pristine:
        return []
    if attrs.has(type(pristine)):
        changed = [
            f"{where}.{f.name}: {getattr(pristine, f.name)!r} -> {getattr(given, f.name, None)!r}"
            for f in attrs.fields(type(pristine))
            if getattr(given, f.name, None) != getattr(pristine, f.name)
        ]
        if changed:
            return changed
    return [f"{where} changed"]


def _config_changes(
    handed: PlanningConfig, config: PlanningConfig, result: CallResult
) -> list[str]:
    """How a call changed the config it was handed: the kvref record, or the vLLM adapter's own.

    The contract lets a hook read its config, never write it: Core keeps one
    config across the calls of a flow, so a write changes every later call.
    """
    changes = _spec_changes("config", handed, config)
    return changes + list(result.input_changes)


def groups_validator(value: Any) -> str | None:
    """What is wrong with a grouping result's type (``None``: a list of groups)."""
    if not isinstance(value, list) or not all(isinstance(g, KVCacheGroupSpec) for g in value):
        return f"{type(value).__name__} ({value!r:.80}), not a list of KVCacheGroupSpec"
    return _group_parts(value, "group")


def _group_parts(groups: Sequence[Any], what: str) -> str | None:
    # An isolated builder's answer arrives as data: a part that was no record
    # of the kit's (an object of the builder's own) is a wrong type, named.
    for i, group in enumerate(groups):
        if not isinstance(group.kv_cache_spec, KVCacheSpec | UniformTypeKVCacheSpecs):
            return f"{what} {i}'s kv_cache_spec is {group.kv_cache_spec!r:.80}, not a KVCacheSpec"
        if not isinstance(group.layer_names, (list, tuple)) or not all(
            isinstance(n, str) for n in group.layer_names
        ):
            return f"{what} {i}'s layer_names is {group.layer_names!r:.80}, not a list of str"
    return None


def config_validator(value: Any) -> str | None:
    """What is wrong with a placement result's type (``None``: a KVCacheConfig)."""
    if not isinstance(value, KVCacheConfig):
        return f"{type(value).__name__} ({value!r:.80}), not a KVCacheConfig"
    tensors, groups = value.kv_cache_tensors, value.kv_cache_groups
    if not isinstance(tensors, (list, tuple)) or not all(
        isinstance(t, KVCacheTensor) for t in tensors
    ):
        return f"kv_cache_tensors is {tensors!r:.80}, not a list of KVCacheTensor"
    if not isinstance(groups, (list, tuple)) or not all(
        isinstance(g, KVCacheGroupSpec) for g in groups
    ):
        return f"kv_cache_groups is {groups!r:.80}, not a list of KVCacheGroupSpec"
    return _group_parts(groups, "kv_cache_groups")


def pool_validator(value: Any) -> str | None:
    """What is wrong with a ``_get_pool_bytes_per_block`` answer (``None`` is legal)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return f"{value!r}, not None or a non-negative int of bytes per block"
    return None


def call_grouping(
    guard: Guard,
    builder: KVCacheConfigBuilder,
    config: PlanningConfig,
    specs: Mapping[str, KVCacheSpec],
) -> tuple[CallResult, tuple[str, ...]]:
    """Group fresh copies of ``specs``; returns the call and how the builder mutated its input.

    vLLM's contract lets grouping rewrite the dict's entries in place
    (promotion, unification: Core hands it a merged copy), but not drop or
    add layers, and never change the spec objects it was given.
    """
    given = fresh_specs(specs)
    objects = dict(given)
    pristine = {name: deep_copy(spec) for name, spec in given.items()}
    handed_config = deep_copy(config)
    result = guard.call(
        "get_kv_cache_groups",
        builder.get_kv_cache_groups,
        handed_config,
        given,
        validate=groups_validator,
    )
    mutations = _config_changes(handed_config, config, result)
    if list(given) != list(pristine):
        mutations.append("the dict's layers were added, removed or reordered")
    for name, spec in objects.items():
        mutations += _spec_changes(f"spec of {name!r}", spec, pristine[name])
    return result, tuple(mutations)


def call_placement(
    guard: Guard,
    builder: KVCacheConfigBuilder,
    config: PlanningConfig,
    groups: Sequence[KVCacheGroupSpec],
    num_blocks: int,
) -> tuple[CallResult, tuple[str, ...]]:
    """Place fresh copies of ``groups``; returns the call and how it mutated its input."""
    given = [deep_copy(g) for g in groups]
    objects = list(given)
    pristine = deep_copy(objects)
    handed_config = deep_copy(config)
    result = guard.call(
        "get_kv_cache_config_from_groups",
        builder.get_kv_cache_config_from_groups,
        handed_config,
        given,
        num_blocks,
        validate=config_validator,
    )
    mutations = _config_changes(handed_config, config, result)
    mutations += _group_changes(given, objects, pristine)
    return result, tuple(mutations)


def _group_changes(
    given: Sequence[KVCacheGroupSpec],
    objects: Sequence[KVCacheGroupSpec],
    pristine: Sequence[KVCacheGroupSpec],
) -> list[str]:
    """How a hook changed the group list it was handed (``objects``: its groups as handed)."""
    changes: list[str] = []
    if len(given) != len(pristine) or any(a is not b for a, b in zip(given, objects, strict=False)):
        changes.append("the group list was changed")
    for i, (group, clean) in enumerate(zip(objects, pristine, strict=True)):
        if group != clean:
            changes += _spec_changes(f"group {i}", group, clean)
            if group.kv_cache_spec != clean.kv_cache_spec:
                changes += _spec_changes(
                    f"group {i}'s spec", group.kv_cache_spec, clean.kv_cache_spec
                )
    return changes


def call_pool_bytes(
    guard: Guard,
    builder: KVCacheConfigBuilder,
    config: PlanningConfig,
    groups: Sequence[KVCacheGroupSpec],
) -> tuple[CallResult, tuple[str, ...]]:
    """Ask ``_get_pool_bytes_per_block`` about fresh copies of ``groups`` (never an empty list).

    Returns the call and how it changed its input: the hook is part of
    placement (Core asks it before it places), and it too may change nothing
    it is given (contract.md#hook-purity).
    """
    given = [deep_copy(g) for g in groups]
    objects = list(given)
    pristine = deep_copy(objects)
    handed_config = deep_copy(config)
    result = guard.call(
        "_get_pool_bytes_per_block",
        builder._get_pool_bytes_per_block,
        handed_config,
        given,
        validate=pool_validator,
    )
    changes = _config_changes(handed_config, config, result)
    changes += _group_changes(given, objects, pristine)
    return result, tuple(f"_get_pool_bytes_per_block changed {c}" for c in changes)


# -- observers ------------------------------------------------------------------


def observe_grouping(
    ctx: Context, config: PlanningConfig, specs: Mapping[str, KVCacheSpec]
) -> GroupingObservation:
    """Call ``get_kv_cache_groups`` twice on one instance and once on a fresh one."""
    builder = ctx.factory()
    first, mutated = call_grouping(ctx.guard, builder, config, specs)
    second, mutated_again = call_grouping(ctx.guard, builder, config, specs)
    fresh, _ = call_grouping(ctx.guard, ctx.factory(), config, specs)
    return GroupingObservation(
        config=config,
        specs=dict(specs),
        first=first,
        second=second,
        fresh=fresh,
        mutations=mutated + mutated_again,
    )


def _partitions(groups: Sequence[KVCacheGroupSpec], specs: Mapping[str, KVCacheSpec]) -> bool:
    names = [n for g in groups for n in g.layer_names]
    return (
        len(names) == len(set(names))
        and set(names) == set(specs)
        and all(g.layer_names for g in groups)
    )


def valid_groups(
    config: PlanningConfig, specs: Mapping[str, KVCacheSpec], result: CallResult
) -> bool:
    """Whether the builder's groups keep every grouping invariant (so placement can use them)."""
    from conformance.check.gate import grouping_findings

    if not result.ok or not _partitions(result.value, specs):
        return False
    return not grouping_findings(config, specs, result)


def builder_or_reference_groups(
    ctx: Context, config: PlanningConfig, specs: Mapping[str, KVCacheSpec]
) -> tuple[tuple[KVCacheGroupSpec, ...], str]:
    """The builder's groups when they keep the grouping invariants, else the reference's.

    Placement is checked on valid groups so that a grouping bug is reported
    once, by the grouping invariants, and placement is still exercised.
    """
    result, _ = call_grouping(ctx.guard, ctx.factory(), config, specs)
    if valid_groups(config, specs, result):
        return tuple(result.value), "builder"
    return tuple(_REFERENCE.get_kv_cache_groups(config, dict(specs))), "reference"


def _stage_to_place(
    groups: Sequence[KVCacheGroupSpec],
    workers: Sequence[Mapping[str, KVCacheSpec]],
    num_blocks: int,
) -> int:
    """The pipeline stage whose placement is judged.

    vLLM never places a pipeline-parallel model whole: each stage places the
    groups projected onto its layers.  Two stages matter most: the one that
    holds no layer of the most groups (the edge a builder gets wrong) and
    the one holding the most layers (where a vendor's gates, which test a
    stage's whole structure, open).  Each takes half the problems, by a
    stable digest of the problem's layers and block count, so a replayed
    example places the same stage (the last one on ties: it holds the drafts).
    """

    def empty(stage: int) -> int:
        held = workers[stage]
        return sum(1 for g in groups if not any(n in held for n in g.layer_names))

    stages = range(len(workers))
    edge = max(stages, key=lambda stage: (empty(stage), stage))
    fullest = max(stages, key=lambda stage: (len(workers[stage]), stage))
    key = json.dumps([sorted(w) for w in workers] + [num_blocks]).encode()
    return edge if hashlib.sha256(key).digest()[0] % 2 == 0 else fullest


def observe_placement(
    ctx: Context,
    config: PlanningConfig,
    specs: Mapping[str, KVCacheSpec],
    num_blocks: int,
    workers: Sequence[Mapping[str, KVCacheSpec]] = (),
) -> PlacementObservation:
    """Place the groups at 1, ``num_blocks`` and a larger count; repeat; fresh; empty.

    With several pipeline stages (``workers``), the groups are those of the
    whole model projected onto one stage (:func:`_stage_to_place`), as Core
    hands them to that stage's worker, and ``specs`` become that stage's layers.
    """
    config = attrs.evolve(config, num_gpu_blocks_override=None)
    groups, source = builder_or_reference_groups(ctx, config, specs)
    stage, model = None, None
    if len(workers) > 1:
        stage, model = _stage_to_place(groups, workers, num_blocks), dict(specs)
        specs = workers[stage]
        groups = tuple(project_kv_cache_groups_to_worker(groups, specs))
    builder = ctx.factory()
    counts = sorted({1, num_blocks, num_blocks + 1 + num_blocks // 2})
    results: dict[int, CallResult] = {}
    mutations: tuple[str, ...] = ()
    for n in counts:
        results[n], changed = call_placement(ctx.guard, builder, config, groups, n)
        mutations += changed
    repeat, changed = call_placement(ctx.guard, builder, config, groups, num_blocks)
    fresh, _ = call_placement(ctx.guard, ctx.factory(), config, groups, num_blocks)
    # Core never asks about an empty group list (its probe answers 0 itself).
    pool, pool_changed = (
        call_pool_bytes(ctx.guard, builder, config, groups) if groups else (None, ())
    )
    empty, _ = call_placement(ctx.guard, builder, config, [], 1)
    return PlacementObservation(
        config=config,
        specs=dict(specs),
        groups=groups,
        groups_source=source,
        num_blocks=num_blocks,
        results=results,
        repeat=repeat,
        fresh=fresh,
        mutations=mutations + changed + pool_changed,
        pool_bytes=pool,
        empty=empty,
        device=ctx.device,
        max_alloc_bytes=ctx.max_alloc_bytes,
        stage=stage,
        model_specs=model,
    )


def observe_host(
    ctx: Context,
    config: PlanningConfig,
    specs: Mapping[str, KVCacheSpec],
    num_blocks: int,
) -> HostObservation:
    """Group and place a model whose config keeps some layers on the host."""
    builder = ctx.factory()
    groups_result, _ = call_grouping(ctx.guard, builder, config, specs)
    placed = device_only = pool = None
    verdicts: dict[str, Any] = {}
    if valid_groups(config, specs, groups_result):
        groups = list(groups_result.value)
        placed, _ = call_placement(ctx.guard, builder, config, groups, num_blocks)
        pool = call_pool_bytes(ctx.guard, builder, config, groups)[0] if groups else None
        if placed.ok and pool is not None and pool.ok:
            from conformance.check.gate import judge_pool_bytes

            # Core asks about every group, host ones included: its answer
            # must count the device bytes alone.
            verdicts = judge_pool_bytes(config, groups, placed, num_blocks, pool)
        device_groups = [g for g in groups if not g.host_resident]
        if config.hisparse is None:
            # HiSparse's placement needs its source group (it sizes the host
            # pool from it), so there is no device-only twin to compare with.
            device_only, _ = call_placement(ctx.guard, builder, config, device_groups, num_blocks)
    return HostObservation(
        config=config,
        specs=dict(specs),
        groups=groups_result,
        placed=placed,
        device_only=device_only,
        num_blocks=num_blocks,
        device=ctx.device,
        max_alloc_bytes=ctx.max_alloc_bytes,
        pool_bytes=pool,
        pool_verdicts=verdicts,
    )


def observe_core(
    ctx: Context,
    config: PlanningConfig,
    workers: Sequence[Mapping[str, KVCacheSpec]],
    available_memory: Sequence[int],
) -> CoreObservation:
    """Run Core's flow (kvref's unless the context brings one) as one guarded call.

    Every hook answer inside the flow is judged by the catalog's grouping and
    placement invariants before it may flow on (:mod:`conformance.check.gate`);
    a broken answer stops the flow and is reported by the invariant it broke.
    """
    from conformance.scenarios.core import run_core

    return run_core(ctx, config, workers, available_memory)


def _observe_profiling(
    ctx: Context,
    config: PlanningConfig,
    workers: Sequence[Mapping[str, KVCacheSpec]],
    num_blocks: int,
) -> Any:
    from conformance.scenarios.profiling import observe_profiling

    return observe_profiling(ctx, config, workers, num_blocks)


def observe(ctx: Context, scenario: str, example: Any) -> Any:
    """Observe ``example`` in ``scenario``; a builder that cannot be constructed is observed too."""
    try:
        return OBSERVERS[scenario](ctx, example)
    except ConstructionFailedError as exc:
        return ConstructFailure(result=exc.result)


OBSERVERS: dict[str, Callable[[Context, Any], Any]] = {
    "grouping": lambda ctx, ex: observe_grouping(ctx, ex.config, ex.merged),
    "placement": lambda ctx, ex: observe_placement(
        ctx, ex.config, ex.merged, ex.num_blocks, ex.workers
    ),
    "device": lambda ctx, ex: observe_placement(
        ctx, ex.config, ex.merged, ex.num_blocks, ex.workers
    ),
    "host": lambda ctx, ex: observe_host(ctx, ex.config, ex.merged, ex.num_blocks),
    "core": lambda ctx, ex: observe_core(ctx, ex.config, ex.workers, ex.available_memory),
    "profiling": lambda ctx, ex: _observe_profiling(ctx, ex.config, ex.workers, ex.num_blocks),
}


def _observe_processes(ctx: Context, example: Any) -> Any:
    """The example answered here and in a twin process (:mod:`conformance.harness.twin`)."""
    from conformance.harness.twin import observe_processes

    return observe_processes(ctx, example)


OBSERVERS["processes"] = _observe_processes


def _observe_serve(ctx: Context, example: Any) -> Any:
    """Serve a request stream over the builder's configs (:mod:`conformance.scenarios.serve`)."""
    # Imported here: the serve scenario itself builds on this module.
    from conformance.scenarios.serve import observe_serve

    return observe_serve(ctx, example)


OBSERVERS["serve"] = _observe_serve
