"""The footprint of every page of a :class:`~kvref.records.KVCacheConfig`.

The properties are those of contract.md#memory-safety.

For tensor ``t`` with per-layer spec ``s`` (the spec of ``t.layers[0]`` in the
first group that holds it, as a worker resolves it), ``N =
config.num_blocks_of(t)`` and strides ``(Ls, Bs, Hs, Ss, 1)`` from
:func:`conformance.check.geometry.layout_strides` with ``L`` and ``B`` pinned
to the tensor's, the page of layer index ``l`` at block ``b`` is::

    F(t,l,b) = U_{h<H, n<S} [offset + l*Ls + b*Bs + h*Hs + n*Ss, ... + C)

A page is reduced analytically to a few disjoint *runs* relative to its start
(:func:`page_runs`): axes whose stride equals the run length so far are folded
into it, so a dense page is one run of ``H*S*C`` bytes and an LHBNC/BHLNC page
is ``H`` runs of ``S*C`` bytes.

This module holds the records the memory checks report with, the geometry of
each tensor (:func:`tensor_footprints`) and the closed-form checks: P2
(:func:`out_of_bounds`: strides are non-negative, so the farthest byte is that
of the last layer at the last block) and :func:`host_tensor_end`.  The
overlap checks are :mod:`conformance.check.memory`'s.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import cast

import attrs

from conformance.check.worker_model import (
    WorkerError,
    WorkerTensor,
    first_group_of,
    worker_tensor,
)
from kvref.axes import HOST_LAYOUT as _HOST_LAYOUT
from kvref.errors import KVRefError
from kvref.layout import KVCacheLayout
from kvref.records import KVCacheConfig, KVCacheTensor
from kvref.specs import KVCacheSpec

__all__ = [
    "DEFAULT_BUDGET",
    "HOST_LAYOUT",
    "MIN_PAGE_RUNS",
    "OutOfBounds",
    "Overlap",
    "PageRef",
    "PageRuns",
    "Problem",
    "TensorFootprint",
    "find_unusable_tensors",
    "host_tensor_end",
    "out_of_bounds",
    "page_runs",
    "tensor_footprints",
]

#: Runs (pages times runs per page) enumerated before switching to the large-config path.
DEFAULT_BUDGET = 4_000_000

#: Layout of host-resident tensors: always LBNHC (contract.md#host-residency).
HOST_LAYOUT = _HOST_LAYOUT

#: Runs one page may have before its tensor is skipped as a Problem (at least).
MIN_PAGE_RUNS = 1 << 16


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
class TensorFootprint:
    """The footprint of one tensor's pages (contract.md#memory-safety), on the worker's view of it.

    Attributes:
        view: the tensor as a worker views it (extents and byte strides).
        group_index: index of the group holding ``tensor.layers[0]``.
        num_blocks: ``config.num_blocks_of(tensor)``.
        runs: one page's runs (see :func:`page_runs`).

    """

    view: WorkerTensor
    group_index: int
    num_blocks: int
    runs: PageRuns

    @property
    def tensor_index(self) -> int:
        """Index in ``config.kv_cache_tensors``."""
        return self.view.index

    @property
    def tensor(self) -> KVCacheTensor:
        """The tensor record."""
        return self.view.tensor

    @property
    def spec(self) -> KVCacheSpec:
        """The per-layer spec of ``tensor.layers[0]``, used for every layer of the tensor."""
        # A footprint is made only for a tensor with layers, whose view has a spec.
        return cast(KVCacheSpec, self.view.spec)

    @property
    def strides(self) -> tuple[int, int, int, int, int]:
        """Byte strides ``(L, B, H, S, C)``."""
        return self.view.strides

    @property
    def heads(self) -> int:
        """``H`` of one page."""
        return self.view.shape[2]

    @property
    def states(self) -> int:
        """``S`` of one page."""
        return self.view.shape[3]

    @property
    def content(self) -> int:
        """``C`` of one page, in bytes."""
        return self.view.shape[4]

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


def _geometry(
    config: KVCacheConfig,
    layout: KVCacheLayout,
    index: int,
    tensor: KVCacheTensor,
    group_of: dict[str, int],
    *,
    max_runs: int,
) -> TensorFootprint | Problem | None:
    """Footprint of one tensor, a Problem, or ``None`` for a tensor without layers."""
    if not tensor.layers:
        return None
    first = tensor.layers[0]
    gi = group_of.get(first)
    if gi is None:
        return Problem(index, f"layer {first!r} is in no KV cache group")
    try:
        # The kit's own worker model and strides, never kvref's.
        view = worker_tensor(config, index, tensor, layout, gi)
        n = config.num_blocks_of(tensor)
    except (KVRefError, WorkerError) as exc:
        return Problem(index, f"footprint of layer {first!r} undefined: {_cause(exc)}")
    page = view.page
    if page is None:  # pragma: no cover - a tensor with layers has a page
        return None
    _, _, heads, states, content = view.shape
    try:
        if not page.layer_views:
            # Specs without layer views (HiSparse) use the raw page (contract.md#memory-safety).
            runs = page_runs(0, 1, 0, 1, page.page, max_runs=max_runs)
        else:
            runs = page_runs(
                view.strides[2], heads, view.strides[3], states, content, max_runs=max_runs
            )
    except _TooManyRunsError as exc:
        return Problem(index, f"a page of layer {first!r} has {exc} runs (budget {max_runs})")
    return TensorFootprint(view, gi, n, runs)


def _cause(exc: Exception) -> BaseException:
    # The worker names the tensor itself; the Problem does, so keep the cause's words.
    return exc.__cause__ if isinstance(exc, WorkerError) and exc.__cause__ is not None else exc


def tensor_footprints(
    config: KVCacheConfig,
    layout: KVCacheLayout | str,
    *,
    host: bool = False,
    max_runs: int = DEFAULT_BUDGET,
) -> tuple[list[TensorFootprint], list[Problem]]:
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
    group_of = first_group_of(config.kv_cache_groups)
    geometries: list[TensorFootprint] = []
    problems: list[Problem] = []
    for index, tensor in _selected(config, host):
        got = _geometry(config, layout, index, tensor, group_of, max_runs=max_runs)
        if isinstance(got, TensorFootprint):
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
    :func:`tensor_footprints`).  Closed-form; never raises for a well-typed config.
    """
    got = _geometry(
        config,
        KVCacheLayout.parse(layout),
        -1,
        tensor,
        first_group_of(config.kv_cache_groups),
        max_runs=MIN_PAGE_RUNS,
    )
    if not isinstance(got, TensorFootprint) or got.num_pages == 0 or not got.runs.starts:
        return None
    return got.max_end


def find_unusable_tensors(
    config: KVCacheConfig, layout: KVCacheLayout | str, *, host: bool = False
) -> list[Problem]:
    """Tensors the memory checks skip: footprint undefined (see :func:`tensor_footprints`)."""
    return tensor_footprints(config, layout, host=host)[1]


# -- P2 ------------------------------------------------------------------------------


def out_of_bounds(geometries: Iterable[TensorFootprint], limit: int) -> list[OutOfBounds]:
    """P2: tensors whose farthest page ends past their backing (that page, per tensor)."""
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
