"""The compatibility matrix: one builder judged under every supported vLLM release.

``kvref-conformance BUILDER --vllm all`` (or :func:`check_matrix`) runs the
selected invariants once per supported release (:mod:`kvref.versions`) and
reports one verdict per invariant per release, so a vendor sees at a glance
which vLLM releases the builder is good for.

A release that cannot judge the builder here is *not judged*, with the
reason, never a pass: a vLLM-native builder runs vLLM's own code, so only the
installed release can judge it (run the kit again where another release is
installed).  The matrix is OK when every release judged the builder and
each run is OK; a release left unjudged is not OK, as an invariant no
example judged is not a pass.

Outputs: the text table (:func:`format_matrix`), JSON
(:func:`matrix_to_dict`, ``format`` ``kvref-matrix/1``, schema
``conformance/report/matrix.schema.json``; each release's full report is
inside), JUnit (a ``testsuite`` per judged release), Markdown and HTML.
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs

from conformance.errors import OptionError
from conformance.report.model import Report
from kvref.versions import SUPPORTED, VllmVersion

__all__ = [
    "MATRIX_FORMAT",
    "Matrix",
    "check_matrix",
    "format_matrix",
    "matrix_markdown",
    "matrix_schema_path",
    "matrix_to_dict",
    "write_matrix_files",
]

#: The ``format`` of :func:`matrix_to_dict`'s data.
MATRIX_FORMAT = "kvref-matrix/1"
#: The status a release shows for every invariant when it could not judge the builder.
NOT_JUDGED = "not-judged"


@attrs.frozen
class Matrix:
    """One builder under every supported release.

    Attributes:
        builder: the builder's name.
        reports: each release's report, oldest release first (``None``: not judged).
        reasons: why a release did not judge the builder, by release.
    """

    builder: str
    reports: tuple[tuple[VllmVersion, Report | None], ...]
    reasons: Mapping[VllmVersion, str] = attrs.field(factory=dict)

    @property
    def ok(self) -> bool:
        """Whether every release judged the builder and each run is OK."""
        return all(r is not None and r.ok for _, r in self.reports)

    @property
    def judged(self) -> tuple[Report, ...]:
        """The reports of the releases that judged the builder."""
        return tuple(r for _, r in self.reports if r is not None)

    def invariants(self) -> list[tuple[str, str]]:
        """``(id, title)`` of every invariant any release judged, in catalog order."""
        seen: dict[str, str] = {}
        for report in self.judged:
            for r in report.results:
                seen.setdefault(r.id, r.title)
        return list(seen.items())

    def status(self, version: VllmVersion, invariant: str) -> str:
        """The status of ``invariant`` under ``version`` (``not-judged``; ``-``: not selected)."""
        report = dict(self.reports)[version]
        if report is None:
            return NOT_JUDGED
        try:
            return report.result(invariant).status
        except KeyError:
            return "-"


def check_matrix(
    builder: Any,
    options: Any = None,
    *,
    run: Callable[..., Report] | None = None,
    **overrides: Any,
) -> Matrix:
    """Judge ``builder`` under every supported release (``check_builder`` once per release).

    ``options`` and ``overrides`` are ``check_builder``'s; ``vllm`` is set per
    release.  A release that refuses the builder for what this environment
    holds (a vLLM-native builder under a release other than the installed
    one) is recorded as not judged, with the refusal.

    Raises:
        OptionError: an option is unusable whatever the release.
    """
    if run is None:
        from conformance.run.runner import check_builder

        run = check_builder
    reports: list[tuple[VllmVersion, Report | None]] = []
    reasons: dict[VllmVersion, str] = {}
    for version in SUPPORTED:
        try:
            report = run(builder, options, **{**overrides, "vllm": str(version)})
        except OptionError as exc:
            if "vLLM-native builder" not in str(exc):
                raise
            reports.append((version, None))
            reasons[version] = str(exc)
            continue
        reports.append((version, report))
    name = next((r.builder for _, r in reports if r is not None), str(builder))
    return Matrix(builder=name, reports=tuple(reports), reasons=reasons)


_SHORT = {
    "pass": "PASS",
    "fail": "FAIL",
    "inconclusive": "INCONCL",
    "not-applicable": "N/A",
    "skipped": "SKIP",
    "xfail": "XFAIL",
    "xpass": "XPASS",
    NOT_JUDGED: "not judged",
    "-": "-",
}


def format_matrix(matrix: Matrix) -> str:
    """The matrix as text: an invariant a row, a release a column, then each release's verdict."""
    versions = [v for v, _ in matrix.reports]
    head = f"{'invariant':28} " + " ".join(f"{'vLLM ' + str(v):>12}" for v in versions)
    lines = [f"kvref-conformance compatibility matrix: builder {matrix.builder}", "", head]
    lines.append(f"{'-' * 28} " + " ".join("-" * 12 for _ in versions))
    for ident, _title in matrix.invariants():
        cells = " ".join(f"{_SHORT.get(matrix.status(v, ident), '?'):>12}" for v in versions)
        lines.append(f"{ident:28} {cells}")
    lines.append("")
    for version, report in matrix.reports:
        if report is None:
            lines.append(f"vLLM {version}: NOT JUDGED: {matrix.reasons.get(version, '')}")
        else:
            failing = ", ".join(sorted(report.failing_ids)) or "none"
            verdict = "OK" if report.ok else f"FAILED: {failing}"
            lines.append(f"vLLM {version}: {verdict}")
    lines.append("")
    lines.append("OK: every release judged the builder and held" if matrix.ok else "NOT OK")
    return "\n".join(lines)


