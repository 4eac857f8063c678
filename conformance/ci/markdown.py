"""The Markdown summary of a run (``--markdown FILE``, or ``$GITHUB_STEP_SUMMARY``).

GitHub renders the file on the workflow run's page: the verdict table, each
failure with its minimal counterexample and reproduce line, the upstream
vLLM defects the failures match, the baseline comparison, reach and the
expectations manifest's warnings.
"""

from __future__ import annotations

import os
from pathlib import Path

from conformance.report.model import STATUSES, InvariantResult, Report
from conformance.report.render import _MARK, _clean, _kit_version

__all__ = ["format_markdown", "summary_paths", "write_markdown"]


def _cell(text: object) -> str:
    # A table cell is one line; a pipe would end it.  What the builder wrote is
    # text: raw HTML in a summary would render (a fake "OK", an image), so it
    # is escaped, and terminal escapes are dropped.
    cleaned = _clean(str(text)).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    one_line = cleaned.replace("\r", " ").replace("\n", " ")
    return one_line.replace("\\", "\\\\").replace("|", "\\|")


def _code(text: str) -> str:
    return "`" + _clean(text).replace("`", "'").replace("\n", " ").replace("\r", " ") + "`"


def _fenced(text: str) -> str:
    """``text`` for a fenced block: no terminal escapes, and no fence of its own to end it."""
    return _clean(text).replace("\r", "").replace("```", "'''")


def format_markdown(report: Report) -> str:
    """The summary as GitHub-flavoured Markdown."""
    verdict = "OK" if report.ok else "FAILED"
    lines = [
        f"## kvref-conformance: {verdict}",
        "",
        f"Builder {_code(report.builder)} on {_code(report.device)}, profile "
        f"{report.profile}, {report.max_examples} examples per scenario, seed "
        f"{report.seed}, kit {_kit_version()} ({report.contract} contract), "
        f"{report.seconds:.1f}s" + (" (**interrupted**)" if report.interrupted else ""),
        "",
        "| invariant | verdict | examples | seconds | title |",
        "|---|---|---:|---:|---|",
    ]
    for r in report.results:
        mark = _MARK[r.status] + (" (strict)" if r.strict_xpass else "")
        lines.append(
            f"| {_cell(r.id)} | {mark} | {r.examples} | {r.seconds:.2f} | {_cell(r.title)} |"
        )
    counts = ", ".join(
        f"{n} {_MARK[s].lower()}" for s in STATUSES if (n := len(report.by_status(s)))
    )
    lines += ["", counts]
    failures = [r for r in report.results if r.status in ("fail", "inconclusive", "xfail")]
    if failures or any(r.strict_xpass for r in report.results):
        lines += ["", "### Failures"]
        for r in report.results:
            if r.status in ("fail", "inconclusive", "xfail") or r.strict_xpass:
                lines += ["", *_failure(r)]
    lines += _upstream(report) + _baseline(report) + _reach(report) + _certificate(report)
    if report.warnings:
        lines += ["", "### Warnings", ""] + [f"- {_cell(w)}" for w in report.warnings]
    return "\n".join(lines) + "\n"


def _failure(r: InvariantResult) -> list[str]:
    lines = [f"#### {_MARK[r.status]} {_cell(r.id)}: {_cell(r.title)}", ""]
    if r.reason:
        lines.append(f"- reason: {_cell(r.reason)}")
    lines += [f"- {_cell(v)}" for v in r.violations]
    if r.expectation:
        e = r.expectation
        lines.append(
            f"- expected ({_cell(e['source'])}): {_cell(e['reason'])} ({_cell(e['link'])})"
        )
    if r.upstream:
        lines.append(f"- upstream: {_cell(r.upstream)}")
    if r.replays is not None and r.replays.runs:
        lines.append(
            f"- replayed {r.replays.runs} times, failed {r.replays.failed}: **{r.replays.verdict}**"
        )
    if r.counterexample:
        lines += [
            "",
            f"<details><summary>minimal counterexample ({r.scenario} scenario)</summary>",
            "",
            "```python",
            _fenced(r.counterexample_python or r.counterexample).rstrip(),
            "```",
            "",
            "</details>",
        ]
    if r.reproduce:
        lines += ["", "reproduce:", "", "```bash", _fenced(r.reproduce), "```"]
    return lines


def _upstream(report: Report) -> list[str]:
    from conformance.upstream import DEFECTS

    named = [
        (d.key, r.id)
        for r in report.results
        if r.upstream
        for d in DEFECTS
        if f"defect {d.key}:" in r.upstream
    ]
    if not named:
        return []
    lines = ["", "### Upstream vLLM defects", ""]
    for key in dict.fromkeys(k for k, _ in named):
        ids = ", ".join(i for k, i in named if k == key)
        defect = next(d for d in DEFECTS if d.key == key)
        lines.append(f"- {_code(key)} ({defect.issue or 'no upstream issue'}): {ids}")
    return lines


def _baseline(report: Report) -> list[str]:
    b = report.baseline
    if not b:
        return []
    lines = ["", f"### Baseline ({_code(b['path'])})", ""]
    for key, label in (
        ("new", "new (fail the run)"),
        ("fixed", "fixed"),
        ("unchanged", "unchanged"),
        ("expected", "still failing, expected (XFAIL)"),
    ):
        lines.append(f"- {label}: {', '.join(b.get(key, ())) or 'none'}")
    return lines


def _reach(report: Report) -> list[str]:
    if not report.reach:
        return ["", "### Reach", "", "not measured (--no-reach, or no coverage.py)"]
    return ["", "### Reach", "", *(f"    {line}" for line in report.reach.get("lines", []))]


def _certificate(report: Report) -> list[str]:
    cert = report.certificate
    if not cert:
        return []
    verdict = "conformant" if cert["conformant"] else "**not conformant**"
    digest = cert["digest"]
    return [
        "",
        "### Certificate",
        "",
        f"Certified run: {verdict}; {cert['contract']} contract, kit {cert['kit_version']}, "
        f"{_code(cert['device'])} ({_cell(cert['device_name'])}), torch {cert['torch']}, "
        f"{len(cert['files'])} builder files hashed; digest {digest['algorithm']} "
        f"{_code(str(digest['value']))} (check: {_code('kvref-conformance verify REPORT.json')})",
    ]


def summary_paths(markdown: Path | None) -> list[Path]:
    """Where the summary goes: ``--markdown``, and ``$GITHUB_STEP_SUMMARY`` when it is set."""
    paths = [markdown] if markdown is not None else []
    step = os.environ.get("GITHUB_STEP_SUMMARY")
    if step:
        paths.append(Path(step))
    return paths


def write_markdown(report: Report, path: Path, *, append: bool) -> None:
    """Write (or, for ``$GITHUB_STEP_SUMMARY``, append) the summary to ``path``.

    Raises:
        OSError: ``path`` cannot be written.
    """
    with path.open("a" if append else "w", encoding="utf-8") as out:
        out.write(format_markdown(report))
