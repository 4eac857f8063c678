"""The HTML report (``--html FILE``): one self-contained page for people who decide releases.

The page needs nothing but itself: styles inline, no script, no font, image
or stylesheet fetched.  It shows the run's header (and certificate), the
verdict table, reach with the builder's unreached lines, and each failure
with its violations, an SVG memory map of its minimal counterexample
(:mod:`conformance.ci.memory_map`), the counterexample and the line that
reproduces it.  It is made from the report's JSON data
(:func:`format_html` takes what ``--json`` writes), so a report from
another machine renders the same.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from conformance.ci.memory_map import COLOURS, memory_map_svg
from conformance.report.model import STATUSES, Report

# The text report's status marks and cleaning: both reports spell a status alike.
from conformance.report.render import _MARK, _clean

__all__ = ["format_html", "write_html"]

_BADGE = {
    "pass": "#2ca02c",
    # Not the memory map's overlap red: a screenshot test looks for that colour.
    "fail": "#b03a2e",
    "inconclusive": "#b03a2e",
    "not-applicable": "#7f7f7f",
    "skipped": "#7f7f7f",
    "xfail": "#bcbd22",
    "xpass": "#17becf",
}
#: Unreached lines shown per module; the rest are counted.
_MAX_SOURCE_LINES = 400
_STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em;color:#111;max-width:1200px}
h1 .ok{color:#2ca02c} h1 .failed{color:#b03a2e}
table{border-collapse:collapse;margin:.5em 0}
td,th{border:1px solid #ccc;padding:2px 8px;text-align:left;vertical-align:top}
td.num{text-align:right} th{background:#f2f4f7}
.badge{color:#fff;border-radius:3px;padding:0 6px;font-weight:600;font-size:12px}
pre{background:#f6f8fa;padding:8px;overflow-x:auto;font-size:12px}
pre.source .no{color:#888;user-select:none}
.finding{border-left:4px solid #b03a2e;padding-left:12px;margin:1.5em 0}
.legend span{display:inline-block;width:12px;height:12px;margin:0 4px 0 12px;vertical-align:middle}
.warning{color:#8a6d00}
"""


def _e(value: object) -> str:
    # What the builder wrote is text: escaped, and without the terminal escapes and
    # control characters (a lone surrogate among them) an HTML file cannot hold.
    return html.escape(_clean(str(value)))


def _badge(status: str) -> str:
    return f'<span class="badge" style="background:{_BADGE[status]}">{_MARK[status]}</span>'


def _anchor(invariant: str) -> str:
    return "finding-" + invariant.lower()


def _header(data: Mapping[str, Any]) -> list[str]:
    verdict = "OK" if data.get("ok") else "FAILED"
    rows = [
        ("builder", data.get("builder")),
        ("device", data.get("device")),
        ("profile", data.get("profile")),
        ("examples per scenario", data.get("max_examples")),
        ("seed", data.get("seed")),
        ("contract", data.get("contract")),
        ("kit", data.get("kit_version")),
        ("started (UTC)", data.get("started")),
        ("seconds", f"{float(data.get('seconds') or 0):.1f}"),
    ]
    out = [
        f'<h1>kvref-conformance: <span class="{verdict.lower()}">{verdict}</span></h1>',
        "<table>",
        *(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in rows if v is not None),
        "</table>",
    ]
    if data.get("interrupted"):
        out.append(
            '<p class="warning"><b>Interrupted</b>: what the run did not reach is inconclusive.</p>'
        )
    if not data.get("complete", True):
        out.append(f'<p class="warning">{_e(data.get("incomplete_reason"))}</p>')
    for warning in data.get("warnings") or ():
        out.append(f'<p class="warning">warning: {_e(warning)}</p>')
    return out + _certificate(data.get("certificate"))


def _certificate(cert: Mapping[str, Any] | None) -> list[str]:
    if not cert:
        return []
    verdict = "conformant" if cert.get("conformant") else "not conformant"
    digest = cert.get("digest") or {}
    out = [
        "<h2>Certificate</h2>",
        f"<p>Certified run ({_e(cert.get('format'))}): <b>{verdict}</b>; kit "
        f"{_e(cert.get('kit_version'))}, {_e(cert.get('contract'))} contract, "
        f"{_e(cert.get('device'))} ({_e(cert.get('device_name'))}), torch "
        f"{_e(cert.get('torch'))}, profile {_e(cert.get('profile'))}, seed "
        f"{_e(cert.get('seed'))}. Digest ({_e(digest.get('algorithm'))}): "
        f"<code>{_e(digest.get('value'))}</code>; check with "
        "<code>kvref-conformance verify REPORT.json</code>.</p>",
        "<table><tr><th>builder file</th><th>sha256</th><th>bytes</th></tr>",
    ]
    out += [
        f"<tr><td>{_e(f.get('path'))}</td><td><code>{_e(f.get('sha256'))}</code></td>"
        f'<td class="num">{_e(f.get("bytes"))}</td></tr>'
        for f in cert.get("files") or ()
    ]
    return [*out, "</table>"]


