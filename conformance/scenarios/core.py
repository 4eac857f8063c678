"""The ``core`` scenario: Core's flow, the builder behind a proxy that passes lawful answers.

Core-flow invariants judge Core given honest hooks.  Inside the flow the
proxy hands every hook fresh copies of its inputs and asks the catalog
(:mod:`conformance.check.gate`) to judge each answer; an answer that breaks
an invariant stops the flow, and the invariant it broke reports it, so a
builder that mishandles groups Core projects to a worker is caught by the
same invariant that catches it in the placement scenario.
"""

from __future__ import annotations

import traceback
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from conformance.check.observations import CallResult, CoreObservation
from conformance.check.violations import Violation
from conformance.harness.guard import fresh_lists, groups_key
from conformance.harness.hooks import (
    ConstructionFailedError,
    Context,
    config_validator,
    fresh_specs,
    groups_validator,
    pool_validator,
)
from conformance.scenarios.base import any_problem
from conformance.scenarios.examples import ProblemDraw
from kvref.builder import KVCacheConfigBuilder
from kvref.config import PlanningConfig
from kvref.planning import plan_kv_cache
from kvref.records import KVCacheConfig, KVCacheGroupSpec
from kvref.specs import KVCacheSpec

__all__ = ["CORE", "IN_VLLM_FLOW", "ContractBrokenError", "observe_core"]

#: What a placement inside vLLM's own Core flow is judged by.  vLLM asks its
#: hooks in ways kvref's Core does not (probes under num_gpu_blocks_override,
#: a worker's projected groups that keep a plain spec for fewer layers), so
#: the invariants that compare an answer with how Core asked would blame
#: vLLM's flow on the builder.  Memory safety holds whatever the builder is
#: asked: vLLM allocates and runs every placement its flow gets; and every
#: config it keeps carries the operator's retention interval to its manager.
IN_VLLM_FLOW = frozenset(
    {
        "KV-PLACE-IN-BOUNDS",
        "KV-PLACE-NO-BLOCK-ALIAS",
        "KV-PLACE-NO-LAYER-OVERLAP",
        "KV-PLACE-RETENTION",
    }
)


class ContractBrokenError(Exception):
    """A hook broke its contract inside Core's flow; the flow stops here."""


def _direct(hook: str, fn: Any, *args: Any, validate: Any = None) -> CallResult:
    # The whole flow runs under one guarded call; a hook's own exception (even
    # SystemExit) is the builder's, never Core's.
    name = f"{hook} (inside Core's flow)"
    try:
        value = fn(*args)
    except BaseException as exc:
        tb = "".join(traceback.format_exception(exc)[-3:])
        return CallResult(
            hook=name, error=f"{type(exc).__name__}: {exc}", error_type=type(exc), traceback=tb
        )
    problem = validate(value) if validate is not None else None
    if problem is not None:
        return CallResult(hook=name, wrong_type=problem)
    return CallResult(hook=name, value=value)


