"""The ``grouping`` scenario: ``get_kv_cache_groups`` asked twice, and once more afresh."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from conformance.check.observations import GroupingObservation
from conformance.harness.hooks import Context, call_grouping
from conformance.scenarios.base import any_problem
from conformance.scenarios.examples import PLAIN
from kvref.config import PlanningConfig
from kvref.specs import KVCacheSpec

__all__ = ["GROUPING", "observe_grouping"]


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


def _observe(ctx: Context, ex: Any) -> GroupingObservation:
    return observe_grouping(ctx, ex.config, ex.merged)


GROUPING = any_problem("grouping", PLAIN.examples_for, _observe)
