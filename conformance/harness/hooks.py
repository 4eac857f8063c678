"""The builder's hooks, called as the scenarios call them.

Every call goes through the run's :class:`~conformance.harness.guard.Guard`,
on fresh copies of its inputs (every layer its own spec object), and comes
back as a :class:`~conformance.check.observations.CallResult` with the
changes it made to what it was handed.  The scenarios
(:mod:`conformance.scenarios`) compose these calls into observations.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from conformance.check.observations import (
    CallResult,
    ConstructFailure,
)
from conformance.harness.guard import Guard, deep_copies, deep_copy, fresh_lists
from kvref.builder import KVCacheConfigBuilder, ReferenceKVCacheConfigBuilder
from kvref.config import PlanningConfig
from kvref.records import KVCacheConfig, KVCacheGroupSpec, KVCacheTensor
from kvref.specs import KVCacheSpec, UniformTypeKVCacheSpecs

__all__ = [
    "BuilderFactory",
    "ConstructionFailedError",
    "Context",
    "builder_or_reference_groups",
    "call_grouping",
    "call_placement",
    "call_pool_bytes",
    "fresh_specs",
    "groups_validator",
    "make_factory",
    "observe",
    "valid_groups",
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
    pairs = {name: deep_copies(spec, 2) for name, spec in specs.items()}
    given = {name: pair[0] for name, pair in pairs.items()}
    objects = dict(given)
    pristine = {name: pair[1] for name, pair in pairs.items()}
    result, mutations = _call_on_config(
        guard, builder, "get_kv_cache_groups", config, given, validate=groups_validator
    )
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
    result, mutations = _call_on_groups(
        guard,
        builder,
        "get_kv_cache_config_from_groups",
        config,
        groups,
        num_blocks,
        validate=config_validator,
    )
    return result, tuple(mutations)


def _call_on_config(
    guard: Guard,
    builder: KVCacheConfigBuilder,
    hook: str,
    config: PlanningConfig,
    *args: Any,
    validate: Callable[[Any], str | None],
) -> tuple[CallResult, list[str]]:
    """Call the builder's ``hook`` on a copy of ``config``, then ``args``.

    Returns the call and how it changed the config it was handed.
    """
    handed_config = deep_copy(config)
    result = guard.call(hook, getattr(builder, hook), handed_config, *args, validate=validate)
    return result, _config_changes(handed_config, config, result)


def _call_on_groups(
    guard: Guard,
    builder: KVCacheConfigBuilder,
    hook: str,
    config: PlanningConfig,
    groups: Sequence[KVCacheGroupSpec],
    *args: Any,
    validate: Callable[[Any], str | None],
) -> tuple[CallResult, list[str]]:
    """:func:`_call_on_config` with fresh copies of ``groups``, then ``args``.

    Returns the call and how it changed its config and its group list.
    """
    given, pristine = fresh_lists(groups, 2)
    objects = list(given)
    result, changes = _call_on_config(guard, builder, hook, config, given, *args, validate=validate)
    return result, changes + _group_changes(given, objects, pristine)


def _group_changes(
    given: Sequence[KVCacheGroupSpec],
    objects: Sequence[KVCacheGroupSpec],
    pristine: Sequence[KVCacheGroupSpec],
) -> list[str]:
    """How a hook changed the group list it was handed (``objects``: its groups as handed)."""
    changes: list[str] = []
    if len(given) != len(pristine):
        changes.append(f"the group list ({len(pristine)} groups handed, {len(given)} after)")
    elif any(a is not b for a, b in zip(given, objects, strict=False)):
        changes.append("the group list (groups replaced or reordered)")
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
    result, changes = _call_on_groups(
        guard, builder, "_get_pool_bytes_per_block", config, groups, validate=pool_validator
    )
    return result, tuple(f"_get_pool_bytes_per_block changed {c}" for c in changes)


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


def observe(ctx: Context, observer: Callable[[Context, Any], Any], example: Any) -> Any:
    """``observer(ctx, example)``; a builder that cannot be constructed is observed too."""
    try:
        return observer(ctx, example)
    except ConstructionFailedError as exc:
        return ConstructFailure(result=exc.result)
