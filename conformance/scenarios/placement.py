"""The ``placement`` scenario: the groups placed at several block counts, again, afresh, empty.

The groups are the builder's own when they keep the grouping invariants,
else the reference's, so that a grouping bug is reported once and placement
is still exercised.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from conformance.check.observations import CallResult, PlacementObservation
from conformance.harness.hooks import (
    Context,
    builder_or_reference_groups,
    call_placement,
    call_pool_bytes,
)
from conformance.scenarios.base import any_problem
from conformance.scenarios.examples import PLAIN
from kvref.config import PlanningConfig
from kvref.planning import project_kv_cache_groups_to_worker
from kvref.records import KVCacheGroupSpec
from kvref.specs import KVCacheSpec

__all__ = ["PLACEMENT", "observe_example", "observe_placement"]


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


def observe_example(ctx: Context, ex: Any) -> PlacementObservation:
    """:func:`observe_placement` of a drawn example (every worker's layers, its block count)."""
    return observe_placement(ctx, ex.config, ex.merged, ex.num_blocks, ex.workers)


PLACEMENT = any_problem("placement", PLAIN.examples_for, observe_example)
