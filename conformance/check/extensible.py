"""The extensible KV cache: placements judged at the block counts vLLM commits.

See contract.md#extensible-kv-cache.

From vLLM 0.34.0 (``Rules.extensible_kv_cache``) the ``num_blocks`` N Core
plans is a capacity.  The worker reserves the placement's address space,
measures how many blocks N' <= N fit, and Core then lowers ``num_blocks``
to N' in place without calling the builder again
(``shrink_kv_cache_configs``, vllm/v1/core/kv_cache_planning.py: device
sizes scaled, every offset and stride kept); the worker maps only the first
N' x stride bytes of each segment (``ExtensibleKVCache.commit``,
vllm/v1/worker/extensible_kv_cache.py).

- ``KV-WORKER-COMMITTED``: at several committed counts N' < N (1, 2, N // 2
  and N - 1), every page of a block b < N' lies in its segment's committed
  prefix.  Judged on the capacity placement's own pages, the shrink done
  here (no builder call): the shrunk config's ``size`` is never a bound,
  since a layer-outer config's offsets still describe the reservation.
- ``KV-WORKER-POOL-BYTES``: the bytes per block Core plans the capacity with
  (``_get_pool_bytes_per_block``, or its one-block probe) are the bytes per
  block the worker derives from the segments (the sum of their strides).

Segments are :mod:`conformance.check.segments`' own arithmetic.
"""

from __future__ import annotations

import attrs

from conformance.check.catalog import Unjudged
from conformance.check.catalog import violation as _v
from conformance.check.footprint import MIN_PAGE_RUNS, tensor_footprints
from conformance.check.observations import PlacementObservation
from conformance.check.placement import device_size, first_findings, honest_configs
from conformance.check.segments import Escape, committed_escapes, worker_segments
from conformance.check.violations import Violation
from conformance.check.worker_accept import (
    capacity_first,
    extensible_gate,
    register_extensible,
)
from kvref.records import KVCacheConfig

__all__ = ["committed_counts", "shrunk"]

_PLANNING = "vllm/v1/core/kv_cache_planning.py"
_EXTENSIBLE = "vllm/v1/worker/extensible_kv_cache.py"


