"""``--baseline``: compare a run's failures with those of an earlier run's JSON report.

A vendor adopting the kit on a builder with known failures gates CI on what
changed: failures new in this run fail it (exit 1); failures the baseline
already had (unchanged) and those it had that now hold (fixed) are reported
but do not.  A failure is what fails a run: FAIL, INCONCLUSIVE, and the XPASS
of a strict expectation.  A baseline failure this run reports as XFAIL (an
expectations manifest applied to this run and not to the baseline's) still
fails: it is ``expected``, never ``fixed``.

A baseline is data a run trusts with its exit status, so it must be a run's
report: every failing result must carry the counterexample and the examples
that judged it, as the kit writes them (a hand-made file that calls every
invariant failing would excuse any bug).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs

from conformance.report.model import STATUSES, Report

__all__ = ["Baseline", "BaselineError", "compare", "load_baseline"]


class BaselineError(ValueError):
    """A baseline report cannot be used: names the file, field and value."""


@attrs.frozen(kw_only=True)
class Baseline:
    """The failing invariant ids of an earlier run's report."""

    path: str
    failing: frozenset[str]


def _failing(result: dict[str, Any]) -> bool:
    if result["status"] in ("fail", "inconclusive"):
        return True
    expectation = result.get("expectation") or {}
    return result["status"] == "xpass" and bool(expectation.get("strict"))


def load_baseline(path: Path) -> Baseline:
    """Read an earlier run's ``--json`` report.

    Raises:
        BaselineError: unreadable, not JSON, an incomplete marker, or a result
            without a known ``id`` and ``status``.
    """
    where = f"--baseline {str(path)!r}"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise BaselineError(f"{where} cannot be read: {exc}") from None
    except json.JSONDecodeError as exc:
        raise BaselineError(f"{where} is not JSON: {exc}") from None
    if not isinstance(data, dict) or data.get("schema_version") != 1:
        version = data.get("schema_version") if isinstance(data, dict) else None
        raise BaselineError(
            f"{where}: schema_version {version!r} is not 1: not a kvref-conformance --json report"
        )
    if data.get("complete") is not True:
        raise BaselineError(
            f"{where}: complete {data.get('complete')!r}: an incomplete marker of a run that did "
            "not finish has no verdicts to compare with"
        )
    results = data.get("results")
    if not isinstance(results, list):
        raise BaselineError(f"{where}: results {results!r} must be a list")
    for index, result in enumerate(results):
        if not isinstance(result, dict) or not isinstance(result.get("id"), str):
            raise BaselineError(f"{where}: results[{index}] has no string id")
        if result.get("status") not in STATUSES:
            raise BaselineError(
                f"{where}: results[{index}] ({result['id']}): status {result.get('status')!r} "
                f"is not one of {list(STATUSES)}"
            )
    failing = frozenset(r["id"] for r in results if _failing(r))
    for index, result in enumerate(results):
        if result["status"] == "fail" and not (
            result.get("counterexample")
            and isinstance(result.get("examples"), int)
            and result["examples"] > 0
        ):
            raise BaselineError(
                f"{where}: results[{index}] ({result['id']}) fails without the counterexample "
                "and the examples that judged it: not a kvref-conformance run's report"
            )
    return Baseline(path=str(path), failing=failing)


def compare(report: Report, baseline: Baseline) -> Report:
    """The report with its ``baseline`` field: new, fixed, unchanged and expected failing ids.

    Fixed counts only invariants this run judged and found holding (a
    baseline failure left out of this run's selection is neither fixed nor
    unchanged; one this run reports as XFAIL still fails: ``expected``).
    """
    now = report.failing_ids
    held = {r.id for r in report.results if r.status in ("pass", "xpass") and not r.strict_xpass}
    expected = {r.id for r in report.results if r.status == "xfail"}
    return attrs.evolve(
        report,
        baseline={
            "path": baseline.path,
            "new": sorted(now - baseline.failing),
            "fixed": sorted(baseline.failing & held),
            "unchanged": sorted(now & baseline.failing),
            "expected": sorted(baseline.failing & expected),
        },
    )
