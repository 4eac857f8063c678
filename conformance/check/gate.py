"""The catalog as a gate: judge one hook answer the way the scenarios judge it.

Core's flow calls the builder's hooks on inputs the scenarios never make
(groups projected to a worker, re-plans at the converged block count).  The
Core proxy asks this module whether each answer keeps the grouping and
placement invariants before it lets the answer flow on; the rules are the
catalog's own checks, not a second copy of them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from conformance.check.catalog import Unjudged, catalog
from conformance.check.observations import CallResult, GroupingObservation, PlacementObservation
from conformance.check.violations import Violation
from kvref.config import PlanningConfig
from kvref.records import KVCacheGroupSpec
from kvref.specs import KVCacheSpec

__all__ = ["gated", "grouping_findings", "judge", "judge_grouping", "judge_placement"]


def gated() -> frozenset[str]:
    """Invariants that judge hook answers inside Core's flow (declared with ``in_core``).

    The others need calls Core does not make (a repeat, a fresh instance, no groups).
    """
    return frozenset(
        inv.id
        for inv in catalog()
        if "core" in inv.scenarios and inv.scenario in ("grouping", "placement")
    )


def judge(
    scenario: str, obs: Any, *, only: frozenset[str] | None = None
) -> dict[str, tuple[Violation, ...]]:
    """Each gated invariant of ``scenario`` (of ``only``, if given) that ``obs`` judged."""
    verdicts: dict[str, tuple[Violation, ...]] = {}
    ids = gated() if only is None else gated() & only
    for inv in catalog():
        if inv.scenario != scenario or inv.id not in ids:
            continue
        outcome = inv.check(obs)
        if outcome is None or isinstance(outcome, Unjudged):
            continue
        verdicts[inv.id] = tuple(outcome)
    return verdicts


def judge_grouping(
    config: PlanningConfig,
    specs: Mapping[str, KVCacheSpec],
    result: CallResult,
    *,
    whole_model: bool = True,
) -> dict[str, tuple[Violation, ...]]:
    """The grouping invariants one grouping answer was judged by.

    ``whole_model`` is false for one pipeline worker's slice (the profiling path).
    """
    obs = GroupingObservation(
        config=config,
        specs=specs,
        first=result,
        second=result,
        fresh=result,
        whole_model=whole_model,
    )
    return judge("grouping", obs)


def grouping_findings(
    config: PlanningConfig, specs: Mapping[str, KVCacheSpec], result: CallResult
) -> dict[str, tuple[Violation, ...]]:
    """The grouping invariants one grouping answer breaks (empty: it keeps them all)."""
    return {k: v for k, v in judge_grouping(config, specs, result).items() if v}


def judge_placement(
    config: PlanningConfig,
    groups: Sequence[KVCacheGroupSpec],
    results: Mapping[int, CallResult],
    num_blocks: int,
    *,
    pool_bytes: CallResult | None,
    mutations: tuple[str, ...],
    only: frozenset[str] | None = None,
) -> dict[str, tuple[Violation, ...]]:
    """The placement invariants (of ``only``, if given) one placement answer was judged by."""
    answer = results[num_blocks]
    obs = PlacementObservation(
        config=config,
        specs={},
        groups=tuple(groups),
        groups_source="core",
        num_blocks=num_blocks,
        results=results,
        repeat=answer,
        fresh=answer,
        mutations=mutations,
        pool_bytes=pool_bytes,
        empty=answer,
    )
    return judge("placement", obs, only=only)


def judge_pool_bytes(
    config: PlanningConfig,
    groups: Sequence[KVCacheGroupSpec],
    placed: CallResult,
    num_blocks: int,
    pool_bytes: CallResult,
) -> dict[str, tuple[Violation, ...]]:
    """``KV-PLACE-POOL-BYTES`` on one placement next to host-resident groups."""
    # Only the one invariant: the memory checks of the whole gate cost most of a
    # host example, for verdicts this caller throws away.
    return judge_placement(
        config,
        groups,
        {num_blocks: placed},
        num_blocks,
        pool_bytes=pool_bytes,
        mutations=(),
        only=frozenset({"KV-PLACE-POOL-BYTES"}),
    )
