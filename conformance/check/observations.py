"""What the kit saw a builder do on one generated example.

An observation bundles the inputs the kit generated and the guarded results
of every builder call it made for them.  Invariants (:mod:`conformance.check.invariants_old`)
are pure functions of observations, so one set of calls serves every
invariant of a scenario, and a failing invariant can be re-checked on a
shrunk example without touching the others.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from conformance.check.violations import Violation
from kvref.builder import ReferenceKVCacheConfigBuilder
from kvref.config import PlanningConfig
from kvref.interop.vllm_import import VLLMOutputError
from kvref.layout import KVCacheLayout
from kvref.planning import KVCachePlan, project_kv_cache_groups_to_worker
from kvref.records import KVCacheConfig, KVCacheGroupSpec
from kvref.specs import KVCacheSpec

__all__ = [
    "ProcessObservation",
    "CallResult",
    "ConstructFailure",
    "CoreObservation",
    "GroupingObservation",
    "HostObservation",
    "PlacementObservation",
    "ProfilingObservation",
    "Resolution",
]


@attrs.frozen(kw_only=True)
class CallResult:
    """The outcome of one guarded call.

    Attributes:
        hook: the builder hook called, e.g. ``"get_kv_cache_groups"``.
        value: what it returned (``None`` when it failed).
        error: ``"TypeName: message"`` when it raised.
        error_type: the exception's class when it raised.
        traceback: the last frames of the traceback when it raised.
        timed_out: it ran past the deadline (or the builder hung before).
        wrong_type: what was returned instead of the expected type.
        seconds: wall time of the call.
        not_called: the call was not made because the builder hung before.
        input_changes: changes the call made to inputs only the vLLM adapter
            sees (the ``VllmConfig`` it built), one ``path: old -> new`` line each.
    """

    hook: str
    value: Any = None
    error: str | None = None
    error_type: type[BaseException] | None = None
    traceback: str | None = None
    timed_out: bool = False
    wrong_type: str | None = None
    seconds: float = 0.0
    not_called: bool = False
    input_changes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """Whether the call returned a value of the expected type in time."""
        return self.error is None and not self.timed_out and self.wrong_type is None

    def describe(self) -> str:
        """One line saying how the call failed (empty when it did not)."""
        if self.timed_out:
            return f"{self.hook} did not return within the deadline"
        if self.error is not None:
            if self.error_type is not None and issubclass(self.error_type, VLLMOutputError):
                # Raised by the kit's conversion of what the hook returned, not by the hook.
                return f"{self.hook} returned an answer vLLM's records cannot hold ({self.error})"
            return f"{self.hook} raised {self.error}"
        if self.wrong_type is not None:
            return f"{self.hook} returned {self.wrong_type}"
        return ""


@attrs.frozen(kw_only=True)
class GroupingObservation:
    """``get_kv_cache_groups`` called three times on one input.

    Attributes:
        config: the planning config passed.
        specs: the layer specs passed (the kit's pristine copy).
        first: the first call's result.
        second: the same instance, same input, again.
        fresh: a fresh instance, same input.
        mutations: how the calls changed what they were given (layers of the
            dict, or fields of the spec objects), one line each.
        whole_model: whether ``specs`` are every worker's layers (Core's
            planning call), not one pipeline worker's slice (its profiling call).
    """

    config: PlanningConfig
    specs: Mapping[str, KVCacheSpec]
    first: CallResult
    second: CallResult
    fresh: CallResult
    mutations: tuple[str, ...] = ()
    whole_model: bool = True

    @property
    def mutated(self) -> bool:
        """Whether a call changed what it was given."""
        return bool(self.mutations)


@attrs.frozen(kw_only=True)
class PlacementObservation:
    """``get_kv_cache_config_from_groups`` called for several block counts on one group list.

    Attributes:
        config: the config passed (``num_gpu_blocks_override`` unset).
        specs: the layer specs the groups were made from.
        groups: the groups passed (the builder's own when they partition the
            layers, else the reference's: see ``groups_source``).
        groups_source: ``"builder"`` or ``"reference"``.
        num_blocks: the block count under test.
        results: block count to the call's result (1, ``num_blocks`` and a larger one).
        repeat: ``num_blocks`` again on the same instance.
        fresh: ``num_blocks`` on a fresh instance.
        mutations: how the calls changed the groups they were given, one line each.
        pool_bytes: the builder's ``_get_pool_bytes_per_block`` call (``None``: not
            asked, as Core never asks about an empty group list).
        empty: the call with no groups (an attention-free model).
        device: the torch device of the run's device checks.
        max_alloc_bytes: cap of one allocation of the device checks (``None``: the default).
        stage: the pipeline stage placed, its layers ``specs`` and ``groups`` the
            whole model's groups projected onto them (``None``: one stage, placed whole).
        model_specs: every layer of the model when a stage is placed (``None``: ``specs``).
    """

    config: PlanningConfig
    specs: Mapping[str, KVCacheSpec]
    groups: tuple[KVCacheGroupSpec, ...]
    groups_source: str
    num_blocks: int
    results: Mapping[int, CallResult]
    repeat: CallResult
    fresh: CallResult
    mutations: tuple[str, ...]
    pool_bytes: CallResult | None
    empty: CallResult
    device: str = "cpu"
    max_alloc_bytes: int | None = None
    stage: int | None = None
    model_specs: Mapping[str, KVCacheSpec] | None = None

    @property
    def mutated(self) -> bool:
        """Whether a call changed what it was given."""
        return bool(self.mutations)

    def reference_groups(self) -> list[KVCacheGroupSpec]:
        """The reference's groups, as this placement was handed them (projected onto its stage).

        Raises:
            KVRefError: the reference cannot group the model.
        """
        return self.groups_by(ReferenceKVCacheConfigBuilder())

    def groups_by(self, builder: Any) -> list[KVCacheGroupSpec]:
        """``builder``'s groups of the model, as this placement was handed them.

        Raises:
            Exception: what ``builder`` raises when it cannot group the model.
        """
        model = self.specs if self.model_specs is None else self.model_specs
        groups = list(builder.get_kv_cache_groups(self.config, dict(model)))
        if self.model_specs is None:
            return groups
        # A pipeline stage is handed the whole model's groups, projected onto its layers.
        return project_kv_cache_groups_to_worker(groups, self.specs)

    @property
    def declared_pool_bytes(self) -> int | None:
        """The builder's ``_get_pool_bytes_per_block`` answer when it gave a number."""
        if self.pool_bytes is None or not self.pool_bytes.ok:
            return None
        value: Any = self.pool_bytes.value
        return value if isinstance(value, int) else None

    @property
    def layout(self) -> KVCacheLayout:
        """The layout the builder was asked to place in."""
        return self.config.kv_cache_layout

    def config_at(self, num_blocks: int) -> KVCacheConfig | None:
        """The returned config for ``num_blocks`` when that call succeeded.

        ``None`` too when a byte count in it is no int in [0, 2**63) (past the
        records' validators): no check does arithmetic on such sizes or hands
        them to torch; ``KV-PLACE-SIZE-BOUND`` reads the raw results and reports them.
        """
        from conformance.check.bounds import tensor_problems

        result = self.results.get(num_blocks)
        if result is None or not result.ok:
            return None
        value: Any = result.value
        if not isinstance(value, KVCacheConfig) or tensor_problems(value):
            return None
        return value


