"""Exact, vectorised footprint analysis of a :class:`~kvref.records.KVCacheConfig`.

The properties are those of contract.md#memory-safety.

This module decides the memory-safety properties of a plan from its records
alone, for any builder:

- **P2** (:func:`find_out_of_bounds`): every footprint lies inside its tensor's backing;
- **P3** (:func:`find_block_overlaps`): footprints of different block IDs never overlap,
  across any tensors, layers and groups;
- **P4** (:func:`find_layer_overlaps`): within one group and one block, footprints of
  different ``(tensor, layer)`` never overlap, and no page overlaps itself.

Device tensors are checked by default.  Host-resident tensors form their own
address space with ``config.host_num_blocks`` blocks and are never compared
with device tensors: check them with the ``find_host_*`` functions (or
``host=True``).

Footprint (contract.md#memory-safety).  For tensor ``t`` with per-layer spec ``s`` (the spec of
``t.layers[0]`` in the first group that holds it, as a worker resolves it),
``N = config.num_blocks_of(t)`` and strides ``(Ls, Bs, Hs, Ss, 1)`` from
:func:`conformance.check.geometry.layout_strides` with ``L`` and ``B`` pinned to the
tensor's, the page of layer index ``l`` at block ``b`` is::

    F(t,l,b) = U_{h<H, n<S} [offset + l*Ls + b*Bs + h*Hs + n*Ss, ... + C)

A page is reduced analytically to a few disjoint *runs* relative to its start
(:func:`page_runs`): axes whose stride equals the run length so far are folded
into it, so a dense page is one run of ``H*S*C`` bytes and an LHBNC/BHLNC page
is ``H`` runs of ``S*C`` bytes.

Algorithms (``P`` = number of runs, i.e. pages times runs per page):

- P2 is closed-form per tensor (strides are non-negative, so the farthest
  byte is that of the last layer at the last block), O(tensors).
- P3: sort the runs by ``(block, start)``, merge each block's runs into a
  union (runs of one block in different groups alias legitimately), sort the
  unions by start and compare each start with the running maximum end of the
  previous unions.  Unions of one block are disjoint, so any hit is between
  two different blocks.  O(P log P).
- P4: sort the runs by ``(group, block, start)`` and compare each start with the
  running maximum end of the previous runs of the same ``(group, block)``.
  O(P log P).

Coordinates stay in ``int64`` while every byte address is below ``2**62``;
otherwise (hostile sizes) the same code runs on numpy ``object`` arrays of
Python ints: exact, only slower.

Large configs.  When a config has more runs than ``budget``, pages are not
enumerated.  Instead:

1. P2 and page self-overlap are closed-form anyway (exact).
2. *Families* are checked pairwise in closed form.  A family is one run ``k``
   of one layer ``l`` of one tensor across all blocks:
   ``[s + b*B, e + b*B)`` for ``b < N``, with ``s, e`` its block-0 run.  Two
   families can only meet if their hulls ``[s, e + (N-1)*B)`` intersect; those
   candidate pairs come from one sort of the hull starts.  For a candidate
   pair with the *same* block stride ``B`` the pattern is periodic: run ``i``
   at block ``b`` meets run ``j`` at block ``b + m`` iff
   ``s_i - e_j < m*B < e_i - s_j``, independently of ``b``.  So P3 holds for the
   pair iff no integer ``m`` with ``1 <= |m| <= N-1`` lies in that open
   interval, and P4 iff ``m = 0`` does not (or the pair is in different groups,
   or is one page).  A family overlaps its own other blocks iff its run is
   longer than ``B`` (or ``B = 0``) and ``N >= 2``.  For a pair with different
   block strides, P4 at a common block ``b`` is the same interval test with
   ``B_j - B_i`` in place of ``B``; P3 is a two-variable lattice problem that
   is not decided in closed form.
3. Every tensor's pages at blocks ``{0, 1, 2, N-3, N-2, N-1}`` (and, if even
   that exceeds the budget, only layers ``{0, 1, 2, L-3, L-2, L-1}``) are
   enumerated and swept exactly as above, which catches different-stride P3
   violations near the ends of the block range, where an overlapping
   layer-outer region shows first.

:attr:`MemoryReport.exhaustive` is ``False`` when step 2 could not decide
everything (a different-stride candidate pair, more than ``budget`` families,
or more candidate pairs than ``min(budget, 1_000_000)``); the violations
reported are real either way.

:func:`host_tensor_end` gives the closed-form end of one tensor's footprint
(host tensors default to :data:`HOST_LAYOUT`, LBNHC).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import attrs
import numpy as np
import numpy.typing as npt

from conformance.check.geometry import OracleError, layout_strides, page_geometry
from kvref.axes import HOST_LAYOUT as _HOST_LAYOUT
from kvref.errors import KVRefError
from kvref.layout import KVCacheLayout
from kvref.records import KVCacheConfig, KVCacheTensor
from kvref.specs import KVCacheSpec

__all__ = [
    "DEFAULT_BUDGET",
    "HOST_LAYOUT",
    "MemoryReport",
    "OutOfBounds",
    "Overlap",
    "PageRef",
    "PageRuns",
    "Problem",
    "TensorGeometry",
    "check_memory",
    "find_block_overlaps",
    "find_host_block_overlaps",
    "find_host_layer_overlaps",
    "find_host_out_of_bounds",
    "find_layer_overlaps",
    "find_out_of_bounds",
    "find_unusable_tensors",
    "host_tensor_end",
    "page_runs",
    "tensor_geometries",
]

#: Runs (pages times runs per page) enumerated before switching to the large-config path.
DEFAULT_BUDGET = 4_000_000

# Byte addresses below this stay in int64 with room for one addition or a
# difference of two addresses; anything larger goes to exact object arrays.
_INT64_SAFE = 2**62

#: Layout of host-resident tensors: always LBNHC (contract.md#host-residency).
HOST_LAYOUT = _HOST_LAYOUT

# Candidate family pairs evaluated at once (about 20 arrays of this length).
_MAX_PAIRS = 1_000_000

# Runs one page may have before its tensor is skipped as a Problem (at least).
_MIN_PAGE_RUNS = 1 << 16

_Array = npt.NDArray[Any]


# -- records -----------------------------------------------------------------------


@attrs.frozen
class PageRef:
    """One page: layer ``layer`` (a name of tensor ``tensor_index``) at block ``block``."""

    tensor_index: int
    layer: str
    block: int

    def __str__(self) -> str:
        return f"tensor {self.tensor_index} layer {self.layer!r} block {self.block}"


@attrs.frozen
class OutOfBounds:
    """A page that does not fit in its backing (P2).

    Attributes:
        page: the tensor's farthest page (last layer at the last block).
        byte_range: ``(first byte, end)`` of that page's footprint, end exclusive.
        size: the tensor's backing size in bytes.

    """

    page: PageRef
    byte_range: tuple[int, int]
    size: int


@attrs.frozen
class Overlap:
    """Two pages sharing bytes (P3 or P4); ``a == b`` for a page overlapping itself.

    Attributes:
        a, b: the pages, ``a`` ordered first by ``(block, tensor_index, layer)``.
        byte_range: ``(start, end)`` of the bytes both use, end exclusive.

    """

    a: PageRef
    b: PageRef
    byte_range: tuple[int, int]


@attrs.frozen
class Problem:
    """A tensor whose footprint cannot be computed, so the memory checks skip it.

    Attributes:
        tensor_index: index in ``config.kv_cache_tensors``.
        reason: why, in a sentence (unknown layer, layout cannot express the spec...).

    """

    tensor_index: int
    reason: str


@attrs.frozen
class PageRuns:
    """A page's footprint as disjoint, sorted runs relative to the page start.

    Attributes:
        starts, lengths: the runs (non-adjacent, non-overlapping, ascending).
        self_overlap: ``(start, end)``, relative, of bytes two of the page's own
            ``(head, state)`` cells share, or ``None``.

    """

    starts: tuple[int, ...]
    lengths: tuple[int, ...]
    self_overlap: tuple[int, int] | None = None

    @property
    def end(self) -> int:
        """End of the last run (0 for an empty page)."""
        return self.starts[-1] + self.lengths[-1] if self.starts else 0


@attrs.frozen
class TensorGeometry:
    """Everything the footprint of one tensor depends on (contract.md#memory-safety).

    Attributes:
        tensor_index: index in ``config.kv_cache_tensors``.
        tensor: the tensor record.
        group_index: index of the group holding ``tensor.layers[0]``.
        spec: that layer's per-layer spec, used for every layer of the tensor.
        num_blocks: ``config.num_blocks_of(tensor)``.
        strides: byte strides ``(L, B, H, S, C)``.
        heads, states, content: ``H``, ``S`` and ``C`` of one page.
        runs: the page's runs (see :func:`page_runs`).

    """

    tensor_index: int
    tensor: KVCacheTensor
    group_index: int
    spec: KVCacheSpec
    num_blocks: int
    strides: tuple[int, int, int, int, int]
    heads: int
    states: int
    content: int
    runs: PageRuns

    @property
    def num_layers(self) -> int:
        """Layers of the tensor."""
        return len(self.tensor.layers)

    @property
    def num_pages(self) -> int:
        """Pages of the tensor: layers times blocks."""
        return self.num_layers * self.num_blocks

    def page_start(self, layer_index: int, block: int) -> int:
        """Byte where page ``(layer_index, block)`` starts (its runs are relative to it)."""
        return self.tensor.offset + layer_index * self.strides[0] + block * self.strides[1]

    @property
    def max_end(self) -> int:
        """End of the farthest byte of any page (``offset`` if there are none)."""
        if self.num_pages == 0 or not self.runs.starts:
            return self.tensor.offset
        return self.page_start(self.num_layers - 1, self.num_blocks - 1) + self.runs.end


@attrs.frozen
class MemoryReport:
    """Result of :func:`check_memory`.

    Attributes:
        out_of_bounds: P2 violations, one per tensor (its farthest page).
        block_overlaps: P3 violations.
        layer_overlaps: P4 violations, pages overlapping themselves first.
        problems: tensors that were skipped (see :func:`find_unusable_tensors`).
        exhaustive: ``False`` when the large-config path could not decide every
            pair (module docstring); the violations listed are real either way.
        runs: runs the checked tensors have in total.

    """

    out_of_bounds: tuple[OutOfBounds, ...]
    block_overlaps: tuple[Overlap, ...]
    layer_overlaps: tuple[Overlap, ...]
    problems: tuple[Problem, ...]
    exhaustive: bool
    runs: int

    @property
    def ok(self) -> bool:
        """No violation found (problems and sampling are reported separately)."""
        return not (self.out_of_bounds or self.block_overlaps or self.layer_overlaps)


# -- geometry ------------------------------------------------------------------------


class _TooManyRunsError(ValueError):
    """A page would need more runs than allowed."""


def _fold(axes: list[tuple[int, int]], content: int) -> tuple[int, list[tuple[int, int]]]:
    """Fold the innermost axes whose stride equals the run so far: ``(run length, rest)``."""
    run = content
    rest = sorted(axes)
    while rest and rest[0][0] == run:
        run *= rest.pop(0)[1]
    return run, rest


def page_runs(
    head_stride: int,
    heads: int,
    state_stride: int,
    states: int,
    content: int,
    *,
    max_runs: int = DEFAULT_BUDGET,
) -> PageRuns:
    """Disjoint runs of one page of ``heads x states`` cells of ``content`` bytes.

    Cells sit at ``h*head_stride + n*state_stride``.  Dense axes are folded
    analytically, so the cost does not depend on ``H*S`` for real layouts.

    Raises:
        ValueError: the page needs more than ``max_runs`` runs.

    """
    if heads <= 0 or states <= 0 or content <= 0:
        return PageRuns((), ())
    pairs = ((head_stride, heads), (state_stride, states))
    axes = [(stride, ext) for stride, ext in pairs if ext > 1]
    run, rest = _fold(axes, content)
    if not rest:
        return PageRuns((0,), (run,))
    if len(rest) == 1:
        stride, ext = rest[0]
        if stride < run:
            # Cells k and k+1 share [stride, run); the union is one run.
            return PageRuns((0,), ((ext - 1) * stride + run,), (stride, run))
        if ext > max_runs:
            raise _TooManyRunsError(ext)
        return PageRuns(tuple(k * stride for k in range(ext)), (run,) * ext)
    # Two axes left (no layout of contract.md#layouts produces this): enumerate the cells.
    (s1, e1), (s2, e2) = rest
    if e1 * e2 > max_runs:
        raise _TooManyRunsError(e1 * e2)
    cells = sorted(i * s1 + j * s2 for i in range(e1) for j in range(e2))
    starts: list[int] = []
    ends: list[int] = []
    self_overlap: tuple[int, int] | None = None
    for c in cells:
        if starts and c < ends[-1]:
            if self_overlap is None:
                self_overlap = (c, min(ends[-1], c + run))
            ends[-1] = max(ends[-1], c + run)
        elif starts and c == ends[-1]:
            ends[-1] = c + run
        else:
            starts.append(c)
            ends.append(c + run)
    lengths = tuple(e - s for s, e in zip(starts, ends, strict=True))
    return PageRuns(tuple(starts), lengths, self_overlap)


def _selected(config: KVCacheConfig, host: bool) -> list[tuple[int, KVCacheTensor]]:
    return [(i, t) for i, t in enumerate(config.kv_cache_tensors) if t.host_resident == host]


def _group_index(config: KVCacheConfig) -> dict[str, int]:
    group_of: dict[str, int] = {}
    for group_index, group in enumerate(config.kv_cache_groups):
        for name in group.layer_names:
            group_of.setdefault(name, group_index)
    return group_of


def _geometry(
    config: KVCacheConfig,
    layout: KVCacheLayout,
    index: int,
    tensor: KVCacheTensor,
    group_of: dict[str, int],
    *,
    max_runs: int,
) -> TensorGeometry | Problem | None:
    """Geometry of one tensor, a Problem, or ``None`` for a tensor without layers."""
    if not tensor.layers:
        return None
    first = tensor.layers[0]
    gi = group_of.get(first)
    if gi is None:
        return Problem(index, f"layer {first!r} is in no KV cache group")
    try:
        spec = config.kv_cache_groups[gi].layer_spec(first)
        n = config.num_blocks_of(tensor)
        # The kit's own strides (conformance.check.geometry), never kvref's.
        strides = layout_strides(
            spec,
            n,
            len(tensor.layers),
            layout,
            pinned=(tensor.layer_stride, tensor.block_stride, None, None, None),
        )
        page = page_geometry(spec)
        heads, states, content = page.heads, page.states, page.content
    except (KVRefError, OracleError) as exc:
        return Problem(index, f"footprint of layer {first!r} undefined: {exc}")
    try:
        if not page.layer_views:
            # Specs without layer views (HiSparse) use the raw page (contract.md#memory-safety).
            runs = page_runs(0, 1, 0, 1, page.page, max_runs=max_runs)
        else:
            runs = page_runs(strides[2], heads, strides[3], states, content, max_runs=max_runs)
    except _TooManyRunsError as exc:
        return Problem(index, f"a page of layer {first!r} has {exc} runs (budget {max_runs})")
    return TensorGeometry(index, tensor, gi, spec, n, strides, heads, states, content, runs)


def tensor_geometries(
    config: KVCacheConfig,
    layout: KVCacheLayout | str,
    *,
    host: bool = False,
    max_runs: int = DEFAULT_BUDGET,
) -> tuple[list[TensorGeometry], list[Problem]]:
    """Footprint geometry of every device (or, with ``host``, host) tensor.

    A tensor is skipped, with a :class:`Problem`, when ``layers[0]`` is in no
    group (a P6 matter), when the layout cannot express its spec (e.g. a padded
    page in LHBNC), or when one page would need more than ``max_runs`` runs.
    Tensors without layers have no pages and are left out silently.  Layers
    after the first are not looked up: the worker uses ``layers[0]``'s spec for
    all of them, and mismatches are P6 matters.

    Never raises for a well-typed config.
    """
    layout = KVCacheLayout.parse(layout)
    group_of = _group_index(config)
    geometries: list[TensorGeometry] = []
    problems: list[Problem] = []
    for index, tensor in _selected(config, host):
        got = _geometry(config, layout, index, tensor, group_of, max_runs=max_runs)
        if isinstance(got, TensorGeometry):
            geometries.append(got)
        elif got is not None:
            problems.append(got)
    return geometries, problems


def host_tensor_end(
    config: KVCacheConfig, tensor: KVCacheTensor, layout: KVCacheLayout | str = HOST_LAYOUT
) -> int | None:
    """End (exclusive) of the farthest footprint byte of ``tensor``, at ``num_blocks_of(tensor)``.

    Meant for host tensors (hence the LBNHC default) but valid for any tensor.
    ``None`` when the tensor has no pages or its footprint is undefined (see
    :func:`tensor_geometries`).  Closed-form; never raises for a well-typed config.
    """
    got = _geometry(
        config,
        KVCacheLayout.parse(layout),
        -1,
        tensor,
        _group_index(config),
        max_runs=_MIN_PAGE_RUNS,
    )
    if not isinstance(got, TensorGeometry) or got.num_pages == 0 or not got.runs.starts:
        return None
    return got.max_end


def find_unusable_tensors(
    config: KVCacheConfig, layout: KVCacheLayout | str, *, host: bool = False
) -> list[Problem]:
    """Tensors the memory checks skip: footprint undefined (see :func:`tensor_geometries`)."""
    return tensor_geometries(config, layout, host=host)[1]


# -- P2 ------------------------------------------------------------------------------


def _out_of_bounds(geometries: Iterable[TensorGeometry], limit: int) -> list[OutOfBounds]:
    found: list[OutOfBounds] = []
    for g in geometries:
        if g.num_pages == 0 or not g.runs.starts or g.max_end <= g.tensor.size:
            continue
        last, b = g.num_layers - 1, g.num_blocks - 1
        start = g.page_start(last, b)
        page = PageRef(g.tensor_index, g.tensor.layers[last], b)
        extent = (start + g.runs.starts[0], start + g.runs.end)
        found.append(OutOfBounds(page, extent, g.tensor.size))
        if len(found) >= limit:
            break
    return found


# -- run arrays ----------------------------------------------------------------------


@attrs.frozen
class _Runs:
    """Flat arrays of runs: one entry per run of one page."""

    start: _Array
    end: _Array
    block: _Array
    tensor: _Array  # tensor index
    layer: _Array  # layer index within the tensor
    group: _Array


def _dtype(geometries: Sequence[TensorGeometry]) -> Any:
    top = max((g.max_end for g in geometries), default=0)
    return np.int64 if top < _INT64_SAFE else object


def _ints(values: Sequence[int], dtype: Any) -> _Array:
    return np.array(list(values), dtype=dtype)


def _enumerate(
    geometries: Sequence[TensorGeometry],
    dtype: Any,
    blocks: Sequence[_Array],
    layers: Sequence[_Array],
) -> _Runs:
    """Enumerate the runs of each geometry's pages at the given layer and block indices."""
    parts: list[list[_Array]] = [[], [], [], [], [], []]
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
        return _Runs(empty.astype(dtype), empty.astype(dtype), empty, empty, empty, empty)
    cat = [np.concatenate(p) for p in parts]
    return _Runs(cat[0], cat[1], cat[2], cat[3], cat[4], cat[5])


def _prev_max_in_segment(first: _Array, starts: _Array, ends: _Array) -> _Array:
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
    result: _Array = out
    return result


def _page(geometries: dict[int, TensorGeometry], runs: _Runs, i: int) -> PageRef:
    t = int(runs.tensor[i])
    return PageRef(t, geometries[t].tensor.layers[int(runs.layer[i])], int(runs.block[i]))


def _overlap(a: PageRef, b: PageRef, lo: int, hi: int) -> Overlap:
    key_a = (a.block, a.tensor_index, a.layer)
    key_b = (b.block, b.tensor_index, b.layer)
    if key_b < key_a:
        a, b = b, a
    return Overlap(a, b, (lo, hi))


def _sweep_blocks(geometries: dict[int, TensorGeometry], runs: _Runs, limit: int) -> list[Overlap]:
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
        found.append(_overlap(_page(geometries, runs, rj), _page(geometries, runs, ri), lo, hi))
    return found


def _sweep_layers(geometries: dict[int, TensorGeometry], runs: _Runs, limit: int) -> list[Overlap]:
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
        found.append(_overlap(_page(geometries, runs, oj), _page(geometries, runs, oi), lo, hi))
    return found


def _self_overlaps(geometries: Iterable[TensorGeometry], limit: int) -> list[Overlap]:
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


# -- large configs: closed-form pair test over families --------------------------------


def _floor_div(a: _Array, b: _Array) -> _Array:
    return a // b


def _ceil_div(a: _Array, b: _Array) -> _Array:
    return -((-a) // b)


def _families(geometries: Sequence[TensorGeometry], dtype: Any) -> tuple[_Runs, _Array]:
    """Block-0 run of every family, and each family's block stride."""
    blocks = [np.zeros(1 if g.num_blocks else 0, dtype=np.int64) for g in geometries]
    layers = [np.arange(g.num_layers, dtype=np.int64) for g in geometries]
    runs = _enumerate(geometries, dtype, blocks, layers)
    lut = np.zeros(max((g.tensor_index for g in geometries), default=0) + 1, dtype=dtype)
    for g in geometries:
        lut[g.tensor_index] = g.strides[1]
    return runs, lut[runs.tensor]


def _pair_test(
    geometries: dict[int, TensorGeometry],
    fam: _Runs,
    stride: _Array,
    *,
    num_blocks: int,
    budget: int,
    limit: int,
) -> tuple[list[Overlap], list[Overlap], bool]:
    """Closed-form P3/P4 over all families (module docstring, step 2).

    Returns ``(P3 overlaps, P4 overlaps, decided everything)``.
    """
    p3: list[Overlap] = []
    p4: list[Overlap] = []
    x = fam.start.size
    if x == 0:
        return p3, p4, True
    n = num_blocks
    length = fam.end - fam.start
    # A family meets its own next block when its run is longer than the stride.
    if n >= 2:
        own = np.flatnonzero(np.asarray(length > stride, dtype=bool))
        for i in own[:limit]:
            b = int(stride[i])
            page0, page1 = _page(geometries, fam, int(i)), _page(geometries, fam, int(i))
            page1 = PageRef(page1.tensor_index, page1.layer, 1)
            p3.append(_overlap(page0, page1, int(fam.start[i]) + b, int(fam.end[i])))
    hull_end = fam.end + stride * (n - 1)
    order = np.argsort(fam.start, kind="stable")
    hs, he = fam.start[order], hull_end[order]
    upto = np.searchsorted(hs, he, side="left")
    counts = np.maximum(upto - np.arange(x) - 1, 0)
    total = int(counts.sum())
    if total > min(budget, _MAX_PAIRS):
        return p3, p4, False
    if total == 0:
        return p3, p4, True
    first_of = np.repeat(np.arange(x), counts)
    rank = np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)
    ii, jj = order[first_of], order[first_of + 1 + rank]
    si, ei, sj, ej = fam.start[ii], fam.end[ii], fam.start[jj], fam.end[jj]
    bi, bj = stride[ii], stride[jj]
    p, q = si - ej, ei - sj  # run i at block b meets run j at block b+m iff p < m*B < q
    same = np.asarray(bi == bj, dtype=bool)
    same_page = np.asarray((fam.tensor[ii] == fam.tensor[jj]) & (fam.layer[ii] == fam.layer[jj]))
    same_group = np.asarray(fam.group[ii] == fam.group[jj], dtype=bool)
    meet0 = np.asarray((p < 0) & (q > 0), dtype=bool)

    # P3, equal strides.
    if n >= 2:
        positive = np.asarray(bi > 0, dtype=bool)
        safe_b = np.where(positive, bi, 1)
        m_lo = _floor_div(p, safe_b) + 1
        m_hi = _ceil_div(q, safe_b) - 1
        up_lo, up_hi = np.maximum(m_lo, 1), np.minimum(m_hi, n - 1)
        dn_lo, dn_hi = np.maximum(m_lo, -(n - 1)), np.minimum(m_hi, -1)
        up = np.asarray(up_lo <= up_hi, dtype=bool)
        dn = np.asarray(dn_lo <= dn_hi, dtype=bool)
        m = np.where(up, up_lo, dn_hi)
        m = np.where(positive, m, 1)  # B == 0: every block is block 0
        hit = same & np.where(positive, up | dn, meet0)
        for k in np.flatnonzero(hit)[:limit]:
            mk = int(m[k])
            b_i = 0 if mk > 0 else -mk
            b_j = b_i + mk
            stride_k = int(bi[k])
            lo = max(int(si[k]) + b_i * stride_k, int(sj[k]) + b_j * stride_k)
            hi = min(int(ei[k]) + b_i * stride_k, int(ej[k]) + b_j * stride_k)
            a = _page(geometries, fam, int(ii[k]))
            c = _page(geometries, fam, int(jj[k]))
            page_i = PageRef(a.tensor_index, a.layer, b_i)
            page_j = PageRef(c.tensor_index, c.layer, b_j)
            p3.append(_overlap(page_i, page_j, lo, hi))
    decided = not (n >= 2 and bool(np.any(~same)))

    # P4, any strides: block b with p < b*(Bj - Bi) < q, b in [0, N).
    candidate = same_group & ~same_page
    d = bj - bi
    flip = np.asarray(d < 0, dtype=bool)
    dd = np.where(flip, -d, d)
    pp, qq = np.where(flip, -q, p), np.where(flip, -p, q)
    safe_d = np.where(np.asarray(dd > 0, dtype=bool), dd, 1)
    b_lo = np.maximum(_floor_div(pp, safe_d) + 1, 0)
    b_hi = np.minimum(_ceil_div(qq, safe_d) - 1, n - 1)
    hit4 = candidate & np.where(same, meet0, np.asarray(b_lo <= b_hi, dtype=bool))
    for k in np.flatnonzero(hit4)[:limit]:
        b = 0 if bool(same[k]) else int(b_lo[k])
        lo = max(int(si[k]) + b * int(bi[k]), int(sj[k]) + b * int(bj[k]))
        hi = min(int(ei[k]) + b * int(bi[k]), int(ej[k]) + b * int(bj[k]))
        a = _page(geometries, fam, int(ii[k]))
        c = _page(geometries, fam, int(jj[k]))
        page_i = PageRef(a.tensor_index, a.layer, b)
        page_j = PageRef(c.tensor_index, c.layer, b)
        p4.append(_overlap(page_i, page_j, lo, hi))
    return p3, p4, decided


def _ends(count: int) -> _Array:
    """Return the indices ``{0, 1, 2, count-3, count-2, count-1}`` below ``count``."""
    picked = {i for i in (0, 1, 2, count - 3, count - 2, count - 1) if 0 <= i < count}
    return np.array(sorted(picked), dtype=np.int64)


def _merge(lists: Iterable[list[Overlap]], limit: int) -> tuple[Overlap, ...]:
    seen: set[tuple[PageRef, PageRef]] = set()
    out: list[Overlap] = []
    for found in lists:
        for o in found:
            if (o.a, o.b) not in seen:
                seen.add((o.a, o.b))
                out.append(o)
    out.sort(key=lambda o: (o.byte_range, o.a.block, o.b.block))
    return tuple(out[:limit])


# -- public checks -------------------------------------------------------------------


def check_memory(
    config: KVCacheConfig,
    layout: KVCacheLayout | str,
    *,
    host: bool = False,
    limit: int = 10,
    budget: int = DEFAULT_BUDGET,
    properties: frozenset[str] = frozenset({"P2", "P3", "P4"}),
) -> MemoryReport:
    """Check P2, P3 and P4 over the device (or, with ``host``, the host) tensors of ``config``.

    ``layout`` is the resolved layout of the plan (host tensors are always
    LBNHC in vLLM, so pass that for ``host=True``).  At most ``limit``
    violations are listed per property.  Configs with more than ``budget``
    runs take the large-config path (module docstring), whose result says
    whether it was exhaustive.  Never raises for a well-typed config.
    """
    # Pages are folded analytically, so only hostile shapes need many runs per
    # page; the floor keeps tiny budgets (used in tests) from skipping tensors.
    page_cap = max(budget, _MIN_PAGE_RUNS)
    geometries, problems = tensor_geometries(config, layout, host=host, max_runs=page_cap)
    by_index = {g.tensor_index: g for g in geometries}
    total = sum(g.num_pages * len(g.runs.starts) for g in geometries)
    oob = _out_of_bounds(geometries, limit) if "P2" in properties else []
    want3, want4 = "P3" in properties, "P4" in properties
    p3: list[Overlap] = []
    p4: list[Overlap] = _self_overlaps(geometries, limit) if want4 else []
    exhaustive = True
    if want3 or want4:
        dtype = _dtype(geometries)
        if total <= budget:
            runs = _enumerate(
                geometries,
                dtype,
                [np.arange(g.num_blocks, dtype=np.int64) for g in geometries],
                [np.arange(g.num_layers, dtype=np.int64) for g in geometries],
            )
            if want3:
                p3 = _sweep_blocks(by_index, runs, limit)
            if want4:
                p4 += _sweep_layers(by_index, runs, limit)
        else:
            num_blocks = max((g.num_blocks for g in geometries), default=0)
            families = sum(g.num_layers * len(g.runs.starts) for g in geometries)
            pair3: list[Overlap] = []
            pair4: list[Overlap] = []
            decided = False
            if families <= budget:
                fam, stride = _families(geometries, dtype)
                pair3, pair4, decided = _pair_test(
                    by_index, fam, stride, num_blocks=num_blocks, budget=budget, limit=limit
                )
            exhaustive = decided
            blocks = [_ends(g.num_blocks) for g in geometries]
            layers = [np.arange(g.num_layers, dtype=np.int64) for g in geometries]
            sampled = sum(
                b.size * lay.size * len(g.runs.starts)
                for g, b, lay in zip(geometries, blocks, layers, strict=True)
            )
            if sampled > budget:
                layers = [_ends(g.num_layers) for g in geometries]
            runs = _enumerate(geometries, dtype, blocks, layers)
            if want3:
                p3 = list(_merge([pair3, _sweep_blocks(by_index, runs, limit)], limit))
            if want4:
                p4 += list(_merge([pair4, _sweep_layers(by_index, runs, limit)], limit))
    return MemoryReport(
        out_of_bounds=tuple(oob),
        block_overlaps=tuple(p3[:limit]),
        layer_overlaps=tuple(p4[:limit]),
        problems=tuple(problems),
        exhaustive=exhaustive,
        runs=total,
    )


def find_out_of_bounds(
    config: KVCacheConfig, layout: KVCacheLayout | str, *, limit: int = 10, host: bool = False
) -> list[OutOfBounds]:
    """P2: tensors with a page outside ``[0, size)``, one entry (the farthest page) per tensor.

    Offsets are non-negative by construction of the records, so only the far
    end can overflow.  Exact and O(tensors).  Skipped tensors: see
    :func:`find_unusable_tensors`.
    """
    geometries, _ = tensor_geometries(config, layout, host=host)
    return _out_of_bounds(geometries, limit)


def find_block_overlaps(
    config: KVCacheConfig,
    layout: KVCacheLayout | str,
    *,
    limit: int = 10,
    host: bool = False,
    budget: int = DEFAULT_BUDGET,
) -> list[Overlap]:
    """P3: pages of different block IDs sharing bytes, across all tensors and groups.

    Same-block pages of different groups may alias (P5) and are not reported.
    Exact up to ``budget`` runs; beyond, see :func:`check_memory` for whether
    the result is exhaustive.
    """
    report = check_memory(
        config, layout, host=host, limit=limit, budget=budget, properties=frozenset({"P3"})
    )
    return list(report.block_overlaps)


def find_layer_overlaps(
    config: KVCacheConfig,
    layout: KVCacheLayout | str,
    *,
    limit: int = 10,
    host: bool = False,
    budget: int = DEFAULT_BUDGET,
) -> list[Overlap]:
    """P4: pages of one group and one block that share bytes, and pages overlapping themselves.

    A self-overlapping page is reported once per tensor, as its first page
    with ``a == b``.  Exact up to ``budget`` runs; beyond, see
    :func:`check_memory`.
    """
    report = check_memory(
        config, layout, host=host, limit=limit, budget=budget, properties=frozenset({"P4"})
    )
    return list(report.layer_overlaps)


def find_host_out_of_bounds(
    config: KVCacheConfig,
    layout: KVCacheLayout | str = HOST_LAYOUT,
    *,
    limit: int = 10,
) -> list[OutOfBounds]:
    """P2 over host-resident tensors, with ``config.host_num_blocks`` blocks (LBNHC by default)."""
    return find_out_of_bounds(config, layout, limit=limit, host=True)


def find_host_block_overlaps(
    config: KVCacheConfig,
    layout: KVCacheLayout | str = HOST_LAYOUT,
    *,
    limit: int = 10,
    budget: int = DEFAULT_BUDGET,
) -> list[Overlap]:
    """P3 over host-resident tensors only (their own address space)."""
    return find_block_overlaps(config, layout, limit=limit, host=True, budget=budget)


def find_host_layer_overlaps(
    config: KVCacheConfig,
    layout: KVCacheLayout | str = HOST_LAYOUT,
    *,
    limit: int = 10,
    budget: int = DEFAULT_BUDGET,
) -> list[Overlap]:
    """P4 over host-resident tensors only (their own address space)."""
    return find_layer_overlaps(config, layout, limit=limit, host=True, budget=budget)