def _table(results: Sequence[Mapping[str, Any]]) -> list[str]:
    out = [
        "<h2>Verdicts</h2>",
        '<table class="verdicts"><tr><th>invariant</th><th>verdict</th><th>examples</th>'
        "<th>seconds</th><th>title</th></tr>",
    ]
    for r in results:
        status = str(r.get("status"))
        ident = _e(r.get("id"))
        if _findable(r):
            ident = f'<a href="#{_anchor(str(r.get("id")))}">{ident}</a>'
        out.append(
            f"<tr><td>{ident}</td><td>{_badge(status)}</td>"
            f'<td class="num">{_e(r.get("examples", 0))}</td>'
            f'<td class="num">{float(r.get("seconds") or 0):.2f}</td><td>{_e(r.get("title"))}'
            + (f"<br><small>{_e(r.get('reason'))}</small>" if r.get("reason") else "")
            + _expectation(r)
            + "</td></tr>"
        )
    counts = ", ".join(
        f"{n} {_MARK[s].lower()}"
        for s in STATUSES
        if (n := sum(1 for r in results if r.get("status") == s))
    )
    return [*out, "</table>", f"<p>{_e(counts)}</p>"]


def _expectation(r: Mapping[str, Any]) -> str:
    """Why an XFAIL or XPASS was expected: the manifest entry's reason and link, escaped."""
    entry = r.get("expectation")
    if not isinstance(entry, Mapping):
        return ""
    link = str(entry.get("link") or "")
    shown = _e(link)
    if link.startswith(("https://", "http://")):
        # Only web links become anchors: a manifest is data, and its text stays text.
        shown = f'<a href="{_e(link)}" rel="noreferrer">{_e(link)}</a>'
    source = f" ({_e(entry.get('source'))})" if entry.get("source") else ""
    return f"<br><small>expected: {_e(entry.get('reason'))}; {shown}{source}</small>"


def _findable(r: Mapping[str, Any]) -> bool:
    return r.get("status") in ("fail", "inconclusive", "xfail", "xpass")


def _ranges(missing: str) -> list[int]:
    lines: list[int] = []
    for part in missing.split(","):
        first, _, last = part.strip().partition("-")
        if first.isdigit():
            lines += range(int(first), int(last or first) + 1)
    return lines


def _unreached_source(module: Mapping[str, Any]) -> list[str]:
    """The module's unreached lines with their text, when its file is readable here."""
    lines = _ranges(str(module.get("missing") or ""))
    if not lines:
        return []
    try:
        text = Path(str(module.get("path"))).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return [f"<p>(source not readable here; lines {_e(module.get('missing'))})</p>"]
    shown = [n for n in lines if n <= len(text)][:_MAX_SOURCE_LINES]
    out, previous = [], None
    for n in shown:
        if previous is not None and n != previous + 1:
            out.append('<span class="no">   \u22ee</span>')
        out.append(f'<span class="no">{n:>5} </span>{_e(text[n - 1])}')
        previous = n
    more = len(lines) - len(shown)
    tail = f"<p>{more} more unreached lines not shown.</p>" if more > 0 else ""
    return [
        f"<details><summary>unreached lines of {_e(module.get('path'))} ({len(lines)})"
        '</summary><pre class="source">' + "\n".join(out) + "</pre>" + tail + "</details>"
    ]


def _reach(reach: Mapping[str, Any] | None) -> list[str]:
    if not reach:
        return ["<h2>Reach</h2>", "<p>Not measured (--no-reach, or no coverage.py).</p>"]
    out = [
        "<h2>Reach</h2>",
        f"<p>The run executed {_e(reach.get('percent'))}% of the builder's own code "
        f"({_e(reach.get('executed'))} of {_e(reach.get('statements'))} statements).</p>",
        "<table><tr><th>module</th><th>reached</th><th>not reached (lines)</th></tr>",
    ]
    modules = list(reach.get("modules") or ())
    out += [
        f"<tr><td>{_e(m.get('path'))}</td><td class='num'>{_e(m.get('percent'))}%</td>"
        f"<td><small>{_e(m.get('missing') or 'none')}</small></td></tr>"
        for m in modules
    ]
    out.append("</table>")
    for m in modules:
        out += _unreached_source(m)
    return out