def matrix_to_dict(matrix: Matrix) -> dict[str, Any]:
    """The matrix as JSON-able data (``kvref-matrix/1``, ``matrix.schema.json``)."""
    from conformance.report.render import report_to_dict

    versions = [str(v) for v, _ in matrix.reports]
    return {
        "format": MATRIX_FORMAT,
        "builder": matrix.builder,
        "ok": matrix.ok,
        "versions": versions,
        "verdicts": {
            ident: {str(v): matrix.status(v, ident) for v, _ in matrix.reports}
            for ident, _ in matrix.invariants()
        },
        "not_judged": {str(v): why for v, why in matrix.reasons.items()},
        "reports": {str(v): None if r is None else report_to_dict(r) for v, r in matrix.reports},
    }


def matrix_markdown(matrix: Matrix) -> str:
    """The matrix as a Markdown table (for a CI job summary)."""
    versions = [v for v, _ in matrix.reports]
    out = [
        f"### kvref-conformance compatibility matrix: `{_md(matrix.builder)}`",
        "",
        "| invariant | " + " | ".join(f"vLLM {v}" for v in versions) + " |",
        "|---|" + "---|" * len(versions),
    ]
    for ident, _ in matrix.invariants():
        cells = " | ".join(_SHORT.get(matrix.status(v, ident), "?") for v in versions)
        out.append(f"| `{ident}` | {cells} |")
    out.append("")
    for version, report in matrix.reports:
        verdict = (
            f"not judged: {_md(matrix.reasons.get(version, ''))}"
            if report is None
            else ("OK" if report.ok else "FAILED")
        )
        out.append(f"- vLLM {version}: {verdict}")
    return "\n".join(out) + "\n"


def _md(text: str) -> str:
    # A builder's name or a refusal never carries markup into the summary.
    return html.escape(text).replace("|", "\\|").replace("`", "'")


def matrix_html(matrix: Matrix) -> str:
    """The matrix as a self-contained HTML page."""
    versions = [v for v, _ in matrix.reports]
    e = html.escape

    def cell(status: str) -> str:
        return f'<td class="{e(status)}">{e(_SHORT.get(status, "?"))}</td>'

    rows = "".join(
        f"<tr><td><code>{e(ident)}</code></td>"
        + "".join(cell(matrix.status(v, ident)) for v in versions)
        + "</tr>"
        for ident, _ in matrix.invariants()
    )
    notes = "".join(
        f"<li>vLLM {e(str(v))}: "
        + (
            f"not judged: {e(matrix.reasons.get(v, ''))}"
            if r is None
            else ("OK" if r.ok else "FAILED: " + e(", ".join(sorted(r.failing_ids))))
        )
        + "</li>"
        for v, r in matrix.reports
    )
    return (
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>kvref-conformance matrix</title>"
        "<style>td,th{padding:2px 8px}.fail,.inconclusive,.not-judged{background:#fcc}"
        ".pass{background:#cfc}</style></head><body>"
        f"<h1>Compatibility matrix: <code>{e(matrix.builder)}</code></h1>"
        "<table><tr><th>invariant</th>"
        + "".join(f"<th>vLLM {e(str(v))}</th>" for v in versions)
        + f"</tr>{rows}</table><ul>{notes}</ul>"
        f"<p>{'OK' if matrix.ok else 'NOT OK'}</p></body></html>\n"
    )


def matrix_schema_path() -> Path:
    """The JSON schema of :func:`matrix_to_dict`'s data."""
    return Path(__file__).parent.parent / "report" / "matrix.schema.json"


def write_matrix_files(
    matrix: Matrix,
    *,
    json_path: Path | None = None,
    junit: Path | None = None,
    markdown: Path | None = None,
    html_path: Path | None = None,
) -> list[str]:
    """Write the matrix's files; returns an error line per file that could not be written."""
    from conformance.ci.junit import write_junit_suites

    writers: list[tuple[Path | None, Callable[[Path], object]]] = [
        (
            json_path,
            lambda p: p.write_text(json.dumps(matrix_to_dict(matrix), indent=2), "utf-8"),
        ),
        (junit, lambda p: write_junit_suites(matrix.judged, p, by_release=True)),
        (markdown, lambda p: p.write_text(matrix_markdown(matrix), "utf-8")),
        (html_path, lambda p: p.write_text(matrix_html(matrix), "utf-8")),
    ]
    errors = []
    for path, write in writers:
        if path is None:
            continue
        try:
            write(path)
        except OSError as exc:
            errors.append(f"cannot write {path}: {exc.strerror or exc}")
    return errors
