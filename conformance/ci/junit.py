"""The JUnit XML file (``--junit``): valid against Jenkins xunit's junit-10.xsd and Ant's schema.

The two schemas CI servers validate against disagree, so the file keeps to
what both accept (tests/data/junit-10.xsd and tests/data/ant-junit.xsd
reproduce their structure):

- ``testsuites`` carries no attributes (Ant's aggregated layout allows none;
  Jenkins' has no ``skipped``); its one ``testsuite`` carries the totals with
  ``package``, ``id``, ``timestamp`` (UTC, no zone suffix, as Ant requires)
  and ``hostname``;
- the suite holds ``properties``, the test cases, then ``system-out`` and
  ``system-err`` (Ant requires all three, in that order);
- a ``testcase`` has ``name``, ``classname`` and ``time`` and at most one
  child: ``failure``, ``error`` (each with a ``type``) or ``skipped``; no
  ``status`` attribute (neither schema has one): each case's verdict is in the
  ``verdicts`` property and in its child's message, and XPASS notes, which a
  case cannot carry in Ant's layout, are in the suite's ``system-out``.

``time`` is the time spent on that invariant alone (:mod:`conformance.run.timing`);
the observations an invariant's scenario shares with others are in the
``observe_seconds.<scenario>`` properties, and the suite's ``time`` is the
run's wall time.
"""

from __future__ import annotations

import datetime as _dt
import socket
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path

from conformance.report.model import InvariantResult, Report
from conformance.report.render import (
    _MARK,
    INCOMPLETE_REASON,
    RunStart,
    _clean,
    _finding,
    _kit_version,
)

__all__ = ["add_suite", "write_incomplete_junit", "write_junit", "write_junit_suites"]

_CLASSNAME = "kvref.conformance"


def _timestamp(seconds_ago: float = 0.0) -> str:
    now = _dt.datetime.now(_dt.timezone.utc) - _dt.timedelta(seconds=seconds_ago)
    return now.strftime("%Y-%m-%dT%H:%M:%S")


def _hostname() -> str:
    # Ant requires a non-empty token and says to write 'localhost' when it is unknown.
    return "".join(socket.gethostname().split()) or "localhost"


def _suite(
    name: str,
    counts: dict[str, int],
    seconds: float,
    timestamp: str,
    suites: ET.Element | None = None,
    index: int = 0,
) -> tuple[ET.Element, ET.Element]:
    suites = ET.Element("testsuites") if suites is None else suites
    attrs = {
        "name": name,
        "package": _CLASSNAME,
        "id": str(index),
        "timestamp": timestamp,
        "hostname": _hostname(),
        **{k: str(v) for k, v in counts.items()},
        "time": f"{seconds:.3f}",
    }
    return suites, ET.SubElement(suites, "testsuite", attrs)


def _properties(suite: ET.Element, pairs: list[tuple[str, object]]) -> None:
    props = ET.SubElement(suite, "properties")
    for key, value in pairs:
        ET.SubElement(props, "property", name=key, value=_clean(str(value)))


def _run_properties(run: RunStart | Report) -> list[tuple[str, object]]:
    """The properties a suite starts with, whether its run completed or not: what ran, how."""
    return [
        ("builder", run.builder),
        ("seed", run.seed),
        ("device", run.device),
        ("profile", run.profile),
        ("max_examples", run.max_examples),
        ("kit_version", _kit_version()),
        ("contract", run.contract),
    ]


def _write(suites: ET.Element, path: Path) -> None:
    with path.open("wb") as out:
        ET.ElementTree(suites).write(out, encoding="utf-8", xml_declaration=True)


def write_incomplete_junit(start: RunStart, path: Path) -> None:
    """Write a JUnit file with one ``error`` case saying the run is incomplete.

    Raises:
        OSError: ``path`` cannot be opened for writing.
    """
    name = _clean(f"kvref-conformance {start.builder}")
    counts = {"tests": 1, "failures": 0, "errors": 1, "skipped": 0}
    suites, suite = _suite(name, counts, 0.0, _timestamp())
    _properties(
        suite,
        [
            *_run_properties(start),
            ("ok", False),
            ("complete", False),
            ("verdicts", "run=incomplete"),
        ],
    )
    case = ET.SubElement(suite, "testcase", classname=_CLASSNAME, name="run", time="0.000")
    ET.SubElement(
        case, "error", message=INCOMPLETE_REASON, type="incomplete"
    ).text = INCOMPLETE_REASON
    ET.SubElement(suite, "system-out").text = INCOMPLETE_REASON
    ET.SubElement(suite, "system-err").text = ""
    _write(suites, path)


