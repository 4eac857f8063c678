"""An SVG memory map of a failure's minimal counterexample, drawn from the report's data alone.

The picture has two parts:

- the pages, one row per layer of the counterexample and one column per
  block, the pages the violations name marked (overlapping pages red,
  pages past their backing orange, other located violations purple);
- the bytes: each located violation's ``byte_range`` on one byte axis
  (with the backing's end, for a page past it).

Its inputs are the result's ``counterexample_data`` (rebuilt with
:func:`conformance.report.records.decode_example`, which constructs kvref
specs and runs nothing the report names) and the violations' ``layer``,
``block``, ``byte_range`` and ``worker`` fields; the builder is never run
again.  A violation names one page; the other page of an overlap is read
from the kit's own message ("... overlaps 'layer' block N").
"""

from __future__ import annotations

import html
import re
from collections.abc import Mapping, Sequence
from typing import Any

from conformance.report.render import _clean

__all__ = ["COLOURS", "memory_map_svg", "violation_kind"]

#: Fill colours by kind of page; the HTML page's legend and tests use them.
COLOURS = {
    "overlap": "#d62728",
    "out-of-bounds": "#ff7f0e",
    "other": "#9467bd",
    "page": "#dfe6ee",
}
_STROKE = "#8a99a8"
_OTHER_PAGE = re.compile(r"overlaps '([^']+)' block (\d+)")
_BACKING = re.compile(r"backing of (\d+) bytes")
#: The kit checks a placement at several block counts; its messages name the one that broke.
_AT_BLOCKS = re.compile(r"^at (\d+) blocks ")
_MAX_ROWS = 32
_MAX_COLUMNS = 24
_FIRST_BLOCKS = 8
_LABEL = 380
_CELL_W = 30
_CELL_H = 18
_STRIP_W = 640


def _escape(text: str) -> str:
    # Layer names come from the builder's answer: text, without controls or escapes.
    return html.escape(_clean(text))


def violation_kind(invariant: str) -> str:
    """``overlap``, ``out-of-bounds`` or ``other``: how a violation's pages are marked."""
    if "OVERLAP" in invariant or "ALIAS" in invariant:
        return "overlap"
    if "BOUNDS" in invariant:
        return "out-of-bounds"
    return "other"


