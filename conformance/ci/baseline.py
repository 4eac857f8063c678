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

import re
from pathlib import Path
from typing import Any

import attrs

from conformance.report.documents import DocumentError, read_json, schema_error
from conformance.report.model import STATUSES, Report

__all__ = ["Baseline", "BaselineError", "compare", "load_baseline"]


class BaselineError(ValueError):
    """A baseline report cannot be used: names the file, field and value."""


@attrs.frozen(kw_only=True)
class Baseline:
    """The failing invariant ids of an earlier run's report."""

    path: str
    failing: frozenset[str]


_ID = re.compile(r"^KV-[A-Z0-9]+(-[A-Z0-9]+)*$")
#: What :func:`load_baseline` reads of a report, beyond its ids and statuses.
_READ: dict[str, Any] = {
    "type": "object",
    "properties": {
        "results": {
            "items": {
                "properties": {
                    "examples": {"type": "integer", "minimum": 0},
                    "counterexample": {"type": ["string", "null"]},
                    "reason": {"type": ["string", "null"]},
                    "expectation": {
                        "type": ["object", "null"],
                        "properties": {"strict": {"type": "boolean"}},
                    },
                },
            },
        },
    },
}


def _failing(result: dict[str, Any]) -> bool:
    if result["status"] in ("fail", "inconclusive"):
        return True
    expectation = result.get("expectation") or {}
    return result["status"] == "xpass" and bool(expectation.get("strict"))


def load_baseline(path: Path) -> Baseline:
    """Read an earlier run's ``--json`` report.

    Raises:
        BaselineError: unreadable, not strict JSON, an incomplete marker, a
            result without an invariant ``id`` and a known ``status``, a field
            of the wrong type, or a failing result without what judged it.
    """
    where = f"--baseline {str(path)!r}"
    try:
        data = read_json(path, where)
    except DocumentError as exc:
        raise BaselineError(str(exc)) from None
    version = data.get("schema_version") if isinstance(data, dict) else None
    if type(version) is not int or version != 1:
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
        ident = result.get("id") if isinstance(result, dict) else None
        if not isinstance(ident, str) or not _ID.match(ident):
            raise BaselineError(f"{where}: results[{index}]: id {ident!r:.80} is no invariant id")
        if result.get("status") not in STATUSES:
            raise BaselineError(
                f"{where}: results[{index}] ({result['id']}): status {result.get('status')!r} "
                f"is not one of {list(STATUSES)}"
            )
    found = schema_error(data, _READ)
    if found:
        raise BaselineError(f"{where}: {found}")
    for index, result in enumerate(results):
        missing = _evidence_missing(result)
        if missing:
            raise BaselineError(
                f"{where}: results[{index}] ({result['id']}) {missing}: "
                "not a kvref-conformance run's report"
            )
    failing = frozenset(r["id"] for r in results if _failing(r))
    return Baseline(path=str(path), failing=failing)


def _evidence_missing(result: dict[str, Any]) -> str | None:
    """What a failing result lacks of what the kit writes with it (``None``: nothing).

    Every way a result fails a run must carry what judged it, or one line
    per invariant would excuse any bug: a failure its counterexample and
    examples, an inconclusive result its reason, a strict XPASS the
    expectation it passed against and the examples that held.
    """
    status, examples = result["status"], result.get("examples")
    judged = isinstance(examples, int) and examples > 0
    if status == "fail" and not (result.get("counterexample") and judged):
        return "fails without the counterexample and the examples that judged it"
    if status == "inconclusive" and not (result.get("reason") or "").strip():
        return "is inconclusive without the reason"
    if status == "xpass" and (result.get("expectation") or {}).get("strict") and not judged:
        return "is a strict XPASS without the examples that held"
    return None


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
