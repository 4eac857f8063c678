"""Render a :class:`~conformance.runner.Report`: text table, JSON, JUnit XML; read xfail files."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import attrs

from conformance.runner import Report

__all__ = ["format_report", "read_xfail_file", "report_to_dict", "write_json", "write_junit"]

_MARK = {
    "pass": "PASS",
    "fail": "FAIL",
    "xfail": "XFAIL",
    "xpass": "XPASS",
    "skipped": "SKIP",
    "not-checked": "NOT CHECKED",
}


def read_xfail_file(path: Path) -> list[str]:
    """Invariant ids of an xfail file: one per line, ``#`` starts a comment."""
    ids = []
    for line in path.read_text().splitlines():
        entry = line.split("#", 1)[0].strip()
        if entry:
            ids.append(entry.upper())
    return ids


def format_report(report: Report) -> str:
    """The human-readable report: header, one row per invariant, then each failure."""
    lines = [
        f"kvref-conformance: builder {report.builder} on {report.device}, profile "
        f"{report.profile}, {report.max_examples} examples per scenario, seed {report.seed}",
        "",
        f"{'invariant':28} {'status':12} {'examples':>8}  title",
        f"{'-' * 28} {'-' * 12} {'-' * 8}  {'-' * 40}",
    ]
    for r in report.results:
        lines.append(f"{r.id:28} {_MARK[r.status]:12} {r.examples:>8}  {r.title}")
    counts = {s: len(report.by_status(s)) for s in _MARK}
    summary = ", ".join(f"{n} {_MARK[s].lower()}" for s, n in counts.items() if n)
    lines += ["", f"{summary} in {report.seconds:.1f}s"]
    not_checked = [r for r in report.results if r.status in ("skipped", "not-checked")]
    if not_checked:
        lines += ["", "Not checked:"]
        lines += [f"  {r.id}: {r.reason}" for r in not_checked]
    for r in report.results:
        if r.status not in ("fail", "xfail"):
            continue
        lines += ["", f"{_MARK[r.status]} {r.id}: {r.title} (SPEC {r.spec})"]
        lines += [f"  - {v}" for v in r.violations]
        if r.counterexample:
            lines.append(f"  minimal counterexample: {r.counterexample}")
        if r.reproduce:
            lines.append(f"  reproduce: {r.reproduce}")
    lines += ["", "OK" if report.ok else f"FAILED: {', '.join(sorted(report.failed_ids))}"]
    return "\n".join(lines)


def report_to_dict(report: Report) -> dict[str, Any]:
    """The report as plain JSON-able data."""
    data = attrs.asdict(report, recurse=True)
    data["ok"] = report.ok
    return data


def write_json(report: Report, path: Path) -> None:
    """Write :func:`report_to_dict` to ``path``."""
    path.write_text(json.dumps(report_to_dict(report), indent=2, default=str))


def write_junit(report: Report, path: Path) -> None:
    """Write the report as JUnit XML: one test case per invariant."""
    suite = ET.Element(
        "testsuite",
        name=f"kvref-conformance {report.builder}",
        tests=str(len(report.results)),
        failures=str(len(report.failures)),
        skipped=str(sum(r.status in ("skipped", "not-checked", "xfail") for r in report.results)),
        time=f"{report.seconds:.3f}",
    )
    for r in report.results:
        case = ET.SubElement(suite, "testcase", classname="kvref.conformance", name=r.id)
        if r.status == "fail":
            failure = ET.SubElement(case, "failure", message=r.title)
            failure.text = "\n".join(
                [str(v) for v in r.violations]
                + [f"counterexample: {r.counterexample}", f"reproduce: {r.reproduce}"]
            )
        elif r.status in ("skipped", "not-checked", "xfail"):
            ET.SubElement(case, "skipped", message=r.reason or r.status)
    ET.ElementTree(suite).write(path, encoding="utf-8", xml_declaration=True)
