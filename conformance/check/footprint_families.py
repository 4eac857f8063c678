"""P3 and P4 of large configs without enumerating every page (contract.md#memory-safety).

When a config has more runs than the budget, :func:`large_config_overlaps`
decides P3 and P4 this way:

1. *Families* are checked pairwise in closed form (:func:`pair_test`).  A
   family is one run ``k`` of one layer ``l`` of one tensor across all blocks:
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
2. Every tensor's pages at blocks ``{0, 1, 2, N-3, N-2, N-1}`` (and, if even
   that exceeds the budget, only layers ``{0, 1, 2, L-3, L-2, L-1}``) are
   enumerated and swept exactly (:mod:`conformance.check.footprint_sweep`),
   which catches different-stride P3 violations near the ends of the block
   range, where an overlapping layer-outer region shows first.

The result is not exhaustive when step 1 could not decide everything (a
different-stride candidate pair, more than ``budget`` families, or more
candidate pairs than ``min(budget, 1_000_000)``); the violations reported are
real either way.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import attrs
import numpy as np

from conformance.check.footprint import Overlap, PageRef, TensorFootprint
from conformance.check.footprint_sweep import (
    Array,
    Runs,
    enumerate_runs,
    ordered_overlap,
    run_page,
    sweep_blocks,
    sweep_layers,
)

__all__ = ["families", "large_config_overlaps", "pair_test", "periodic_clean"]

# Candidate family pairs evaluated at once (about 20 arrays of this length).
_MAX_PAIRS = 1_000_000


def _floor_div(a: Array, b: Array) -> Array:
    return a // b


def _ceil_div(a: Array, b: Array) -> Array:
    return -((-a) // b)


def families(geometries: Sequence[TensorFootprint], dtype: Any) -> tuple[Runs, Array]:
    """Block-0 run of every family, and each family's block stride."""
    blocks = [np.zeros(1 if g.num_blocks else 0, dtype=np.int64) for g in geometries]
    layers = [np.arange(g.num_layers, dtype=np.int64) for g in geometries]
    runs = enumerate_runs(geometries, dtype, blocks, layers)
    lut = np.zeros(max((g.tensor_index for g in geometries), default=0) + 1, dtype=dtype)
    for g in geometries:
        lut[g.tensor_index] = g.strides[1]
    return runs, lut[runs.tensor]


@attrs.frozen
class _Pairs:
    """Candidate family pairs ``(i, j)``: their block-0 runs and block strides."""

    i: Array
    j: Array
    si: Array
    ei: Array
    sj: Array
    ej: Array
    bi: Array
    bj: Array

    @property
    def p(self) -> Array:
        """Run ``i`` at block ``b`` meets run ``j`` at block ``b+m`` iff ``p < m*B < q``."""
        return self.si - self.ej

    @property
    def q(self) -> Array:
        """See :attr:`p`."""
        return self.ei - self.sj

    @property
    def same_stride(self) -> Array:
        """Pairs whose families step blocks alike."""
        return np.asarray(self.bi == self.bj, dtype=bool)

    @property
    def meet_at_zero(self) -> Array:
        """Pairs whose runs meet at the same block (``m = 0``)."""
        return np.asarray((self.p < 0) & (self.q > 0), dtype=bool)

    def pages(
        self, geometries: dict[int, TensorFootprint], fam: Runs, k: int, b_i: int, b_j: int
    ) -> tuple[PageRef, PageRef]:
        """The pages of pair ``k`` at blocks ``b_i`` and ``b_j``."""
        a = run_page(geometries, fam, int(self.i[k]))
        c = run_page(geometries, fam, int(self.j[k]))
        return PageRef(a.tensor_index, a.layer, b_i), PageRef(c.tensor_index, c.layer, b_j)


def _own_blocks(
    geometries: dict[int, TensorFootprint], fam: Runs, stride: Array, limit: int
) -> list[Overlap]:
    """P3 of a family with itself: its run is longer than the block stride."""
    found: list[Overlap] = []
    length = fam.end - fam.start
    for i in np.flatnonzero(np.asarray(length > stride, dtype=bool))[:limit]:
        b = int(stride[i])
        page0 = run_page(geometries, fam, int(i))
        page1 = PageRef(page0.tensor_index, page0.layer, 1)
        found.append(ordered_overlap(page0, page1, int(fam.start[i]) + b, int(fam.end[i])))
    return found


