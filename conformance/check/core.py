"""Core-flow invariants: the cross-worker plan Core builds around the builder's hooks."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from conformance.check.catalog import Check, flag, invariant, invariant_on
from conformance.check.geometry import OracleError, request_need_bytes
from conformance.check.need import request_need_from_layers
from conformance.check.observations import CoreObservation
from conformance.check.violations import Violation
from kvref.errors import InsufficientMemoryError
from kvref.planning import KVCachePlan
from kvref.records import KVCacheConfig


def _plan(obs: CoreObservation) -> KVCachePlan | None:
    return obs.plan


def core_invariant(
    id: str, title: str, *, anchor: str = "core-flow"
) -> Callable[[Callable[[CoreObservation, KVCachePlan], Any]], Check]:
    """Declare a check of the plan Core's flow returned (a failed flow is not judged)."""
    return invariant_on(_plan, id, title, anchor=anchor, scenario="core")


@core_invariant(
    "KV-CORE-WORKER-LAYERS",
    "each worker's config covers exactly its layers",
)
def _worker_layers(obs: CoreObservation, plan: KVCachePlan) -> list[Violation]:
    out = []
    for w, (config, specs) in enumerate(zip(plan.configs, obs.workers, strict=False)):
        grouped = {n for g in config.kv_cache_groups for n in g.layer_names}
        placed = {n for t in config.kv_cache_tensors for n in t.layers}
        expected = set(specs)
        if grouped != expected or placed != expected:
            missing = sorted(expected - (grouped & placed))[:3]
            foreign = sorted((grouped | placed) - expected)[:3]
            out.append(
                flag(
                    f"the config covers {len(grouped & placed)} of the worker's {len(expected)} "
                    f"layers (missing {missing}, foreign {foreign})",
                    worker=w,
                )
            )
    if len(plan.configs) != len(obs.workers):
        out.append(
            flag(
                f"{len(plan.configs)} configs for {len(obs.workers)} workers",
            )
        )
    return out


@core_invariant(
    "KV-CORE-SAME-BLOCKS",
    "all workers end with the same num_blocks",
)
def _same_blocks(obs: CoreObservation, plan: KVCachePlan) -> list[Violation]:
    counts = [c.num_blocks for c in plan.configs]
    if len(set(counts)) > 1:
        return [
            flag(
                f"workers end with different num_blocks {counts}; the scheduler needs one block "
                "count",
            )
        ]
    return []


def _bpb(config: KVCacheConfig) -> int:
    """Device bytes one block takes: every distinct backing once, as KV-CORE-MEMORY adds them.

    A builder with several device allocations declares their sum through
    ``_get_pool_bytes_per_block`` and Core divides the memory by it; the
    largest backing alone would understate a block and make the limiting
    worker look as if it had room for more (a false KV-CORE-SLACK).
    """
    size = sum({t.size for t in config.device_tensors})
    return size // config.num_blocks if config.num_blocks else 0


def _sized_by_memory(
    check: Callable[[CoreObservation, KVCachePlan], list[Violation]],
) -> Callable[[CoreObservation, KVCachePlan], list[Violation]]:
    """``check``, holding where num_gpu_blocks_override, not memory, sizes the plan.

    KV-CORE-OVERRIDE judges such plans.
    """

    @functools.wraps(check)
    def judge(obs: CoreObservation, plan: KVCachePlan) -> list[Violation]:
        return [] if obs.config.num_gpu_blocks_override is not None else check(obs, plan)

    return judge


@core_invariant(
    "KV-CORE-MEMORY",
    "device bytes never exceed the available memory",
)
@_sized_by_memory
def _core_memory(obs: CoreObservation, plan: KVCachePlan) -> list[Violation]:
    out = []
    for w, (config, available) in enumerate(zip(plan.configs, obs.available_memory, strict=False)):
        used = sum({t.size for t in config.device_tensors})
        if used > available:
            out.append(
                flag(
                    f"the device backing is {used} bytes but only {available} are available",
                    worker=w,
                )
            )
    return out