def write_junit(report: Report, path: Path) -> None:
    """Write the report as JUnit XML: one test case per invariant (layout: module docstring).

    FAIL is a ``failure``, and so is the XPASS of a strict expectation;
    INCONCLUSIVE is an ``error`` (the run could not judge it); N/A, SKIP and
    XFAIL are ``skipped`` with their reason and, for XFAIL, the finding; an
    XPASS that is not strict passes, with its note in the suite's
    ``system-out``.  Control characters and terminal escapes, which XML 1.0
    cannot carry, are stripped.
    """
    write_junit_suites([report], path)


def write_junit_suites(reports: Sequence[Report], path: Path, *, by_release: bool = False) -> None:
    """Write several reports as one JUnit file, a ``testsuite`` each (:func:`write_junit`'s).

    ``by_release``: each suite's name also names the vLLM release its run
    judged (a compatibility matrix, :mod:`conformance.ci.matrix`).
    """
    suites = ET.Element("testsuites")
    for index, report in enumerate(reports):
        add_suite(suites, report, index, by_release=by_release)
    _write(suites, path)


def add_suite(
    suites: ET.Element, report: Report, index: int = 0, *, by_release: bool = False
) -> ET.Element:
    """Add ``report``'s ``testsuite`` (id ``index``) to ``suites``, and return it."""
    counts = {
        "tests": len(report.results),
        "failures": len(report.by_status("fail")) + sum(r.strict_xpass for r in report.results),
        "errors": len(report.by_status("inconclusive")),
        "skipped": sum(len(report.by_status(s)) for s in ("not-applicable", "skipped", "xfail")),
    }
    started = report.started or _timestamp(report.seconds)
    name = f"kvref-conformance {report.builder}"
    if by_release:
        name += f" ({report.contract})"
    _, suite = _suite(_clean(name), counts, report.seconds, started, suites, index)
    _properties(
        suite,
        [
            *_run_properties(report),
            ("ok", report.ok),
            ("complete", True),
            ("interrupted", report.interrupted),
            ("xpass", ",".join(r.id for r in report.by_status("xpass"))),
            ("verdicts", ",".join(f"{r.id}={r.status}" for r in report.results)),
            *((f"observe_seconds.{s}", f"{t:.3f}") for s, t in report.observe_seconds.items()),
        ],
    )
    notes: list[str] = []
    for r in report.results:
        _case(suite, r)
        if r.status == "xpass":
            notes += _finding(r)
    if report.reach:
        notes += ["", *report.reach.get("lines", [])]
    notes += [f"warning: {w}" for w in report.warnings]
    ET.SubElement(suite, "system-out").text = _clean("\n".join(notes).strip())
    # What the builder printed in its worker, marked so it never passes for the kit's words.
    ET.SubElement(suite, "system-err").text = _clean(
        "\n".join(f"| {line}" for line in report.builder_output.splitlines())
    )
    return suite


def _case(suite: ET.Element, r: InvariantResult) -> None:
    case = ET.SubElement(
        suite, "testcase", classname=_CLASSNAME, name=r.id, time=f"{r.seconds:.3f}"
    )
    detail = _clean("\n".join(_finding(r)))
    if r.status == "fail":
        ET.SubElement(case, "failure", message=_clean(r.title), type=r.id).text = detail
    elif r.strict_xpass:
        message = f"XPASS (strict): {r.id} held, yet its expectation says it fails"
        ET.SubElement(case, "failure", message=message, type="xpass-strict").text = detail
    elif r.status == "inconclusive":
        ET.SubElement(
            case, "error", message=_clean(f"INCONCLUSIVE: {r.reason}"), type="inconclusive"
        ).text = detail
    elif r.status == "xfail":
        ET.SubElement(
            case, "skipped", message=_clean(f"XFAIL: {r.reason or r.title}")
        ).text = detail
    elif r.status in ("not-applicable", "skipped"):
        ET.SubElement(case, "skipped", message=_clean(f"{_MARK[r.status]}: {r.reason}"))