def _candidates(fam: Runs, stride: Array, num_blocks: int, most: int) -> _Pairs | None:
    """Family pairs whose hulls intersect (``None``: more than ``most`` of them)."""
    x = fam.start.size
    hull_end = fam.end + stride * (num_blocks - 1)
    order = np.argsort(fam.start, kind="stable")
    hs, he = fam.start[order], hull_end[order]
    upto = np.searchsorted(hs, he, side="left")
    counts = np.maximum(upto - np.arange(x) - 1, 0)
    total = int(counts.sum())
    if total > most:
        return None
    first_of = np.repeat(np.arange(x), counts)
    rank = np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)
    ii, jj = order[first_of], order[first_of + 1 + rank]
    return _Pairs(
        i=ii,
        j=jj,
        si=fam.start[ii],
        ei=fam.end[ii],
        sj=fam.start[jj],
        ej=fam.end[jj],
        bi=stride[ii],
        bj=stride[jj],
    )


def _equal_stride_blocks(
    geometries: dict[int, TensorFootprint], fam: Runs, pairs: _Pairs, n: int, limit: int
) -> list[Overlap]:
    """P3 of pairs with one block stride: an ``m`` with ``1 <= |m| <= n-1`` in ``(p/B, q/B)``."""
    p, q, bi = pairs.p, pairs.q, pairs.bi
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
    hit = pairs.same_stride & np.where(positive, up | dn, pairs.meet_at_zero)
    found: list[Overlap] = []
    for k in np.flatnonzero(hit)[:limit]:
        mk = int(m[k])
        b_i = 0 if mk > 0 else -mk
        b_j = b_i + mk
        stride_k = int(bi[k])
        lo = max(int(pairs.si[k]) + b_i * stride_k, int(pairs.sj[k]) + b_j * stride_k)
        hi = min(int(pairs.ei[k]) + b_i * stride_k, int(pairs.ej[k]) + b_j * stride_k)
        page_i, page_j = pairs.pages(geometries, fam, int(k), b_i, b_j)
        found.append(ordered_overlap(page_i, page_j, lo, hi))
    return found


def _same_block_layers(
    geometries: dict[int, TensorFootprint], fam: Runs, pairs: _Pairs, n: int, limit: int
) -> list[Overlap]:
    """P4, any strides: a block ``b < n`` with ``p < b*(Bj - Bi) < q``, same group, two pages."""
    ii, jj = pairs.i, pairs.j
    same_page = np.asarray((fam.tensor[ii] == fam.tensor[jj]) & (fam.layer[ii] == fam.layer[jj]))
    same_group = np.asarray(fam.group[ii] == fam.group[jj], dtype=bool)
    same = pairs.same_stride
    p, q = pairs.p, pairs.q
    d = pairs.bj - pairs.bi
    flip = np.asarray(d < 0, dtype=bool)
    dd = np.where(flip, -d, d)
    pp, qq = np.where(flip, -q, p), np.where(flip, -p, q)
    safe_d = np.where(np.asarray(dd > 0, dtype=bool), dd, 1)
    b_lo = np.maximum(_floor_div(pp, safe_d) + 1, 0)
    b_hi = np.minimum(_ceil_div(qq, safe_d) - 1, n - 1)
    candidate = same_group & ~same_page
    hit = candidate & np.where(same, pairs.meet_at_zero, np.asarray(b_lo <= b_hi, dtype=bool))
    found: list[Overlap] = []
    for k in np.flatnonzero(hit)[:limit]:
        b = 0 if bool(same[k]) else int(b_lo[k])
        lo = max(int(pairs.si[k]) + b * int(pairs.bi[k]), int(pairs.sj[k]) + b * int(pairs.bj[k]))
        hi = min(int(pairs.ei[k]) + b * int(pairs.bi[k]), int(pairs.ej[k]) + b * int(pairs.bj[k]))
        page_i, page_j = pairs.pages(geometries, fam, int(k), b, b)
        found.append(ordered_overlap(page_i, page_j, lo, hi))
    return found