@core_invariant(
    "KV-CORE-SLACK",
    "the limiting worker has less than one block of slack",
)
@_sized_by_memory
def _core_slack(obs: CoreObservation, plan: KVCachePlan) -> list[Violation]:
    bpbs = [_bpb(c) for c in plan.configs]
    active = [(w, b) for w, b in enumerate(bpbs) if b > 0]
    if not active:
        return []
    n = plan.configs[0].num_blocks
    if any((n + 1) * b > obs.available_memory[w] for w, b in active):
        return []
    slack = min(obs.available_memory[w] // b - n for w, b in active)
    return [
        flag(
            f"every worker could hold at least {slack} more blocks than the {n} planned; the "
            "limiting worker must be left with less than one block",
        )
    ]


@invariant(
    "KV-CORE-OVERRIDE",
    "num_gpu_blocks_override is honoured",
    anchor="core-flow",
    scenario="core",
)
def _core_override(obs: CoreObservation) -> list[Violation] | None:
    override = obs.config.num_gpu_blocks_override
    plan = obs.plan
    if override is None:
        return []
    if plan is None:
        return None
    bad = [c.num_blocks for c in plan.configs if c.num_blocks != override]
    if bad:
        return [
            flag(
                f"num_gpu_blocks_override={override} but the configs have num_blocks {bad[:4]}",
            )
        ]
    return []


@core_invariant(
    "KV-CORE-ADMISSION",
    "insufficient memory is an error, never a config",
    anchor="core-admission",
)
def _core_admission(obs: CoreObservation, plan: KVCachePlan) -> list[Violation] | None:
    if not plan.global_groups:
        return []
    out = []
    length = plan.max_model_len
    if not obs.config.auto_fit_max_model_len and length != obs.config.max_model_len:
        out.append(
            flag(
                f"the plan is for max_model_len={length} but the config asks for "
                f"{obs.config.max_model_len} and does not auto-fit",
            )
        )
        length = obs.config.max_model_len
    elif length > obs.config.max_model_len:
        out.append(
            flag(
                f"auto-fit raised max_model_len to {length}, above the config's "
                f"{obs.config.max_model_len}",
            )
        )
    config = obs.config.with_max_model_len(length)
    layers = {name: spec for worker in obs.workers for name, spec in worker.items()}
    for w, (cfg, specs) in enumerate(zip(plan.configs, obs.workers, strict=False)):
        bpb = _bpb(cfg)
        if bpb == 0:
            continue
        available = obs.available_memory[w]
        if obs.config.num_gpu_blocks_override is not None:
            available = obs.config.num_gpu_blocks_override * bpb
        try:
            # The kit's own need formula (conformance.check.geometry), never kvref's.
            needed = request_need_bytes(config, plan.global_groups, bpb, worker_layers=specs)
        except OracleError:
            return out or None  # the contract gives no need for these specs: not judged
        # What the layers themselves need: group specs that understate it are no excuse.
        from_layers = request_need_from_layers(config, plan.global_groups, layers, bpb, specs)
        if from_layers is None:
            return out or None
        needed = max(needed, from_layers)
        if needed > available - bpb:
            out.append(
                flag(
                    f"a config was returned although one request at max_model_len={length} needs "
                    f"{needed} bytes and only {available - bpb} are left after the null block; "
                    "this must be an error",
                    worker=w,
                )
            )
    return out


@invariant(
    "KV-CORE-ERROR-TYPED",
    "Core's failures are typed errors with numbers",
    anchor="core-errors",
    scenario="core",
)
def _core_error_clear(obs: CoreObservation) -> list[Violation] | None:
    if obs.result.ok or obs.result.error_type is None or obs.result.hook != "core":
        return None
    if issubclass(obs.result.error_type, InsufficientMemoryError):
        return []
    if not issubclass(obs.result.error_type, ValueError):
        return [
            flag(
                f"Core's flow failed with {obs.result.error}; failures must be typed ValueErrors "
                "with the numbers in the message",
            )
        ]
    return []
