"""The ``processes`` scenario: one example answered here and in a twin process.

The twin runs the builder's class with another string-hash seed
(:mod:`conformance.harness.twin`): a plan that follows set or dict order
differs between the two.  The twin starts when the run starts (seconds of
interpreter start-up overlap the other scenarios), and only when an
invariant of this scenario is judged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from conformance.check.observations import CallResult, ProcessObservation
from conformance.harness.hooks import (
    Context,
    builder_or_reference_groups,
    call_grouping,
    call_placement,
)
from conformance.harness.twin import TWIN_EXAMPLES, ask_twin, budget_spent, prestart
from conformance.scenarios.base import Scenario
from conformance.scenarios.examples import PLAIN

__all__ = ["PROCESSES", "observe_processes"]


def observe_processes(ctx: Context, example: Any) -> ProcessObservation:
    """Group and place ``example`` here and in the twin process."""
    config = attrs.evolve(example.config, num_gpu_blocks_override=None)
    specs = example.merged
    if budget_spent(ctx):
        return ProcessObservation(
            config=config,
            specs=dict(specs),
            num_blocks=example.num_blocks,
            grouping=CallResult(hook="get_kv_cache_groups", not_called=True),
            groups=(),
            placement=CallResult(hook="get_kv_cache_config_from_groups", not_called=True),
            skipped=f"the twin process answers the first {TWIN_EXAMPLES} examples of a run",
        )
    builder = ctx.factory()
    grouping, _ = call_grouping(ctx.guard, builder, config, specs)
    groups, _ = builder_or_reference_groups(ctx, config, specs)
    placement, _ = call_placement(ctx.guard, ctx.factory(), config, groups, example.num_blocks)
    there = ask_twin(ctx, builder, config, specs, groups, example.num_blocks)
    return ProcessObservation(
        config=config,
        specs=dict(specs),
        num_blocks=example.num_blocks,
        grouping=grouping,
        groups=groups,
        placement=placement,
        twin_grouping=there.grouping,
        twin_placement=there.placement,
        unavailable=there.unavailable,
        hash_seed=there.hash_seed,
        skipped=there.skipped,
    )


def _prepare(ctx: Context, builder: object, checks: Sequence[Any]) -> Context:
    # The twin (seconds to start) serves only the invariants of this scenario
    # itself; the call invariants judged here read this process's calls.
    wanted = any(inv.scenario == PROCESSES.name for inv in checks)
    ctx = attrs.evolve(ctx, twin=wanted)
    if wanted:
        prestart(ctx, builder)
    return ctx


PROCESSES = Scenario(
    name="processes",
    examples=PLAIN.examples_for,
    observe=observe_processes,
    prepare=_prepare,
)