def pair_test(
    geometries: dict[int, TensorFootprint],
    fam: Runs,
    stride: Array,
    *,
    num_blocks: int,
    budget: int,
    limit: int,
) -> tuple[list[Overlap], list[Overlap], bool]:
    """Closed-form P3/P4 over all families (module docstring, step 1).

    Returns ``(P3 overlaps, P4 overlaps, decided everything)``.
    """
    p3: list[Overlap] = []
    p4: list[Overlap] = []
    if fam.start.size == 0:
        return p3, p4, True
    n = num_blocks
    # A family meets its own next block when its run is longer than the stride.
    if n >= 2:
        p3 += _own_blocks(geometries, fam, stride, limit)
    pairs = _candidates(fam, stride, n, min(budget, _MAX_PAIRS))
    if pairs is None:
        return p3, p4, False
    if pairs.i.size == 0:
        return p3, p4, True
    if n >= 2:
        p3 += _equal_stride_blocks(geometries, fam, pairs, n, limit)
    decided = not (n >= 2 and bool(np.any(~pairs.same_stride)))
    p4 += _same_block_layers(geometries, fam, pairs, n, limit)
    return p3, p4, decided


def _end_indices(count: int) -> Array:
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


def large_config_overlaps(
    geometries: Sequence[TensorFootprint],
    dtype: Any,
    *,
    budget: int,
    limit: int,
    want3: bool,
    want4: bool,
) -> tuple[list[Overlap], list[Overlap], bool]:
    """P3 and P4 (pages overlapping themselves aside) of a config over ``budget`` runs.

    Returns ``(P3 overlaps, P4 overlaps, exhaustive)`` (module docstring).
    """
    by_index = {g.tensor_index: g for g in geometries}
    num_blocks = max((g.num_blocks for g in geometries), default=0)
    count = sum(g.num_layers * len(g.runs.starts) for g in geometries)
    pair3: list[Overlap] = []
    pair4: list[Overlap] = []
    decided = False
    if count <= budget:
        fam, stride = families(geometries, dtype)
        pair3, pair4, decided = pair_test(
            by_index, fam, stride, num_blocks=num_blocks, budget=budget, limit=limit
        )
    blocks = [_end_indices(g.num_blocks) for g in geometries]
    layers = [np.arange(g.num_layers, dtype=np.int64) for g in geometries]
    sampled = sum(
        b.size * lay.size * len(g.runs.starts)
        for g, b, lay in zip(geometries, blocks, layers, strict=True)
    )
    if sampled > budget:
        layers = [_end_indices(g.num_layers) for g in geometries]
    runs = enumerate_runs(geometries, dtype, blocks, layers)
    p3 = list(_merge([pair3, sweep_blocks(by_index, runs, limit)], limit)) if want3 else []
    p4 = list(_merge([pair4, sweep_layers(by_index, runs, limit)], limit)) if want4 else []
    return p3, p4, decided


def periodic_clean(geometries: Sequence[TensorFootprint], dtype: Any, *, budget: int) -> bool:
    """The pair test (step 1) decides P3 and P4 for every family and finds no overlap.

    Only a proof of absence: ``False`` means "not shown clean", never "overlaps",
    so a caller enumerates then, and a finding is always reported from the
    enumerated runs.  Tensors with different block counts are not compared in
    closed form (the pair test assumes one block range).
    """
    if len({g.num_blocks for g in geometries}) > 1:
        return False
    if sum(g.num_layers * len(g.runs.starts) for g in geometries) > budget:
        return False
    fam, stride = families(geometries, dtype)
    by_index = {g.tensor_index: g for g in geometries}
    num_blocks = geometries[0].num_blocks if geometries else 0
    p3, p4, decided = pair_test(
        by_index, fam, stride, num_blocks=num_blocks, budget=budget, limit=1
    )
    return decided and not p3 and not p4