def _legend() -> str:
    return (
        '<p class="legend">'
        + "".join(
            f'<span style="background:{COLOURS[k]}"></span>{label}'
            for k, label in (
                ("overlap", "overlapping page"),
                ("out-of-bounds", "page past its backing"),
                ("other", "page a violation names"),
                ("page", "page"),
            )
        )
        + "</p>"
    )


def _finding(r: Mapping[str, Any]) -> list[str]:
    status = str(r.get("status"))
    out = [
        f'<div class="finding" id="{_anchor(str(r.get("id")))}">',
        f"<h3>{_badge(status)} {_e(r.get('id'))}: {_e(r.get('title'))}</h3>",
        f"<p>Contract: {_e(r.get('reference'))}"
        + (f"; scenario {_e(r.get('scenario'))}" if r.get("scenario") else "")
        + "</p>",
    ]
    for key, label in (("reason", "reason"), ("inherited", "inherited"), ("upstream", "upstream")):
        if r.get(key):
            out.append(f"<p>{label}: {_e(r[key])}</p>")
    if r.get("expectation"):
        out.append(f"<p>{_expectation(r).removeprefix('<br>')}</p>")
    violations = list(r.get("violations") or ())
    if violations:
        out.append("<ul>" + "".join(f"<li>{_e(v.get('message'))}</li>" for v in violations))
        out.append("</ul>")
    svg = memory_map_svg(r) if status in ("fail", "xfail") else None
    if svg is not None:
        out += ["<h4>Memory map of the minimal counterexample</h4>", _legend(), svg]
    if r.get("counterexample"):
        out.append(f"<h4>Minimal counterexample</h4><pre>{_e(r['counterexample'])}</pre>")
    if r.get("counterexample_python"):
        out.append(
            f"<details><summary>as Python</summary><pre>{_e(r['counterexample_python'])}"
            "</pre></details>"
        )
    replays = r.get("replays")
    if replays and replays.get("runs"):
        out.append(
            f"<p>replayed {_e(replays['runs'])} times, failed {_e(replays['failed'])}: "
            f"<b>{_e(replays['verdict'])}</b></p>"
        )
    if r.get("reproduce"):
        out.append(f"<p>reproduce:</p><pre>{_e(r['reproduce'])}</pre>")
    return [*out, "</div>"]


def format_html(data: Mapping[str, Any]) -> str:
    """The page of a report given as its JSON data (what ``--json`` writes)."""
    results = list(data.get("results") or ())
    body = _header(data) + _table(results) + _reach(data.get("reach"))
    findings = [r for r in results if _findable(r)]
    if findings:
        body.append("<h2>Findings</h2>")
        for r in findings:
            body += _finding(r)
    baseline = data.get("baseline")
    if baseline:
        body.append(f"<h2>Baseline ({_e(baseline.get('path'))})</h2><ul>")
        body += [
            f"<li>{k}: {_e(', '.join(baseline.get(k) or ()) or 'none')}</li>"
            for k in ("new", "fixed", "unchanged")
        ]
        body.append("</ul>")
    if data.get("builder_output"):
        body.append(
            "<details><summary>Builder output (its worker's stdout and stderr)</summary>"
            f"<pre>{_e(data['builder_output'])}</pre></details>"
        )
    title = f"kvref-conformance: {data.get('builder')}"
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        # No script, and nothing fetched: the page works offline and from a CI artifact.
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
        "style-src 'unsafe-inline'; img-src data:\">"
        f"<title>{_e(title)}</title><style>{_STYLE}</style></head><body>\n"
        + "\n".join(body)
        + "\n</body></html>\n"
    )


def write_html(report: Report, path: Path) -> None:
    """Write :func:`format_html` of ``report`` to ``path`` (UTF-8).

    Raises:
        OSError: ``path`` cannot be written.
    """
    import json

    from conformance.report.render import report_to_dict

    # Through JSON: the page is made from exactly what the --json file holds.
    data = json.loads(json.dumps(report_to_dict(report), default=str))
    path.write_text(format_html(data), encoding="utf-8")