def _located(violations: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [
        v
        for v in violations
        if v.get("layer") is not None
        or v.get("block") is not None
        or v.get("byte_range") is not None
    ]


def _problem_layers(data: Any, worker: int) -> tuple[list[str], dict[str, int], int | None, str]:
    """Layer names, page bytes per layer, block count and layout of the counterexample."""
    from conformance.report.records import RecordError, decode_example

    if data is None:
        return [], {}, None, "no data form of the counterexample"
    try:
        config, workers, _, num_blocks = decode_example(data)
    except RecordError as exc:
        return [], {}, None, f"counterexample data unreadable: {exc}"
    layers = workers[min(worker, len(workers) - 1)]
    pages: dict[str, int] = {}
    for name, spec in layers.items():
        try:
            pages[name] = int(spec.page_size_bytes)
        except Exception:
            # A spec the data rebuilds yet cannot size (invalid on purpose): no size shown.
            continue
    layout = getattr(config, "kv_cache_layout", None)
    described = "layout resolved by the platform" if layout is None else f"layout {layout.name}"
    return list(layers), pages, num_blocks, described


def _marks(located: Sequence[Mapping[str, Any]]) -> dict[tuple[str | None, int | None], str]:
    """The pages to mark, by ``(layer, block)``, with their kind (overlap wins)."""
    marks: dict[tuple[str | None, int | None], str] = {}

    def mark(key: tuple[str | None, int | None], kind: str) -> None:
        if marks.get(key) != "overlap":
            marks[key] = kind

    for v in located:
        kind = violation_kind(str(v.get("invariant", "")))
        mark((v.get("layer"), v.get("block")), kind)
        for layer, block in _OTHER_PAGE.findall(str(v.get("message", ""))):
            mark((layer, int(block)), kind)
    return marks


def _rows(layers: list[str], marked: set[str]) -> tuple[list[str], int]:
    """The layers drawn (every marked one, then the first others) and how many are left out."""
    names = layers + sorted(m for m in marked if m not in layers)
    if len(names) <= _MAX_ROWS:
        return names, 0
    keep = {n for n in names if n in marked}
    for n in names:
        if len(keep) >= _MAX_ROWS:
            break
        keep.add(n)
    return [n for n in names if n in keep], len(names) - len(keep)


def _columns(num_blocks: int | None, marked: set[int]) -> list[int]:
    first = range(min(num_blocks if num_blocks is not None else _FIRST_BLOCKS, _FIRST_BLOCKS))
    return sorted(set(first) | marked)[:_MAX_COLUMNS]


def _short(name: str, width: int = 34) -> str:
    return name if len(name) <= width else "\u2026" + name[-(width - 1) :]


def _grid(
    rows: list[str],
    columns: list[int],
    marks: Mapping[tuple[str | None, int | None], str],
    pages: Mapping[str, int],
    top: int,
) -> list[str]:
    out = [f'<text x="0" y="{top - 6}" class="axis">layer \u2193  block \u2192</text>']
    for c, block in enumerate(columns):
        x = _LABEL + c * _CELL_W + _CELL_W // 2
        out.append(f'<text x="{x}" y="{top - 6}" class="axis" text-anchor="middle">{block}</text>')
    for r, layer in enumerate(rows):
        y = top + r * _CELL_H
        size = f" ({pages[layer]} B/page)" if layer in pages else ""
        out.append(
            f'<text x="0" y="{y + _CELL_H - 5}" class="label"><title>{_escape(layer)}'
            f"</title>{_escape(_short(layer))}{size}</text>"
        )
        for c, block in enumerate(columns):
            kind = marks.get((layer, block)) or marks.get((layer, None)) or "page"
            tip = f"layer {layer}, block {block}" + ("" if kind == "page" else f": {kind}")
            out.append(
                f'<rect class="page {kind}" x="{_LABEL + c * _CELL_W + 1}" y="{y + 1}" '
                f'width="{_CELL_W - 2}" height="{_CELL_H - 2}" fill="{COLOURS[kind]}" '
                f'stroke="{_STROKE}"><title>{_escape(tip)}</title></rect>'
            )
    return out


def _strip(located: Sequence[Mapping[str, Any]], top: int) -> tuple[list[str], int]:
    """The byte axis with each violation's range; returns its elements and its height."""
    ranged = [v for v in located if isinstance(v.get("byte_range"), (list, tuple))]
    if not ranged:
        return [], 0
    ends = [int(x) for v in ranged for x in v["byte_range"][:2]]
    backings = [int(b) for v in ranged for b in _BACKING.findall(str(v.get("message", "")))]
    # A backing starts at byte 0: the axis shows it whole, with the page past its end.
    lo, hi = (0 if backings else min(ends)), max(ends + backings)
    span = max(hi - lo, 1)

    def x(byte: int) -> float:
        return _LABEL + (byte - lo) * _STRIP_W / span

    out = [
        f'<text x="0" y="{top + 12}" class="axis">bytes {lo} .. {hi}</text>',
        f'<line x1="{_LABEL}" y1="{top + 16}" x2="{_LABEL + _STRIP_W}" y2="{top + 16}" '
        f'stroke="{_STROKE}"/>',
    ]
    for b in sorted(set(backings)):
        out.append(
            f'<rect class="backing" x="{x(0):.1f}" y="{top + 14}" width="{x(b) - x(0):.1f}" '
            f'height="5" fill="{COLOURS["page"]}" stroke="{_STROKE}">'
            f"<title>the backing: bytes [0, {b})</title></rect>"
        )
        out.append(
            f'<line class="backing" x1="{x(b):.1f}" y1="{top}" x2="{x(b):.1f}" '
            f'y2="{top + 24 + len(ranged) * _CELL_H}" stroke="#333" stroke-dasharray="4 3">'
            f"<title>end of the backing: {b} bytes</title></line>"
        )
    for i, v in enumerate(ranged):
        start, end = int(v["byte_range"][0]), int(v["byte_range"][1])
        kind = violation_kind(str(v.get("invariant", "")))
        y = top + 24 + i * _CELL_H
        where = f"{_short(str(v.get('layer')), 30)} block {v.get('block')}"
        out.append(
            f'<text x="0" y="{y + _CELL_H - 5}" class="label">'
            f"{_escape(where)}: [{start}, {end})</text>"
        )
        width = max(x(end) - x(start), 2.0)
        out.append(
            f'<rect class="range {kind}" x="{x(start):.1f}" y="{y + 1}" width="{width:.1f}" '
            f'height="{_CELL_H - 2}" fill="{COLOURS[kind]}">'
            f"<title>{_escape(str(v.get('message', '')))}</title></rect>"
        )
    return out, 24 + len(ranged) * _CELL_H + 8


def memory_map_svg(result: Mapping[str, Any]) -> str | None:
    """The memory map of one result (a report's JSON result), or ``None`` with nothing located.

    A result is drawable when a violation names a layer, a block or a byte range.
    """
    located = _located(result.get("violations") or ())
    if not located:
        return None
    worker = next((int(v["worker"]) for v in located if v.get("worker") is not None), 0)
    layers, pages, num_blocks, layout = _problem_layers(result.get("counterexample_data"), worker)
    marks = _marks(located)
    placed = [int(m) for v in located for m in _AT_BLOCKS.findall(str(v.get("message", "")))]
    if placed:
        num_blocks = max(placed)
    rows, hidden = _rows(layers, {k[0] for k in marks if k[0] is not None})
    columns = _columns(num_blocks, {k[1] for k in marks if k[1] is not None})
    blocks = "? blocks" if num_blocks is None else f"{num_blocks} blocks"
    if placed:
        blocks = f"placed at {blocks}"
    caption = (
        f"worker {worker}: {len(layers)} layers, {blocks}, {layout}"
        + (f"; {hidden} unmarked layers not shown" if hidden else "")
        + (f"; blocks shown: {len(columns)}" if num_blocks and len(columns) < num_blocks else "")
    )
    body = [f'<text x="0" y="14" class="caption">{_escape(caption)}</text>']
    grid_top = 44
    if rows and columns:
        body += _grid(rows, columns, marks, pages, grid_top)
    strip_top = grid_top + len(rows) * _CELL_H + 16
    strip, strip_h = _strip(located, strip_top)
    body += strip
    width = _LABEL + max(len(columns) * _CELL_W, _STRIP_W) + 20
    height = strip_top + strip_h + 4
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="memory-map" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="memory map of {_escape(str(result.get("id", "")))}">'
        "<style>.axis,.label{font:11px monospace;fill:#333}"
        ".caption{font:12px sans-serif;fill:#111}</style>" + "".join(body) + "</svg>"
    )
