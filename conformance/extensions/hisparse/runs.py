"""HiSparse's host pool as vLLM 0.33.0's runtime reads it: one run of pages per source layer.

vLLM's HiSparse runtime never reads the host tensors' strides block by
block.  It takes each source layer's host pages as one run of bytes
(``vllm/v1/hisparse/runtime.py``, ``HiSparseHostPool.allocate``): the run of
layer ``i`` of a host tensor starts at ``offset + i * layer_stride`` and is
``layer_stride`` bytes long; the runs, sorted by start, are laid end to end
from byte 0 of the pool (``_hisparse_registration_ranges`` adds their sizes
up from 0 and cuts each into ``host_num_blocks`` host blocks of
``size // host_num_blocks`` bytes), and the source cache is read as rows of
one dense array (``bind_source_cache`` views it ``(-1, row)``).  So a source
layer's run must be its ``host_num_blocks`` pages one after another,
``layer_stride == host_num_blocks * block_stride``, and the runs must tile the
pool from 0 in order, within ``host_num_blocks x host_block_stride`` bytes when
local ranks share one pool (contract.md#hisparse-host-runs).  A pool laid out
block-interleaved (each host block holding a page of every layer) is as safe
as LBNHC by the byte-overlap checks, and wrong for this runtime.
"""

from __future__ import annotations

from conformance.check import memory
from conformance.check.catalog import Unjudged
from conformance.check.catalog import violation as _v
from conformance.check.memory import HOST_LAYOUT
from conformance.check.observations import HostObservation
from conformance.check.violations import Violation
from conformance.extensions.hisparse.pool import HiSparsePlacement, hisparse_host_invariant
from kvref.records import KVCacheConfig

__all__ = ["host_run_findings"]

_ID = "KV-HOST-HISPARSE-RUNS"

#: (start, length, layer, tensor index) of one source layer's host run.
_Run = tuple[int, int, str, int]


def _runs(placed: KVCacheConfig) -> list[_Run]:
    """Each host layer's run, as the runtime computes it, sorted by start."""
    return sorted(
        (t.offset + i * t.layer_stride, t.layer_stride, name, k)
        for k, t in enumerate(placed.kv_cache_tensors)
        if t.host_resident
        for i, name in enumerate(t.layers)
    )


def _stride_findings(placed: KVCacheConfig, blocks: int) -> list[str]:
    """A layer whose run is not its host blocks' pages one after another."""
    out = []
    for k, t in enumerate(placed.kv_cache_tensors):
        if t.host_resident and t.layers and t.layer_stride != blocks * t.block_stride:
            out.append(
                f"host tensor {k} ({t.layers[0]!r}...) steps its layers layer_stride="
                f"{t.layer_stride} B apart and its blocks block_stride={t.block_stride} B apart: "
                "vLLM reads each source layer's host pages as one run, so a layer must span its "
                f"host_num_blocks={blocks} blocks, layer_stride={blocks * t.block_stride} B"
            )
    return out


def host_run_findings(placed: KVCacheConfig) -> list[str]:
    """What vLLM's HiSparse runtime would misread in ``placed``'s host pool, in words."""
    blocks = placed.host_num_blocks
    runs = _runs(placed)
    if not runs or blocks is None or blocks < 1:
        return []  # no host pool to read: KV-HOST-HISPARSE-POOL says why
    out = _stride_findings(placed, blocks)
    end = 0
    for start, length, name, k in runs:
        if start != end:
            out.append(
                f"source layer {name!r}'s host run (tensor {k}) starts at byte {start}, but "
                f"the runs before it end at byte {end}: vLLM lays the sorted runs end to end "
                "from byte 0 of the host pool"
            )
            break
        end = start + length
    stride = placed.host_block_stride
    if placed.shared_host_pool and stride is not None and end > blocks * stride:
        out.append(
            f"the source layers' host runs take {end} B, more than the shared pool's "
            f"host_num_blocks x host_block_stride = {blocks} x {stride} B"
        )
    return out


@hisparse_host_invariant(
    _ID,
    "HiSparse's source layers' host pages are one run per layer, tiling the pool from 0",
    anchor="hisparse-host-runs",
)
def _hisparse_runs(obs: HostObservation, got: HiSparsePlacement) -> list[Violation] | Unjudged:
    placed = got.placed
    if _unsafe(placed):
        # Pages outside the pool, overlapping or placed twice: those invariants'
        # findings, and the builder's answer leaves no sound runs to judge.
        return Unjudged("the placement's pages are not sound (see KV-HOST-*)", spoiled=True)
    return [_v(_ID, message) for message in host_run_findings(placed)][:3]


def _unsafe(placed: KVCacheConfig) -> bool:
    """Whether the plan breaks a memory-safety rule another invariant reports first.

    The runs only matter for a plan whose pages are sound: a layer in two
    tensors, pages past a backing or overlapping pages (device or host) are
    KV-PLACE-LAYER-ONCE's, KV-HOST-DEVICE-SAFE's and KV-HOST-NO-ALIAS's findings.
    """
    layers = [n for t in placed.kv_cache_tensors for n in t.layers]
    if len(layers) != len(set(layers)):
        return True
    layout = placed.kv_cache_layout or "LBNHC"
    return bool(
        memory.find_out_of_bounds(placed, layout, limit=1)
        or memory.find_block_overlaps(placed, layout, limit=1)
        or memory.find_layer_overlaps(placed, layout, limit=1)
        or memory.find_host_out_of_bounds(placed, limit=1)
        or memory.find_block_overlaps(placed, HOST_LAYOUT, limit=1, host=True)
        or memory.find_layer_overlaps(placed, HOST_LAYOUT, limit=1, host=True)
    )
