"""Render a :class:`~conformance.report.model.Report` (text, JSON)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import attrs

from conformance.contract import CONTRACT
from conformance.report.model import STATUSES, InvariantResult, Report
from conformance.report.trust import evidence, trust_lines

__all__ = [
    "JSON_SCHEMA_VERSION",
    "INCOMPLETE_REASON",
    "RunStart",
    "format_header",
    "format_report",
    "incomplete_report_dict",
    "json_schema_path",
    "report_to_dict",
    "write_incomplete_json",
    "write_json",
]

#: Version of the JSON report's layout (``conformance/report/report.schema.json``).
JSON_SCHEMA_VERSION = 1

_MARK = {
    "pass": "PASS",
    "fail": "FAIL",
    "inconclusive": "INCONCLUSIVE",
    "not-applicable": "N/A",
    "skipped": "SKIP",
    "xfail": "XFAIL",
    "xpass": "XPASS",
}
# XML 1.0 forbids most control characters; ANSI colours in an error message
# would make the JUnit file unreadable.
_ANSI = re.compile(r"\x1b(?:\[[0-9;?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\))")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ud800-\udfff\ufffe\uffff]")


def _kit_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kvref")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "unknown"


@attrs.frozen(kw_only=True)
class RunStart:
    """What is known of a run before its first example: its header and incomplete outputs.

    Attributes:
        builder: the builder's importable name.
        device: the torch device of the device checks.
        seed: the run's seed (resolved: a random seed is drawn before the run).
        profile: the Hypothesis profile.
        max_examples: examples per scenario.
        options: the other options that shape the run, as command-line words.
        contract: the vLLM contract the run judges (``"vLLM 0.34.0"``).
    """

    builder: str
    device: str
    seed: int
    profile: str
    max_examples: int
    options: tuple[str, ...] = ()
    contract: str = CONTRACT


def format_header(start: RunStart) -> str:
    """The report's first line (and, with options, a second naming them).

    The CLI prints it before the first example, so a run killed before its
    report still shows what reruns it.
    """
    line = (
        f"kvref-conformance {_kit_version()} ({start.contract} contract): "
        f"builder {start.builder} on {start.device}, "
        f"profile {start.profile}, {start.max_examples} examples per scenario, "
        f"seed {start.seed}"
    )
    if start.options:
        line += "\noptions: " + " ".join(start.options)
    return line


def format_report(report: Report, *, header: bool = True) -> str:
    """The human-readable report: header, one row per invariant, then each finding.

    ``header=False`` leaves the header out (the CLI printed it before the run).
    Terminal escapes and control characters are dropped.
    """
    start = RunStart(
        builder=report.builder,
        device=report.device,
        seed=report.seed,
        profile=report.profile,
        max_examples=report.max_examples,
        contract=report.contract,
    )
    lines = [format_header(start), ""] if header else []
    lines += [
        f"{'invariant':28} {'status':12} {'examples':>8}  title",
        f"{'-' * 28} {'-' * 12} {'-' * 8}  {'-' * 40}",
    ]
    for r in report.results:
        lines.append(f"{r.id:28} {_MARK[r.status]:12} {r.examples:>8}  {r.title}")
    counts = {s: len(report.by_status(s)) for s in STATUSES}
    summary = ", ".join(f"{n} {_MARK[s].lower()}" for s, n in counts.items() if n)
    lines += ["", f"{summary} in {report.seconds:.1f}s"]
    if report.interrupted:
        lines.append("INTERRUPTED: the run was stopped; what it did not reach is inconclusive")
    unjudged = [
        r for r in report.results if r.status in ("inconclusive", "not-applicable", "skipped")
    ]
    if unjudged:
        lines += ["", "Not judged:"]
        lines += [f"  {r.id} ({_MARK[r.status]}): {r.reason}" for r in unjudged]
    lines += _sections(report)
    for r in report.results:
        if r.status in ("fail", "xfail", "xpass"):
            lines += ["", *_finding(r)]
    if report.builder_output:
        # Every line marked: what the builder printed can never pass for the kit's report.
        lines += ["", "Builder output (its worker's stdout and stderr, the last 64 KiB):"]
        lines += [f"  | {line}" for line in report.builder_output.splitlines()]
    if report.baseline:
        b = report.baseline
        lines += ["", f"Baseline {b['path']} (only new failures fail the run):"]
        lines += [
            f"  {k}: {', '.join(b.get(k, ())) or 'none'}"
            for k in ("new", "fixed", "unchanged", "expected")
        ]
    lines += trust_lines(
        [r.id for r in report.results], report.containment, reach=bool(report.reach)
    )
    lines += [
        "",
        "OK" if report.ok else f"FAILED: {', '.join(sorted(report.failing_ids)) or 'reach'}",
    ]
    # What the builder wrote (messages, its output) reaches a terminal as text:
    # no colour, cursor or carriage-return trick can rewrite the kit's lines.
    return _clean("\n".join(lines)).replace("\r", "")


def _sections(report: Report) -> list[str]:
    """The extensions' sections (waste, reach, ...): each extension renders its own fields."""
    # Through their registry alone: the core never names an extension.
    from conformance.extensions.base import render
    from conformance.extensions.registry import extensions

    return render(extensions(), report)


