"""How vLLM 0.34's GPU worker cuts a placement into segments, in the kit's own arithmetic.

With the extensible KV cache (vLLM 0.34.0, on by default on CUDA and ROCm)
the placement Core hands the worker at ``num_blocks`` N is a reservation:
the worker cuts the one device backing into *segments* of N blocks each and
maps (commits) only a prefix of every segment, N' x its stride bytes, once
it has measured how many blocks N' <= N fit (contract.md#extensible-kv-cache):

- layer-outer block-compact layouts (LBNHC, LBHNC): one segment per layer
  region ``offset + l * layer_stride``, of ``N * block_stride`` bytes; the
  worker pads the regions apart to its mapping granule and drops the bytes
  after the last one (vLLM: ``vllm/v1/worker/extensible_kv_cache.py``,
  ``pad_kv_cache_segments`` and ``ExtensibleKVCache._segments``);
- every other layout (BLHNC, BLNHC, BHLNC, LHBNC): ``size / (N * stride)``
  segments of ``N * stride`` bytes from byte 0, ``stride`` the one block
  stride of every device tensor.

The worker refuses a placement it cannot cut (:func:`refusals`).  Everything
here is computed from the records alone, never with vLLM's or kvref's
functions; :mod:`conformance.check.worker_accept` and
:mod:`conformance.check.extensible` turn it into verdicts.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np

from conformance.check.footprint import TensorFootprint
from conformance.check.footprint_sweep import run_dtype
from kvref.layout import KVCacheLayout
from kvref.records import KVCacheConfig, KVCacheTensor

__all__ = [
    "Escape",
    "Refusal",
    "Segments",
    "committed_escapes",
    "layer_outer",
    "refusals",
    "region_escapes",
    "worker_segments",
]

#: Addresses from which the vectorised pass computes with exact Python ints.
_INT64_SAFE = 1 << 62

#: Where vLLM 0.34.0 cuts and pads the backing (cited in findings).
EXTENSIBLE = "vllm/v1/worker/extensible_kv_cache.py"


def layer_outer(layout: KVCacheLayout) -> bool:
    """Whether the worker gives every layer a segment of its own (LBNHC, LBHNC)."""
    return layout.is_block_compact and not layout.is_block_outermost


@attrs.frozen
class Segments:
    """The segments of one placement at its capacity.

    Attributes:
        capacity: the blocks every segment reserves (the placement's ``num_blocks``).
        starts: where each segment starts in the builder's backing, ascending
            (layer-outer layouts: one per layer region; empty when ``uniform``).
        strides: each of those segments' bytes per block.
        uniform: ``(count, stride)``: ``count`` segments of ``capacity x stride``
            bytes from byte 0 (every other layout).  Never enumerated: an absurd
            backing has astronomically many.
    """

    capacity: int
    starts: tuple[int, ...] = ()
    strides: tuple[int, ...] = ()
    uniform: tuple[int, int] | None = None

    @property
    def count(self) -> int:
        """How many segments there are."""
        return self.uniform[0] if self.uniform is not None else len(self.starts)

    @property
    def bytes_per_block(self) -> int:
        """Bytes one block takes over all segments: what the worker sizes its commits by."""
        if self.uniform is not None:
            count, stride = self.uniform
            return count * stride
        return sum(self.strides)

    @property
    def end(self) -> int:
        """One past the last segment's last byte."""
        if self.uniform is not None:
            count, stride = self.uniform
            return count * self.capacity * stride
        return self.committed(self.count - 1, self.capacity)[1] if self.starts else 0

    def committed(self, index: int, blocks: int) -> tuple[int, int]:
        """``[start, end)`` of segment ``index`` once ``blocks`` blocks are committed."""
        if self.uniform is not None:
            stride = self.uniform[1]
            start = index * self.capacity * stride
            return start, start + blocks * stride
        start = self.starts[index]
        return start, start + blocks * self.strides[index]

    def locate(self, byte: int) -> int:
        """Index of the segment ``byte`` falls in by its start (-1: before the first).

        A byte past the last segment falls in the last one (and lies outside it).
        """
        if self.uniform is not None:
            count, stride = self.uniform
            return min(byte // (self.capacity * stride), count - 1)
        return bisect.bisect_right(self.starts, byte) - 1

    def kept_ends(self, first: Any, blocks: int, dtype: Any) -> tuple[Any, Any]:
        """Vectorised :meth:`locate` of the bytes ``first``, and each one's segment's kept end.

        The end is ``-1`` where a byte lies before every segment.
        """
        if self.uniform is not None:
            count, stride = self.uniform
            index = np.minimum(first // (self.capacity * stride), count - 1)
            return index, index * (self.capacity * stride) + blocks * stride
        starts = np.array(self.starts, dtype=dtype)
        ends = np.array([self.committed(k, blocks)[1] for k in range(self.count)], dtype=dtype)
        index = np.searchsorted(starts, first, side="right") - 1
        return index, np.where(index >= 0, ends[np.maximum(index, 0)], -1)


@attrs.frozen
class Refusal:
    """One rule of the worker a placement breaks.

    Attributes:
        rule: the rule, in a few words (``"layer stride"``, ``"tiling"``...).
        detail: what the placement does, with its numbers.
        vllm_says: vLLM's own assertion or error message, and where it is raised.
        layer: the layer concerned, when one is.
    """

    rule: str
    detail: str
    vllm_says: str
    layer: str | None = None


def _device(config: KVCacheConfig) -> list[tuple[int, KVCacheTensor]]:
    return [(i, t) for i, t in enumerate(config.kv_cache_tensors) if not t.host_resident]


def _region_refusals(config: KVCacheConfig) -> list[Refusal]:
    """What ``pad_kv_cache_segments`` and ``_segments`` refuse in LBNHC/LBHNC."""
    n = config.num_blocks
    out: list[Refusal] = []
    for i, t in _device(config):
        # Every tensor, one-layer tensors too: the worker moves whole N-block regions.
        if t.layer_stride != n * t.block_stride:
            out.append(
                Refusal(
                    "layer stride",
                    f"tensor {i} has layer_stride={t.layer_stride}, not num_blocks x "
                    f"block_stride = {n} x {t.block_stride} = {n * t.block_stride}",
                    f"AssertionError in pad_kv_cache_segments ({EXTENSIBLE})",
                    layer=t.layers[0] if t.layers else None,
                )
            )
    if out:
        return out
    lengths: dict[int, set[int]] = {}
    strides: dict[int, set[int]] = {}
    owner: dict[int, str] = {}
    for _, t in _device(config):
        for index, name in enumerate(t.layers):
            start = t.offset + index * t.layer_stride
            lengths.setdefault(start, set()).add(t.layer_stride)
            strides.setdefault(start, set()).add(t.block_stride)
            owner.setdefault(start, name)
    for start in sorted(strides):
        if len(strides[start]) > 1:
            out.append(
                Refusal(
                    "aliased block strides",
                    f"layers starting at byte {start} (of group tensors that alias the region) "
                    f"step different block strides {sorted(strides[start])}",
                    f"ValueError in ExtensibleKVCache._segments ({EXTENSIBLE}): 'KV cache "
                    f"tensors alias offset {start} with different block strides.'",
                    layer=owner[start],
                )
            )
    if out:
        return out
    end = 0
    for start in sorted(lengths):
        if start != end:
            where = (
                f"the regions before it end at byte {end}, a gap"
                if end and start > end
                else f"the regions before it end at byte {end}, an overlap"
                if end
                else "not at byte 0"
            )
            out.append(
                Refusal(
                    "tiling",
                    f"the layer regions must tile the backing from byte 0: the region of "
                    f"{owner[start]!r} starts at byte {start}, {where}",
                    f"AssertionError in pad_kv_cache_segments ({EXTENSIBLE}): 'KV cache "
                    "tensors do not tile the allocation.'",
                    layer=owner[start],
                )
            )
            break
        end = start + max(lengths[start])
    return out


def _block_refusals(config: KVCacheConfig) -> list[Refusal]:
    """What ``_segments`` refuses in BLHNC, BLNHC, BHLNC and LHBNC."""
    device = _device(config)
    strides = sorted({t.block_stride for _, t in device})
    if len(strides) > 1:
        return [
            Refusal(
                "one block stride",
                f"device tensors step {len(strides)} block strides {strides[:4]}; the worker "
                "cuts the backing by one",
                f"ValueError in ExtensibleKVCache._segments ({EXTENSIBLE}): 'KV cache tensors "
                "with different block strides need a block-compact layer-outermost layout for "
                "the extensible KV cache.'",
            )
        ]
    size = device[0][1].size
    segment = config.num_blocks * strides[0]
    if segment == 0:
        return [
            Refusal(
                "whole segments",
                f"block_stride={strides[0]} at num_blocks={config.num_blocks} makes segments "
                "of 0 bytes",
                f"ZeroDivisionError in ExtensibleKVCache._segments ({EXTENSIBLE})",
            )
        ]
    if size % segment:
        return [
            Refusal(
                "whole segments",
                f"the backing of {size} bytes is not a whole number of num_blocks x "
                f"block_stride = {config.num_blocks} x {strides[0]} = {segment}-byte segments "
                f"({size // segment} whole segments and {size % segment} bytes over)",
                f"ValueError in ExtensibleKVCache._segments ({EXTENSIBLE}): 'KV cache "
                f"allocation of {size} bytes is not a whole number of {config.num_blocks}-block "
                "segments.'",
            )
        ]
    return []


def _one_size(config: KVCacheConfig) -> bool:
    return len({t.size for _, t in _device(config)}) == 1


def refusals(config: KVCacheConfig, layout: KVCacheLayout) -> list[Refusal]:
    """The rules of vLLM 0.34's worker that ``config`` breaks (``layout``'s family only).

    Empty too when there is nothing to cut: no device tensor, or several
    backing sizes (which the one-backing rule reports).
    """
    if not _device(config) or not _one_size(config):
        return []
    return _region_refusals(config) if layer_outer(layout) else _block_refusals(config)


def worker_segments(config: KVCacheConfig, layout: KVCacheLayout) -> Segments | None:
    """The segments the worker cuts ``config`` into (``None``: it cannot, see :func:`refusals`)."""
    if not _device(config) or not _one_size(config) or refusals(config, layout):
        return None
    n = config.num_blocks
    if layer_outer(layout):
        first: dict[int, int] = {}
        for _, t in _device(config):
            for index in range(len(t.layers)):
                first.setdefault(t.offset + index * t.layer_stride, t.block_stride)
        starts = sorted(first)
        return Segments(n, tuple(starts), tuple(first[s] for s in starts))
    device = _device(config)
    stride = device[0][1].block_stride
    return Segments(n, uniform=(device[0][1].size // (n * stride), stride))


@attrs.frozen
class Escape:
    """A run of a page outside where the worker keeps it.

    Attributes:
        tensor_index: the tensor, in ``config.kv_cache_tensors``.
        layer: the layer.
        block: the block.
        byte_range: the run's bytes, end exclusive, in the builder's backing.
        segment: ``[start, end)`` of the bytes the run should lie in (the
            segment its start falls in, as far as it is kept), or ``None``
            when it starts before every segment.
    """

    tensor_index: int
    layer: str
    block: int
    byte_range: tuple[int, int]
    segment: tuple[int, int] | None


def _first_escape(
    segments: Segments, committed: int, start: int, step: int, length: int, blocks: int
) -> tuple[int, tuple[int, int] | None] | None:
    """The first block below ``blocks`` whose run ``[start + b*step, +length)`` is not kept.

    Walks segment by segment (a run moves monotonically with the block), so
    the cost is the number of segments the run crosses.
    """
    block = 0
    while block < blocks:
        at = start + block * step
        k = segments.locate(at)
        if k < 0:
            return block, None
        lo, hi = segments.committed(k, committed)
        if at + length > hi:
            return block, (lo, hi)
        if step == 0:
            return None
        # The last block of this walk still inside segment k's kept bytes.
        block = (hi - length - start) // step + 1
    return None


def committed_escapes(
    geometries: Sequence[TensorFootprint], segments: Segments, committed: int, *, limit: int = 3
) -> list[Escape]:
    """Runs of blocks ``b < committed`` outside their segment's committed prefix.

    ``geometries`` are the capacity placement's pages (its strides: Core
    shrinks the config without moving a byte, and the worker keeps the
    reservation's addresses).  At ``committed == capacity`` this is "every
    page lies inside one segment", which matters in layer-outer layouts,
    whose regions the worker pads apart.  Exact: every (layer, run) is walked
    over the segments it crosses, after a vectorised pass that clears the
    runs that stay in one segment.
    """
    found: list[Escape] = []
    if committed <= 0:
        return found
    # Exact Python ints where an address could overflow int64 arithmetic.
    dtype = object if segments.end >= _INT64_SAFE else run_dtype(geometries)
    for g in geometries:
        if g.num_pages == 0 or not g.runs.starts:
            continue
        step = g.strides[1]
        layers = np.arange(g.num_layers, dtype=dtype) * g.strides[0] + g.tensor.offset
        rel = np.array(g.runs.starts, dtype=dtype)
        lengths = np.array(g.runs.lengths, dtype=dtype)
        first = (layers[:, None] + rel[None, :]).ravel()
        length = np.broadcast_to(lengths, (g.num_layers, len(rel))).ravel()
        index, ends = segments.kept_ends(first, committed, dtype)
        last_end = first + (committed - 1) * step + length
        stays = (index >= 0) & (last_end <= ends)
        for flat in np.flatnonzero(~stays):
            layer_index = int(flat) // len(rel)
            start, run_length = int(first[flat]), int(length[flat])
            hit = _first_escape(segments, committed, start, step, run_length, committed)
            if hit is None:
                continue
            block, segment = hit
            at = start + block * step
            found.append(
                Escape(
                    g.tensor_index,
                    g.tensor.layers[layer_index],
                    block,
                    (at, at + run_length),
                    segment,
                )
            )
            if len(found) >= limit:
                return found
    return found


def region_escapes(
    geometries: Sequence[TensorFootprint], segments: Segments, *, limit: int = 3
) -> list[Escape]:
    """Runs of pages outside their own layer region (layer-outer layouts, at the capacity).

    The worker pads the regions apart and drops the bytes after the last
    one, so a page that reaches past its region reads padding, another
    layer's region or nothing at all.
    """
    return committed_escapes(geometries, segments, segments.capacity, limit=limit)