@attrs.frozen(kw_only=True)
class HostObservation:
    """Grouping and placement of a model with layers to keep on the host.

    Attributes:
        config: the config naming ``host_resident_layers``.
        specs: the layer specs passed.
        groups: the builder's groups (a call result).
        placed: placement of those groups at ``num_blocks`` (when grouping worked).
        device_only: placement of the device groups alone at ``num_blocks``.
        num_blocks: the device block count asked for.
        device: the torch device of the run's device checks.
        max_alloc_bytes: cap of one allocation of the device checks (``None``: the default).
        pool_bytes: ``_get_pool_bytes_per_block`` asked about the groups, host ones included.
        pool_verdicts: ``KV-PLACE-POOL-BYTES``'s verdict on this placement (host
            groups never count in the answer), when it was judged.
    """

    config: PlanningConfig
    specs: Mapping[str, KVCacheSpec]
    groups: CallResult
    placed: CallResult | None
    device_only: CallResult | None
    num_blocks: int
    device: str = "cpu"
    max_alloc_bytes: int | None = None
    pool_bytes: CallResult | None = None
    pool_verdicts: Mapping[str, tuple[Violation, ...]] = attrs.field(factory=dict)


@attrs.frozen(kw_only=True)
class CoreObservation:
    """Core's whole flow run with the builder on a multi-worker problem.

    Attributes:
        config: the planning config.
        workers: one ``{layer: spec}`` dict per worker.
        available_memory: bytes per worker.
        result: the flow's outcome: a :class:`~kvref.planning.KVCachePlan` or an error.
        hook_verdicts: the grouping and placement invariants the hook answers
            inside the flow were judged by, each with its violations.
        hook_failures: hook calls inside the flow that raised or returned the
            wrong type (the flow stopped at the first).
    """

    config: PlanningConfig
    workers: tuple[Mapping[str, KVCacheSpec], ...]
    available_memory: tuple[int, ...]
    result: CallResult
    hook_verdicts: Mapping[str, tuple[Violation, ...]] = attrs.field(factory=dict)
    hook_failures: tuple[CallResult, ...] = ()

    @property
    def plan(self) -> KVCachePlan | None:
        """The plan when the flow returned one."""
        value: Any = self.result.value
        return value if self.result.ok and isinstance(value, KVCachePlan) else None


