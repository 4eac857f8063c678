"""The profiling scenario: the one-worker profiling call, with builders resolved by qualname.

Before Core plans the real cache, each worker that captures CUDA graphs
asks a fresh builder for the smallest cache that lets every graph be
captured (contract.md#profiling-path): ``get_kv_cache_groups`` on **that
worker's own specs** (its pipeline-parallel slice, untagged), then
``get_kv_cache_config_from_groups`` for one block per sequence,
``min(max_num_reqs, max_cudagraph_capture_size) or 1``, on the same
instance.  vLLM obtains that builder by resolving the platform's qualname
(``get_kv_cache_config_builder``), a fresh instance per call.

The observer repeats that on every worker of a generated problem.  Each
answer is judged by the catalog's hook-answer invariants through the same
gate as Core's flow (:mod:`conformance.check.gate`), so a builder that
assumes it sees every worker's layers is caught by the grouping or
placement invariant it breaks, with the worker named.  When the builder
has a qualname a platform could name, the builders come from
``kvref.get_kv_cache_config_builder`` with that qualname as the platform's
choice, and what resolution gave is recorded for ``KV-CALL-FRESH``.  A
builder run isolated (``--isolate``) is resolved inside its worker process
(:meth:`conformance.harness.isolate.IsolatedBuilder.resolve_in_worker`), so its
construction never runs in the kit's process.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs
from hypothesis import strategies as st

from conformance.check.observations import CallResult, ProfilingObservation, Resolution
from conformance.check.violations import Violation
from conformance.generate.problems import draw_problem_num_blocks
from conformance.generate.records import PlanningProblem
from conformance.harness.hooks import (
    ConstructionFailedError,
    Context,
    call_grouping,
    call_placement,
)
from conformance.scenarios.base import Scenario
from conformance.scenarios.examples import ProblemDraw
from kvref.builder import KVCacheConfigBuilder
from kvref.config import PlanningConfig
from kvref.specs import KVCacheSpec

__all__ = [
    "PROFILING",
    "observe_profiling",
    "profiling_block_count",
    "profiling_sizes",
]


def profiling_block_count(max_num_reqs: int, max_cudagraph_capture_size: int) -> int:
    """The profiling cache's blocks: one per sequence that a captured graph may run, at least 1.

    Raises:
        ValueError: an argument is not an int >= 0.
    """
    for name, value in (
        ("max_num_reqs", max_num_reqs),
        ("max_cudagraph_capture_size", max_cudagraph_capture_size),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name}={value!r} must be an int >= 0")
    return min(max_num_reqs, max_cudagraph_capture_size) or 1


def _resolve(ctx: Context, qualname: str, config: PlanningConfig) -> tuple[Resolution, Any]:
    """Resolve ``qualname`` as the platform's builder once (the object too, to keep it alive).

    Resolution instantiates the class: a construction that fails is
    ``KV-CALL-CONSTRUCT``'s finding, as with every other fresh builder.  An
    isolated builder's resolution runs in its worker process.

    Raises:
        ConstructionFailedError: constructing the resolved class failed.
    """
    from kvref.resolution import get_kv_cache_config_builder, resolve_builder_class

    proxy = ctx.resolver
    if proxy is not None:
        return _resolve_isolated(ctx, proxy, qualname, config)

    native = _factory_native(ctx)
    if native is not None:
        return _resolve_vllm_here(ctx, qualname)

    def resolve() -> KVCacheConfigBuilder:
        return get_kv_cache_config_builder(attrs.evolve(config, platform_builder_cls=qualname))

    result = ctx.guard.call("__init__", resolve)
    if result.not_called:
        # The builder hung earlier: the factory's stand-in is never called either.
        return Resolution(identity=0, type_name="", is_named_class=True), ctx.factory()
    if not result.ok:
        raise ConstructionFailedError(result)
    made: Any = result.value
    named = resolve_builder_class(qualname, "builder")
    resolution = Resolution(
        identity=id(made),
        type_name=f"{type(made).__module__}.{type(made).__qualname__}",
        is_named_class=isinstance(made, named),
    )
    return resolution, made


def _factory_native(ctx: Context) -> type[Any] | None:
    """The vLLM-native class a run in this process checks (``None``: a kvref builder)."""
    native = getattr(ctx.factory, "kvref_native", None)
    return native if isinstance(native, type) else None


def _resolve_vllm_here(ctx: Context, qualname: str) -> tuple[Resolution, Any]:
    """:func:`_resolve` for a vLLM-native builder run in this process: vLLM's resolution."""
    from conformance.harness.vllm_adapter import resolve_as_vllm

    result = ctx.guard.call("__init__", resolve_as_vllm, qualname)
    if result.not_called:
        return Resolution(identity=0, type_name="", is_named_class=True), ctx.factory()
    if not result.ok:
        raise ConstructionFailedError(result)
    made, (identity, type_name, named, is_builder) = result.value
    resolution = Resolution(identity=identity, type_name=type_name, is_named_class=named)
    return resolution, made if is_builder else ctx.factory()


