"""Exact P3 and P4 over enumerated runs: sorts and running maxima (contract.md#memory-safety).

Every run of the chosen pages is laid out in flat arrays (:func:`enumerate_runs`);
then (``P`` = number of runs):

- P3 (:func:`sweep_blocks`): sort the runs by ``(block, start)``, merge each
  block's runs into a union (runs of one block in different groups alias
  legitimately), sort the unions by start and compare each start with the
  running maximum end of the previous unions.  Unions of one block are
  disjoint, so any hit is between two different blocks.  O(P log P).
- P4 (:func:`sweep_layers`): sort the runs by ``(group, block, start)`` and
  compare each start with the running maximum end of the previous runs of the
  same ``(group, block)``.  O(P log P).

Coordinates stay in ``int64`` while every byte address is below ``2**62``;
otherwise (hostile sizes) the same code runs on numpy ``object`` arrays of
Python ints: exact, only slower.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import attrs
import numpy as np
import numpy.typing as npt

from conformance.check.footprint import Overlap, PageRef, TensorFootprint

__all__ = [
    "Array",
    "Runs",
    "enumerate_runs",
    "ordered_overlap",
    "run_dtype",
    "run_page",
    "self_overlaps",
    "sweep_blocks",
    "sweep_layers",
]

# Byte addresses below this stay in int64 with room for one addition or a
# difference of two addresses; anything larger goes to exact object arrays.
_INT64_SAFE = 2**62

#: A numpy array of run coordinates (int64, or object for hostile sizes).
Array = npt.NDArray[Any]


@attrs.frozen
class Runs:
    """Flat arrays of runs: one entry per run of one page."""

    start: Array
    end: Array
    block: Array
    tensor: Array  # tensor index
    layer: Array  # layer index within the tensor
    group: Array


def run_dtype(geometries: Sequence[TensorFootprint]) -> Any:
    """``int64`` while every byte address fits with room to spare, else exact ``object``."""
    top = max((g.max_end for g in geometries), default=0)
    return np.int64 if top < _INT64_SAFE else object


def _ints(values: Sequence[int], dtype: Any) -> Array:
    return np.array(list(values), dtype=dtype)


def enumerate_runs(
    geometries: Sequence[TensorFootprint],
    dtype: Any,
    blocks: Sequence[Array],
    layers: Sequence[Array],
) -> Runs:
    """Enumerate the runs of each geometry's pages at the given layer and block indices."""
    parts: list[list[Array]] = [[], [], [], [], [], []]
    for g, bsel, lsel in zip(geometries, blocks, layers, strict=True):
        r = len(g.runs.starts)
        if r == 0 or bsel.size == 0 or lsel.size == 0:
            continue
        ls, bs = g.strides[0], g.strides[1]
        rel = _ints(g.runs.starts, dtype)
        length = _ints(g.runs.lengths, dtype)
        lpos = lsel.astype(dtype) * ls + g.tensor.offset
        bpos = bsel.astype(dtype) * bs
        start = (lpos[:, None, None] + bpos[None, :, None] + rel[None, None, :]).ravel()
        shape = (lsel.size, bsel.size, r)
        parts[0].append(start)
        parts[1].append(start + np.broadcast_to(length[None, None, :], shape).ravel())
        parts[2].append(np.broadcast_to(bsel[None, :, None], shape).ravel())
        parts[3].append(np.full(start.size, g.tensor_index, dtype=np.int64))
        parts[4].append(np.broadcast_to(lsel[:, None, None], shape).ravel())
        parts[5].append(np.full(start.size, g.group_index, dtype=np.int64))
    if not parts[0]:
        empty = np.zeros(0, dtype=np.int64)
        return Runs(empty.astype(dtype), empty.astype(dtype), empty, empty, empty, empty)
    cat = [np.concatenate(p) for p in parts]
    return Runs(cat[0], cat[1], cat[2], cat[3], cat[4], cat[5])


def _prev_max_in_segment(first: Array, starts: Array, ends: Array) -> Array:
    """Largest end among earlier runs of the same segment (runs sorted by segment, start).

    A run that opens its segment gets its own start, so ``start < result`` is
    false for it.  Segments are made independent by lifting segment ``k`` above
    every earlier one (``k * width + (x - base_k)``), which keeps one global
    running maximum exact; the lift falls back to Python ints if it would
    overflow int64.
    """
    seg = np.cumsum(first) - 1
    base = starts[first][seg]
    rel = ends - base
    width = int(rel.max()) + 1
    nseg = int(seg[-1]) + 1
    if rel.dtype != object and nseg * width >= _INT64_SAFE:
        seg, rel, base = seg.astype(object), rel.astype(object), base.astype(object)
    lift = seg * width
    running = np.maximum.accumulate(lift + rel)
    prev = np.empty_like(running)
    prev[0] = 0
    prev[1:] = running[:-1]
    out = prev - lift + base
    out[first] = starts[first]
    result: Array = out
    return result