@attrs.frozen(kw_only=True)
class Resolution:
    """What resolving the builder by its qualname gave, once (vLLM ``get_kv_cache_config_builder``).

    A resolution whose construction fails is not recorded: the observation
    is then a :class:`ConstructFailure`, ``KV-CALL-CONSTRUCT``'s finding.

    Attributes:
        identity: ``id()`` of the object it gave (0: none, the builder hung earlier).
        type_name: the qualified name of that object's class.
        is_named_class: whether the object is an instance of the named class.
    """

    identity: int
    type_name: str
    is_named_class: bool


@attrs.frozen(kw_only=True)
class ProfilingObservation:
    """The one-worker profiling path run on every worker of a problem (contract.md#profiling-path).

    Each worker's builder groups that worker's own specs and places the
    result at the profiling block count, as vLLM's runners do before Core
    plans; every answer is judged by the catalog's hook-answer invariants
    (the same gate as Core's flow).

    Attributes:
        config: the planning config (``num_gpu_blocks_override`` unset).
        workers: one ``{layer: spec}`` dict per worker.
        num_blocks: the profiling block count, ``min(max_num_reqs, capture size) or 1``.
        qualname: the builder's qualname when resolution was exercised (``None``:
            the builder has none a platform could name).
        qualname_note: why resolution was not exercised, when it was not.
        resolutions: one resolution per worker, then one more (``()`` without a qualname).
        calls: every hook call, worker by worker (grouping, then placement when
            the groups were sound).
        again: with a qualname, worker 0's grouping by one more resolved builder.
        hook_verdicts: the hook-answer invariants the answers were judged by.
    """

    config: PlanningConfig
    workers: tuple[Mapping[str, KVCacheSpec], ...]
    num_blocks: int
    qualname: str | None
    qualname_note: str = ""
    resolutions: tuple[Resolution, ...] = ()
    calls: tuple[CallResult, ...] = ()
    again: CallResult | None = None
    hook_verdicts: Mapping[str, tuple[Violation, ...]] = attrs.field(factory=dict)

    @property
    def first_grouping(self) -> CallResult | None:
        """Worker 0's grouping call (the one :attr:`again` repeats)."""
        return self.calls[0] if self.calls else None


@attrs.frozen(kw_only=True)
class ProcessObservation:
    """One example answered here and in the twin process.

    Attributes:
        config, specs, num_blocks: the inputs.
        grouping: this process's grouping call.
        groups: the groups placed (the builder's when valid, else the reference's).
        placement: this process's placement of ``groups`` at ``num_blocks``.
        twin_grouping, twin_placement: the twin's ``(status, value)`` answers
            (``None``: not asked).
        unavailable: why the twin could not answer (``None``: it did).
        hash_seed: the twin's ``PYTHONHASHSEED``.
        skipped: why no call was made for this example (the twin's budget is spent).
    """

    config: PlanningConfig
    specs: Mapping[str, KVCacheSpec]
    num_blocks: int
    grouping: CallResult
    groups: tuple[KVCacheGroupSpec, ...]
    placement: CallResult
    twin_grouping: tuple[str, Any] | None = None
    twin_placement: tuple[str, Any] | None = None
    unavailable: str | None = None
    hash_seed: str = ""
    skipped: str | None = None


@attrs.frozen(kw_only=True)
class ConstructFailure:
    """The builder could not be constructed for an example; nothing else was observed.

    Attributes:
        result: the failed construction call.
    """

    result: CallResult


#: The builder's own hooks: a call of one that failed is the builder's doing.
_HOOKS = frozenset(
    {"get_kv_cache_groups", "get_kv_cache_config_from_groups", "_get_pool_bytes_per_block"}
)


def _failed_hook(value: Any) -> bool:
    return isinstance(value, CallResult) and value.hook in _HOOKS and not value.ok


def builder_spoiled(obs: Any) -> bool:
    """Whether a call of the builder's own hooks failed while ``obs`` was observed.

    An invariant that such an example could not judge was made unjudgeable by
    the builder, not by the run (contract.md#verdicts): it is inconclusive,
    never not-applicable.  Core's flow failing is not counted (it may fail
    legally, for want of memory); the hook calls it reports failing are.
    """
    if isinstance(obs, ConstructFailure):
        return True
    if not attrs.has(type(obs)):
        return False
    for field in attrs.fields(type(obs)):
        value = getattr(obs, field.name, None)
        if isinstance(value, Mapping):
            value = tuple(value.values())
        parts = value if isinstance(value, (tuple, list)) else (value,)
        if any(_failed_hook(part) for part in parts):
            return True
    return False