def _finding(r: InvariantResult) -> list[str]:
    lines = [f"{_MARK[r.status]} {r.id}: {r.title} ({r.reference})"]
    if r.expectation:
        e = r.expectation
        strict = ", strict" if e["strict"] else ""
        lines.append(f"  expected ({e['source']}{strict}): {e['reason']} [{e['link']}]")
    if r.status == "xpass":
        fails = " (strict: this fails the run)" if r.strict_xpass else ""
        return [
            *lines,
            f"  listed as expected to fail, but it held on all {r.examples} examples that "
            f"judged it{fails}; take it off the xfail list or expectations manifest",
        ]
    if r.reason and not r.violations:
        lines.append(f"  not judged: {r.reason}")
    lines += [f"  - {v}" for v in r.violations]
    if r.inherited:
        lines.append(f"  inherited: {r.inherited}")
    if r.upstream:
        lines.append(f"  upstream: {r.upstream}")
    if r.counterexample:
        lines.append(f"  minimal counterexample ({r.scenario} scenario): {r.counterexample}")
    if r.counterexample_python:
        lines.append("  as Python:")
        lines += [f"    {line}" for line in r.counterexample_python.rstrip().splitlines()]
    if r.replays is not None and r.replays.runs:
        lines.append(
            f"  replayed {r.replays.runs} times: failed {r.replays.failed}: {r.replays.verdict}"
        )
    if r.reproduce:
        lines.append(f"  reproduce: {r.reproduce}")
    return lines


def report_to_dict(report: Report) -> dict[str, Any]:
    """The report as plain JSON-able data, in the layout of ``report.schema.json``."""
    data = attrs.asdict(report, recurse=True)
    data["schema_version"] = JSON_SCHEMA_VERSION
    for result in data["results"]:
        # What the verdict rests on: the judge's own checks, or the builder's process.
        result["evidence"] = evidence(result["id"])
    data["kit_version"] = _kit_version()
    data["ok"] = report.ok
    data["complete"] = True
    data["incomplete_reason"] = None
    return data


#: Why an incomplete output says it is incomplete.
INCOMPLETE_REASON = (
    "INCOMPLETE: the run had not ended when this file was written (it is still running, "
    "or was killed before it could write its report); no verdict"
)


def incomplete_report_dict(start: RunStart) -> dict[str, Any]:
    """The JSON a run writes where its report will go, before its first example.

    Valid against ``report.schema.json`` with ``complete: false`` and
    ``ok: false`` and no results: a killed run leaves this, never a stale
    report of an earlier run.
    """
    return {
        "schema_version": JSON_SCHEMA_VERSION,
        "kit_version": _kit_version(),
        "contract": start.contract,
        "builder": start.builder,
        "device": start.device,
        "seed": start.seed,
        "profile": start.profile,
        "max_examples": start.max_examples,
        "results": [],
        "seconds": 0.0,
        "options": {
            "builder": start.builder,
            "device": start.device,
            "seed": start.seed,
            "profile": start.profile,
            "max_examples": start.max_examples,
        },
        "coverage": {},
        "reach": None,
        "interrupted": False,
        "waste": None,
        "ok": False,
        "complete": False,
        "incomplete_reason": INCOMPLETE_REASON,
    }


def write_incomplete_json(start: RunStart, path: Path) -> None:
    """Write :func:`incomplete_report_dict` to ``path`` (the final report overwrites it).

    Raises:
        OSError: ``path`` cannot be opened for writing.
    """
    with path.open("w", encoding="utf-8") as out:
        out.write(json.dumps(incomplete_report_dict(start), indent=2))


def json_schema_path() -> Path:
    """The JSON Schema (draft 2020-12) of the files :func:`write_json` writes."""
    return Path(__file__).with_name("report.schema.json")


def write_json(report: Report, path: Path) -> None:
    """Write :func:`report_to_dict` to ``path`` (UTF-8, layout of :func:`json_schema_path`)."""
    path.write_text(json.dumps(report_to_dict(report), indent=2, default=str), encoding="utf-8")


def _clean(text: str) -> str:
    return _CONTROL.sub("", _ANSI.sub("", text))
