"""Determinism across processes: grouping and placement do not follow the string-hash seed."""

from __future__ import annotations

from typing import Any

from conformance.check.catalog import Unjudged, flag, invariant
from conformance.check.violations import Violation


def _differs(here: Any, there: tuple[str, Any] | None, what: str, seed: str) -> Violation | None:
    if there is None or not here.ok:
        return None  # a failing call is KV-CALL-*'s finding
    status, value = there
    if status == "construct-error":
        return None  # the twin could not build it: KV-CALL-CONSTRUCT's matter
    if status != "ok":
        return flag(
            f"{what} succeeds in this process but fails in a process with "
            f"PYTHONHASHSEED={seed}: {value}",
        )
    same = list(here.value) == list(value) if what == "grouping" else here.value == value
    if same:
        return None
    return flag(
        f"{what} of the same input differs in a process with PYTHONHASHSEED={seed}: the plan "
        "follows the iteration order of hashed strings (a set or a dict built from one), so "
        "the engine and its workers disagree",
    )


@invariant(
    "KV-GROUP-HASH-STABLE",
    "grouping and placement are the same in a process with another string-hash seed",
    anchor="hook-purity",
    scenario="processes",
)
def _hash_stable(obs: Any) -> list[Violation] | Unjudged:
    if obs.skipped is not None:
        return Unjudged(obs.skipped)
    if obs.unavailable is not None:
        return Unjudged(obs.unavailable, applicable=False)
    found = [
        _differs(obs.grouping, obs.twin_grouping, "grouping", obs.hash_seed),
        _differs(obs.placement, obs.twin_placement, "placement", obs.hash_seed),
    ]
    if obs.twin_grouping is None and obs.twin_placement is None:
        return Unjudged("the twin process was not asked")
    return [f for f in found if f is not None]
