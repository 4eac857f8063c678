"""Applying expectations to a report, and refreshing a manifest from a run.

An entry applies to a run when its ``device`` and ``vllm`` conditions hold;
it matches a failure (FAIL or INCONCLUSIVE) of its invariant when, besides,
its ``scenario``, ``family`` and ``upstream`` conditions hold on the failure's
minimal counterexample.  A matched failure becomes XFAIL; an invariant that
held although an applicable entry expects it to fail becomes XPASS, which
fails the run when the entry is ``strict``.  Entries that applied yet matched
nothing, or whose invariant now holds, are warnings in the report.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from conformance.ci.expectations.manifest import (
    FORMAT,
    PLACEHOLDER_LINK,
    PLACEHOLDER_REASON,
    Entry,
    Manifest,
    load_manifest,
)
from conformance.ci.expectations.tomlw import dump_manifest
from conformance.report.model import InvariantResult, Report

__all__ = ["apply_expectations", "update_manifest"]


def _judged_release(report: Report) -> str | None:
    """The vLLM release the run judged (its report's ``contract``, ``"vLLM 0.34.0"``)."""
    prefix = "vLLM "
    return report.contract[len(prefix) :] if report.contract.startswith(prefix) else None


def _accepts(values: tuple[str, ...], actual: str | None) -> bool:
    if actual is None:
        return False
    return any(v == actual or (v.endswith("*") and actual.startswith(v[:-1])) for v in values)


def _applies(entry: Entry, device: str, release: str | None) -> bool:
    """Whether the run-level conditions (device, the vLLM release the run judged) hold.

    ``vllm`` is the release whose contract the run judged: for a vLLM-native
    builder the installed one, for a kvref-native builder the one it chose.
    """
    when = entry.when
    if "device" in when and not (
        _accepts(when["device"], device) or _accepts(when["device"], device.partition(":")[0])
    ):
        return False
    return "vllm" not in when or _accepts(when["vllm"], release)


def _matches_failure(entry: Entry, r: InvariantResult) -> bool:
    from conformance.generate.coverage import family_of

    when = entry.when
    if "scenario" in when and not _accepts(when["scenario"], r.scenario):
        return False
    if "family" in when and not _accepts(when["family"], family_of(r.counterexample or "")):
        return False
    if "upstream" in when:
        named = r.upstream or ""
        return any(f"defect {key}:" in named for key in when["upstream"])
    return True


def _as_dict(entry: Entry) -> dict[str, Any]:
    return {
        "id": entry.id,
        "reason": entry.reason,
        "link": entry.link,
        "strict": entry.strict,
        "source": entry.source,
    }


def apply_expectations(report: Report, manifests: Sequence[Manifest]) -> Report:
    """The report with its results judged against ``manifests`` (first matching entry wins).

    Adds a warning per unknown id, per applicable entry that matched nothing,
    and per entry whose invariant now holds.
    """
    from conformance.check.catalog import catalog

    entries = [e for m in manifests for e in m.entries]
    warnings = [w for m in manifests for w in m.unknown_ids(inv.id for inv in catalog())]
    used: set[tuple[str, int]] = set()
    selected = {r.id for r in report.results}
    release = _judged_release(report)
    results = []
    for r in report.results:
        out = r
        for entry in (e for e in entries if e.id == r.id and _applies(e, report.device, release)):
            if r.status in ("fail", "inconclusive", "xfail") and _matches_failure(entry, r):
                out = attrs.evolve(r, status="xfail", expectation=_as_dict(entry))
            elif r.status in ("pass", "xpass"):
                out = attrs.evolve(r, status="xpass", expectation=_as_dict(entry))
                warnings.append(
                    f"{entry.name()}: it held on {r.examples} examples; the entry can go"
                    + (" (strict: this fails the run)" if entry.strict else "")
                )
            else:
                continue
            used.add((entry.source, entry.index))
            break
        results.append(out)
    for e in entries:
        applicable = e.id in selected and _applies(e, report.device, release)
        if applicable and (e.source, e.index) not in used:
            warnings.append(f"{e.name()}: matched no failure of this run")
    return attrs.evolve(report, results=tuple(results), warnings=(*report.warnings, *warnings))


def update_manifest(report: Report, path: Path) -> int:
    """Write or refresh the manifest at ``path`` from ``report``; returns entries added.

    Each unexpected failure (FAIL, INCONCLUSIVE) becomes an entry with a
    placeholder reason and link the vendor must fill in (a run that uses the
    manifest refuses placeholders); existing entries whose invariant held get
    ``now_passes``, and lose it once it fails again.  Entries of invariants
    this run did not select are kept as they were.

    Raises:
        ExpectationsError: ``path`` exists but is no valid manifest.
        OSError: ``path`` cannot be written.
    """
    old = load_manifest(path, allow_placeholders=True).entries if path.exists() else ()
    by_id = {r.id: r for r in report.results}
    today = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d")
    entries: list[dict[str, Any]] = []
    for e in old:
        item: dict[str, Any] = {"id": e.id, "reason": e.reason, "link": e.link}
        item["strict"] = e.strict
        if e.when:
            item["when"] = {k: list(v) for k, v in e.when.items()}
        r = by_id.get(e.id)
        if r is not None and r.status in ("pass", "xpass"):
            item["now_passes"] = (
                f"held on {r.examples} examples on {today} (seed {report.seed}, "
                f"device {report.device}): remove this entry"
            )
        elif r is None and e.now_passes:
            item["now_passes"] = e.now_passes
        entries.append(item)
    covered = {e.id for e in old}
    added = 0
    for r in report.results:
        if r.status in ("fail", "inconclusive") and r.id not in covered:
            entries.append(
                {
                    "id": r.id,
                    "reason": PLACEHOLDER_REASON,
                    "link": PLACEHOLDER_LINK,
                    "strict": False,
                }
            )
            added += 1
    path.write_text(dump_manifest(FORMAT, entries), encoding="utf-8")
    return added