class _Checked(KVCacheConfigBuilder):
    """Delegates to a builder; records the catalog's verdict on every answer."""

    def __init__(
        self,
        inner: KVCacheConfigBuilder,
        verdicts: dict[str, list[Violation]],
        failed: list[CallResult],
    ) -> None:
        self.inner = inner
        self.verdicts = verdicts
        self.failed = failed
        # Core asks one instance about every worker's groups before placing
        # any of them: each placement is judged against the answer for its own groups.
        self.pools: dict[tuple[tuple[str, ...], ...], CallResult] = {}
        # Whether the pool-bytes hook changed the groups it was asked about.
        self.pool_changed: set[tuple[tuple[str, ...], ...]] = set()

    def _record(self, found: Mapping[str, tuple[Violation, ...]], *, stop: bool = True) -> None:
        for invariant, violations in found.items():
            self.verdicts.setdefault(invariant, []).extend(violations)
        if not stop:
            return
        broken = sorted(k for k, v in found.items() if v)
        if broken:
            raise ContractBrokenError(f"the hook's answer breaks {', '.join(broken)}")

    def _answer(self, result: CallResult) -> Any:
        if not result.ok:
            # Reported by the KV-CALL-* invariants, from this observation.
            self.failed.append(result)
            raise ContractBrokenError(result.describe())
        return result.value

    def get_kv_cache_groups(
        self, config: PlanningConfig, kv_cache_spec: Mapping[str, KVCacheSpec]
    ) -> list[KVCacheGroupSpec]:
        from conformance.check.gate import judge_grouping

        result = _direct(
            "get_kv_cache_groups",
            self.inner.get_kv_cache_groups,
            config,
            fresh_specs(kv_cache_spec),
            validate=groups_validator,
        )
        groups: list[KVCacheGroupSpec] = self._answer(result)
        self._record(judge_grouping(config, kv_cache_spec, result))
        return groups

    def get_kv_cache_config_from_groups(
        self, config: PlanningConfig, kv_cache_groups: Sequence[KVCacheGroupSpec], num_blocks: int
    ) -> KVCacheConfig:
        from conformance.check.gate import judge_placement

        given, pristine, for_one = fresh_lists(kv_cache_groups, 3)
        result = _direct(
            "get_kv_cache_config_from_groups",
            self.inner.get_kv_cache_config_from_groups,
            config,
            given,
            num_blocks,
            validate=config_validator,
        )
        config_out: KVCacheConfig = self._answer(result)
        results = {num_blocks: result}
        if num_blocks != 1:
            # Core's arithmetic assumes size(n) == n * size(1): judge linearity too.
            results[1] = _direct(
                "get_kv_cache_config_from_groups",
                self.inner.get_kv_cache_config_from_groups,
                config,
                for_one,
                1,
                validate=config_validator,
            )
            self._answer(results[1])
        mutations: tuple[str, ...] = ()
        if given != pristine:
            mutations += ("placement changed the groups it was given",)
        if groups_key(kv_cache_groups) in self.pool_changed:
            mutations += ("_get_pool_bytes_per_block changed the groups it was given",)
        self._record(
            judge_placement(
                config,
                list(kv_cache_groups),
                results,
                num_blocks,
                pool_bytes=self.pools.get(groups_key(kv_cache_groups)),
                mutations=mutations,
            )
        )
        return config_out

    def judge_in_vllm_flow(
        self,
        config: PlanningConfig,
        groups: Sequence[KVCacheGroupSpec],
        num_blocks: int,
        placed: KVCacheConfig,
        pool_bytes: int | None,
    ) -> None:
        """Judge a placement vLLM's Core flow got from the builder, by :data:`IN_VLLM_FLOW`.

        ``pool_bytes`` is the builder's own answer for these groups, if it
        gave one (several allocations are legal only then).  The flow goes
        on whatever the verdict, as vLLM's would: the Core invariants still
        judge the plan vLLM makes, and a builder that inherits a vLLM defect
        answers there exactly as vLLM's default does.
        """
        from conformance.check.gate import judge_placement

        hook = "get_kv_cache_config_from_groups (inside vLLM's Core flow)"
        declared = (
            None
            if pool_bytes is None
            else CallResult(hook="_get_pool_bytes_per_block", value=pool_bytes)
        )
        self._record(
            judge_placement(
                config,
                list(groups),
                {num_blocks: CallResult(hook=hook, value=placed)},
                num_blocks,
                pool_bytes=declared,
                mutations=(),
                only=IN_VLLM_FLOW,
            ),
            stop=False,
        )

    def _get_pool_bytes_per_block(
        self, config: PlanningConfig, kv_cache_groups: Sequence[KVCacheGroupSpec]
    ) -> int | None:
        given, pristine = fresh_lists(kv_cache_groups, 2)
        result = _direct(
            "_get_pool_bytes_per_block",
            self.inner._get_pool_bytes_per_block,
            config,
            given,
            validate=pool_validator,
        )
        declared: int | None = self._answer(result)
        key = groups_key(kv_cache_groups)
        self.pools[key] = result
        if given != pristine:
            self.pool_changed.add(key)
        return declared


def observe_core(
    ctx: Context,
    config: PlanningConfig,
    workers: Sequence[Mapping[str, KVCacheSpec]],
    available_memory: Sequence[int],
) -> CoreObservation:
    """Run Core's flow (kvref's unless the context brings one) as one guarded call.

    Every phase gets a fresh, checked builder; every hook answer inside the
    flow is judged by the catalog's grouping and placement invariants before
    it may flow on (:mod:`conformance.check.gate`); a broken answer stops the
    flow and is reported by the invariant it broke.
    """
    verdicts: dict[str, list[Violation]] = {}
    failed: list[CallResult] = []
    factory = ctx.factory

    class _Fresh(KVCacheConfigBuilder):
        # Core instantiates a builder per phase; route each to the factory.
        def __new__(cls) -> Any:
            try:
                return _Checked(factory(), verdicts, failed)
            except ConstructionFailedError as exc:
                failed.append(exc.result)
                raise ContractBrokenError(str(exc)) from None

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

    copies = [fresh_specs(w) for w in workers]
    flow = ctx.core or plan_kv_cache
    # Core makes many hook calls; give the whole flow a proportionally longer deadline.
    result = ctx.guard.call(
        "core", flow, _Fresh, config, copies, list(available_memory), timeout=ctx.guard.timeout * 20
    )
    if result.error_type is not None and (
        issubclass(result.error_type, ContractBrokenError) or verdicts_broken(verdicts)
    ):
        # A hook broke its contract inside Core: the invariant it broke reports
        # that; Core's own result says nothing.
        result = attrs.evolve(result, hook="core-builder")
    return CoreObservation(
        config=config,
        workers=tuple(dict(w) for w in workers),
        available_memory=tuple(available_memory),
        result=result,
        hook_verdicts={k: tuple(v) for k, v in verdicts.items()},
        hook_failures=tuple(failed),
    )


def verdicts_broken(verdicts: Mapping[str, Sequence[Violation]]) -> bool:
    """Whether any hook answer inside the flow broke an invariant."""
    return any(verdicts.values())


def _observe(ctx: Context, ex: Any) -> CoreObservation:
    return observe_core(ctx, ex.config, ex.workers, ex.available_memory)


def _keep_host(
    _draw: Any, config: PlanningConfig, _workers: Sequence[Any], _limits: Any
) -> PlanningConfig:
    # Core keeps the generator's host layers: its host exclusions (pool
    # bytes, admission) are judged on the builder's own answers.
    return config


_DRAW = ProblemDraw(config=_keep_host)

CORE = any_problem("core", _DRAW.examples_for, _observe)