def run_page(geometries: dict[int, TensorFootprint], runs: Runs, i: int) -> PageRef:
    """The page run ``i`` belongs to."""
    t = int(runs.tensor[i])
    return PageRef(t, geometries[t].tensor.layers[int(runs.layer[i])], int(runs.block[i]))


def ordered_overlap(a: PageRef, b: PageRef, lo: int, hi: int) -> Overlap:
    """The overlap of ``a`` and ``b`` on ``[lo, hi)``, pages ordered by (block, tensor, layer)."""
    key_a = (a.block, a.tensor_index, a.layer)
    key_b = (b.block, b.tensor_index, b.layer)
    if key_b < key_a:
        a, b = b, a
    return Overlap(a, b, (lo, hi))


def sweep_blocks(geometries: dict[int, TensorFootprint], runs: Runs, limit: int) -> list[Overlap]:
    """P3 over enumerated runs: per-block unions, then one sweep over all unions."""
    n = runs.start.size
    if n == 0 or limit <= 0:
        return []
    order = np.lexsort((runs.start, runs.block))
    s, e, blk = runs.start[order], runs.end[order], runs.block[order]
    first = np.empty(n, dtype=bool)
    first[0] = True
    np.not_equal(blk[1:], blk[:-1], out=first[1:])
    prev = _prev_max_in_segment(first, s, e)
    # Touching runs start a new union: that keeps unions contiguous, no harm.
    opens = np.flatnonzero(first | np.asarray(s >= prev, dtype=bool))
    us, ue, ub = s[opens], np.maximum.reduceat(e, opens), blk[opens]
    o = np.argsort(us, kind="stable")
    us, ue, ub = us[o], ue[o], ub[o]
    running = np.maximum.accumulate(ue)
    bad = np.flatnonzero(np.asarray(us[1:] < running[:-1], dtype=bool)) + 1
    found: list[Overlap] = []
    for i in bad[:limit]:
        # Union i starts inside an earlier union j of another block; byte x = us[i]
        # is covered by one run of each block.
        x = us[i]
        j = int(np.argmax(np.asarray(ue[:i] == running[i - 1], dtype=bool)))
        covering = np.asarray((runs.start <= x) & (runs.end > x), dtype=bool)
        ri = int(np.argmax(covering & (runs.block == ub[i])))
        rj = int(np.argmax(covering & (runs.block == ub[j])))
        lo = max(int(runs.start[ri]), int(runs.start[rj]))
        hi = min(int(runs.end[ri]), int(runs.end[rj]))
        found.append(
            ordered_overlap(run_page(geometries, runs, rj), run_page(geometries, runs, ri), lo, hi)
        )
    return found


def sweep_layers(geometries: dict[int, TensorFootprint], runs: Runs, limit: int) -> list[Overlap]:
    """P4 over enumerated runs: one sweep per ``(group, block)`` segment."""
    n = runs.start.size
    if n == 0 or limit <= 0:
        return []
    order = np.lexsort((runs.start, runs.block, runs.group))
    s, e = runs.start[order], runs.end[order]
    blk, grp = runs.block[order], runs.group[order]
    first = np.empty(n, dtype=bool)
    first[0] = True
    first[1:] = (blk[1:] != blk[:-1]) | (grp[1:] != grp[:-1])
    prev = _prev_max_in_segment(first, s, e)
    bad = np.flatnonzero(np.asarray(s < prev, dtype=bool))
    opens = np.flatnonzero(first)
    found: list[Overlap] = []
    for i in bad[:limit]:
        # The earlier run with the largest end is from another page: runs of one
        # page are disjoint, so it could not reach past this run's start.
        seg_start = int(opens[np.searchsorted(opens, i, side="right") - 1])
        j = seg_start + int(np.argmax(np.asarray(e[seg_start:i] == prev[i], dtype=bool)))
        oi, oj = int(order[i]), int(order[j])
        lo, hi = int(s[i]), min(int(e[i]), int(e[j]))
        found.append(
            ordered_overlap(run_page(geometries, runs, oj), run_page(geometries, runs, oi), lo, hi)
        )
    return found


def self_overlaps(geometries: Iterable[TensorFootprint], limit: int) -> list[Overlap]:
    """P4 within one page: each tensor whose page overlaps itself, as its first page."""
    found: list[Overlap] = []
    for g in geometries:
        so = g.runs.self_overlap
        if so is None or g.num_pages == 0:
            continue
        page = PageRef(g.tensor_index, g.tensor.layers[0], 0)
        base = g.page_start(0, 0)
        found.append(Overlap(page, page, (base + so[0], base + so[1])))
        if len(found) >= limit:
            break
    return found