def _resolve_isolated(
    ctx: Context, proxy: type[Any], qualname: str, config: PlanningConfig
) -> tuple[Resolution, Any]:
    """:func:`_resolve` inside an isolated builder's worker; hooks go to what it made there."""
    result = ctx.guard.call("__init__", proxy.resolve_in_worker, qualname, config)
    if result.not_called:
        return Resolution(identity=0, type_name="", is_named_class=True), ctx.factory()
    if not result.ok:
        raise ConstructionFailedError(result)
    made, facts = result.value
    resolution = Resolution(
        identity=facts.identity, type_name=facts.type_name, is_named_class=facts.is_named_class
    )
    # Not a builder: its hooks cannot be called, as in-process (the factory stands in).
    return resolution, made if facts.is_builder else ctx.factory()


def _on_worker(violations: Mapping[str, tuple[Violation, ...]], worker: int) -> dict[str, Any]:
    return {k: [attrs.evolve(v, worker=worker) for v in vs] for k, vs in violations.items()}


def _merge(into: dict[str, list[Violation]], found: Mapping[str, list[Violation]]) -> bool:
    """Add ``found`` to ``into``; whether any of it is a violation."""
    for invariant, violations in found.items():
        into.setdefault(invariant, []).extend(violations)
    return any(found.values())


def _one_worker(
    ctx: Context,
    builder: KVCacheConfigBuilder,
    config: PlanningConfig,
    index: int,
    specs: Mapping[str, KVCacheSpec],
    num_blocks: int,
    verdicts: dict[str, list[Violation]],
) -> list[CallResult]:
    """One worker's profiling calls, judged; placement only on groups that keep every rule."""
    from conformance.check.gate import judge_grouping, judge_placement

    grouped, _ = call_grouping(ctx.guard, builder, config, specs)
    if not grouped.ok:
        return [grouped]
    # A worker's slice is the whole model only without pipeline stages.
    whole = config.pipeline_parallel_size == 1
    if _merge(
        verdicts, _on_worker(judge_grouping(config, specs, grouped, whole_model=whole), index)
    ):
        # vLLM's partition check stops the profiling path here.
        return [grouped]
    groups = list(grouped.value)
    if not groups:
        # An attention-free worker: vLLM's profiling allocates nothing.
        return [grouped]
    placed, mutations = call_placement(ctx.guard, builder, config, groups, num_blocks)
    if placed.ok:
        found = judge_placement(
            config, groups, {num_blocks: placed}, num_blocks, pool_bytes=None, mutations=mutations
        )
        _merge(verdicts, _on_worker(found, index))
    return [grouped, placed]


def observe_profiling(
    ctx: Context,
    config: PlanningConfig,
    workers: Sequence[Mapping[str, KVCacheSpec]],
    num_blocks: int,
) -> ProfilingObservation:
    """Run the profiling path on every worker, each with a freshly resolved builder.

    With a qualname, one more builder is resolved after the workers' and
    asked to group worker 0 again: a stateless builder answers as the first did.
    """
    config = attrs.evolve(config, num_gpu_blocks_override=None)
    qualname, note = ctx.qualname, ctx.qualname_note
    resolutions: list[Resolution] = []
    alive: list[Any] = []  # keeps every resolved object alive, so ids stay distinct

    def fresh() -> KVCacheConfigBuilder:
        if qualname is None:
            return ctx.factory()
        resolution, made = _resolve(ctx, qualname, config)
        resolutions.append(resolution)
        alive.append(made)
        return made if isinstance(made, KVCacheConfigBuilder) else ctx.factory()

    verdicts: dict[str, list[Violation]] = {}
    calls: list[CallResult] = []
    for index, specs in enumerate(workers):
        calls += _one_worker(ctx, fresh(), config, index, specs, num_blocks, verdicts)
    again = None
    if qualname is not None and workers and calls and calls[0].ok:
        again, _ = call_grouping(ctx.guard, fresh(), config, workers[0])
    return ProfilingObservation(
        config=config,
        workers=tuple(dict(w) for w in workers),
        num_blocks=num_blocks,
        qualname=qualname,
        qualname_note=note,
        resolutions=tuple(resolutions),
        calls=tuple(calls),
        again=again,
        hook_verdicts={k: tuple(v) for k, v in verdicts.items()},
    )


def profiling_sizes() -> st.SearchStrategy[tuple[int, int]]:
    """``(max_num_reqs, max_cudagraph_capture_size)`` pairs a deployment might run.

    vLLM's defaults (256 or 1024 sequences, graphs up to 512) and small ones
    (a few sequences, no graphs: capture size 0), shrinking to ``(1, 1)``.
    """
    small = st.integers(0, 16)
    return st.tuples(
        st.one_of(st.integers(1, 16), st.sampled_from([256, 1024, 128])),
        st.one_of(small, st.sampled_from([512, 8, 256])),
    )


def _profiling_blocks(draw: st.DrawFn, problem: PlanningProblem) -> tuple[int, str]:
    # The generic count is drawn and replaced, so that the choices before the
    # sizes are those of the other scenarios' draws of the same problem.
    draw_problem_num_blocks(draw, problem)
    reqs, capture = draw(profiling_sizes())
    return (
        profiling_block_count(reqs, capture),
        f", max_num_reqs={reqs}, max_cudagraph_capture_size={capture}",
    )


def _observe(ctx: Context, ex: Any) -> ProfilingObservation:
    return observe_profiling(ctx, ex.config, ex.workers, ex.num_blocks)


#: The profiling path plans each worker alone: every worker's slice must be plannable.
_DRAW = ProblemDraw(num_blocks=_profiling_blocks, per_worker=True)

PROFILING = Scenario(
    name="profiling",
    examples=_DRAW.examples_for,
    observe=_observe,
    focused=True,
)