def committed_counts(capacity: int) -> list[int]:
    """The committed counts N' < ``capacity`` judged: 1, 2, half and one short of it."""
    return sorted({k for k in (1, 2, capacity // 2, capacity - 1) if 1 <= k < capacity})


def shrunk(config: KVCacheConfig, committed: int) -> KVCacheConfig:
    """``config`` lowered to ``committed`` blocks as vLLM 0.34's Core does, without the builder.

    Device tensors get ``committed * size // num_blocks`` bytes; host-resident
    ones, every offset and every stride are kept.
    """
    n = config.num_blocks
    tensors = [
        t if t.host_resident else attrs.evolve(t, size=committed * t.size // n)
        for t in config.kv_cache_tensors
    ]
    return attrs.evolve(config, num_blocks=committed, kv_cache_tensors=tensors)


def _escape_message(obs: PlacementObservation, config: KVCacheConfig, k: int, e: Escape) -> str:
    n = config.num_blocks
    size = device_size(config) or 0
    low = shrunk(config, k)
    where = (
        f"outside the committed bytes [{e.segment[0]}, {e.segment[1]}) of its segment"
        if e.segment is not None
        else "before every segment"
    )
    return (
        f"reserved at {n} blocks, committed at N'={k}: tensor {e.tensor_index}'s page of block "
        f"{e.block} has bytes [{e.byte_range[0]}, {e.byte_range[1]}), {where}.  "
        f"vLLM {obs.config.vllm_version}'s Core lowers num_blocks from {n} to {k} in place "
        f"without asking the builder (shrink_kv_cache_configs, {_PLANNING}: the device size "
        f"becomes {size} x {k} // {n} = {device_size(low)}, offsets and strides stay) and its "
        f"worker maps only the first N' x stride bytes of every segment "
        f"(ExtensibleKVCache.commit, {_EXTENSIBLE}), so the page reads unmapped memory"
    )


def _committed(obs: PlacementObservation) -> list[Violation] | Unjudged | None:
    gate = extensible_gate(obs)
    if gate is not None:
        return gate
    configs = honest_configs(obs)
    if configs is None:
        return None
    judged = False
    for n, c in capacity_first(obs, configs):
        segments = worker_segments(c, obs.layout)
        if segments is None or n < 2:
            # A placement the worker refuses is KV-WORKER-*-REGIONS/SEGMENTS' finding.
            continue
        judged = True
        geometries, _ = tensor_footprints(c, obs.layout, max_runs=MIN_PAGE_RUNS)
        for k in committed_counts(n):
            found = committed_escapes(geometries, segments, k, limit=1)
            if found:
                e = found[0]
                return [
                    _v(
                        "",
                        _escape_message(obs, c, k, e),
                        layer=e.layer,
                        block=e.block,
                        byte_range=e.byte_range,
                    )
                ]
    if not judged:
        return Unjudged("no placement of two blocks or more that the worker can cut into segments")
    return []


def _probe(obs: PlacementObservation) -> tuple[int, str] | None:
    """The bytes per block Core plans with, and where they come from (``None``: none)."""
    declared = obs.declared_pool_bytes
    if declared is not None:
        return declared, "the builder's _get_pool_bytes_per_block"
    one = obs.config_at(1)
    size = None if one is None else device_size(one)
    if size is None:
        # No one-block placement, or several backings: Core's probe raises
        # (KV-WORKER-ONE-BACKING reports that).
        return None
    return size, "Core's one-block probe of the placement"


def _pool_bytes(obs: PlacementObservation) -> list[Violation] | Unjudged | None:
    gate = extensible_gate(obs)
    if gate is not None:
        return gate
    if obs.pool_bytes is None:
        return Unjudged("no groups: Core never asks _get_pool_bytes_per_block about none")
    if not obs.pool_bytes.ok:
        return None
    planned = _probe(obs)
    configs = honest_configs(obs)
    if planned is None or configs is None:
        return None
    pool, source = planned
    return first_findings(
        capacity_first(obs, configs), lambda n, c: _pool_finding(obs, pool, source, n, c)
    )


def _pool_finding(
    obs: PlacementObservation, pool: int, source: str, n: int, c: KVCacheConfig
) -> list[Violation]:
    """The finding that the worker cuts ``c`` (at ``n`` blocks) other than ``pool`` plans."""
    segments = worker_segments(c, obs.layout)
    if segments is None or pool == segments.bytes_per_block:
        return []
    worker = segments.bytes_per_block
    effect = (
        "Core reserves fewer blocks than the memory holds, and the worker never commits more "
        "than Core reserved"
        if pool > worker
        else "Core reserves address space for more blocks than the memory holds"
    )
    return [
        _v(
            "",
            f"Core plans the capacity with {pool} bytes per block ({source}), but at {n} "
            f"blocks vLLM {obs.config.vllm_version}'s worker cuts the placement into "
            f"{segments.count} segments of {worker} bytes per block in all (the sum of "
            f"their block strides, ExtensibleKVCache.bytes_per_block, {_EXTENSIBLE}) and "
            f"commits blocks by that: {effect} (finalize_extensible_kv_cache, {_PLANNING})",
        )
    ]


register_extensible(
    "KV-WORKER-COMMITTED",
    "pages of the blocks vLLM commits lie in their segments' committed bytes (the capacity "
    "lowered in place)",
    "extensible-kv-cache",
    _committed,
    module=__name__,
)
register_extensible(
    "KV-WORKER-POOL-BYTES",
    "the bytes per block Core plans with are the worker's, the sum of its segment strides",
    "extensible-kv-cache",
    _pool_bytes,
    module=__name__,
)
