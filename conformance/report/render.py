"""Render a :class:`~conformance.report.model.Report`: text table, JSON, JUnit XML; read xfail files."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import attrs

from conformance.report.model import STATUSES, InvariantResult, Report

__all__ = [
    "JSON_SCHEMA_VERSION",
    "XfailFileError",
    "format_report",
    "read_xfail_file",
    "report_to_dict",
    "write_json",
    "write_junit",
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
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ud800-\udfff\ufffe\uffff]")


class XfailFileError(ValueError):
    """An xfail file cannot be read as text."""


def read_xfail_file(path: Path) -> list[str]:
    """Invariant ids of an xfail file: one per line, ``#`` starts a comment.

    Raises:
        XfailFileError: the file cannot be read or is not UTF-8 text.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise XfailFileError(f"cannot read xfail file {str(path)!r}: {exc}") from None
    ids = []
    for line in text.splitlines():
        entry = line.split("#", 1)[0].strip()
        if entry:
            ids.append(entry.upper())
    return ids


def _kit_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kvref")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "unknown"


def format_report(report: Report) -> str:
    """The human-readable report: header, one row per invariant, then each finding."""
    lines = [
        f"kvref-conformance {_kit_version()}: builder {report.builder} on {report.device}, "
        f"profile {report.profile}, {report.max_examples} examples per scenario, "
        f"seed {report.seed}",
        "",
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
    if report.reach:
        lines += ["", *report.reach.get("lines", [])]
    for r in report.results:
        if r.status in ("fail", "xfail", "xpass"):
            lines += ["", *_finding(r)]
    lines += [
        "",
        "OK" if report.ok else f"FAILED: {', '.join(sorted(report.failing_ids)) or 'reach'}",
    ]
    return "\n".join(lines)


def _finding(r: InvariantResult) -> list[str]:
    lines = [f"{_MARK[r.status]} {r.id}: {r.title} ({r.reference})"]
    if r.status == "xpass":
        return [*lines, "  listed as expected to fail, but it held on every example"]
    if r.reason and not r.violations:
        lines.append(f"  not judged: {r.reason}")
    lines += [f"  - {v}" for v in r.violations]
    if r.inherited:
        lines.append(f"  inherited: {r.inherited}")
    if r.counterexample:
        lines.append(f"  minimal counterexample ({r.scenario} scenario): {r.counterexample}")
    if r.counterexample_python:
        lines.append("  as Python:")
        lines += [f"    {line}" for line in r.counterexample_python.rstrip().splitlines()]
    if r.reproduce:
        lines.append(f"  reproduce: {r.reproduce}")
    return lines


def report_to_dict(report: Report) -> dict[str, Any]:
    """The report as plain JSON-able data, in the layout of ``report.schema.json``."""
    data = attrs.asdict(report, recurse=True)
    data["schema_version"] = JSON_SCHEMA_VERSION
    data["kit_version"] = _kit_version()
    data["ok"] = report.ok
    return data


def write_json(report: Report, path: Path) -> None:
    """Write :func:`report_to_dict` to ``path``."""
    path.write_text(json.dumps(report_to_dict(report), indent=2, default=str))


def _clean(text: str) -> str:
    return _CONTROL.sub("", _ANSI.sub("", text))


def write_junit(report: Report, path: Path) -> None:
    """Write the report as JUnit XML: one test case per invariant.

    FAIL is a ``failure``; INCONCLUSIVE is an ``error`` (the run could not
    judge it); N/A, SKIP and XFAIL are ``skipped`` with their details; XPASS
    passes with its note in ``system-out``.
    """
    errors = [r for r in report.results if r.status == "inconclusive"]
    skipped = [r for r in report.results if r.status in ("not-applicable", "skipped", "xfail")]
    suites = ET.Element("testsuites")
    suite = ET.SubElement(
        suites,
        "testsuite",
        name=_clean(f"kvref-conformance {report.builder}"),
        tests=str(len(report.results)),
        failures=str(len(report.by_status("fail"))),
        errors=str(len(errors)),
        skipped=str(len(skipped)),
        time=f"{report.seconds:.3f}",
    )
    props = ET.SubElement(suite, "properties")
    for key, value in (
        ("seed", report.seed),
        ("device", report.device),
        ("profile", report.profile),
    ):
        ET.SubElement(props, "property", name=key, value=_clean(str(value)))
    for r in report.results:
        case = ET.SubElement(suite, "testcase", classname="kvref.conformance", name=r.id, time="0")
        detail = _clean("\n".join(_finding(r)))
        if r.status == "fail":
            ET.SubElement(case, "failure", message=_clean(r.title), type=r.id).text = detail
        elif r.status == "inconclusive":
            ET.SubElement(
                case, "error", message=_clean(f"not judged: {r.reason}"), type="inconclusive"
            ).text = detail
        elif r.status == "xfail":
            ET.SubElement(
                case, "skipped", message=_clean(f"XFAIL: {r.reason or r.title}")
            ).text = detail
        elif r.status in ("not-applicable", "skipped"):
            ET.SubElement(case, "skipped", message=_clean(f"{_MARK[r.status]}: {r.reason}"))
        elif r.status == "xpass":
            ET.SubElement(case, "system-out").text = detail
    if report.reach:
        ET.SubElement(suite, "system-out").text = _clean("\n".join(report.reach.get("lines", [])))
    ET.ElementTree(suites).write(path, encoding="utf-8", xml_declaration=True)
