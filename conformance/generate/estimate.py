"""Grouping-free estimates of a worker's bytes per block and per request.

The kit sizes memory budgets and overrides from these, so its inputs never
depend on the planner under test.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from conformance.check.geometry import cdiv
from kvref.config import PlanningConfig
from kvref.specs import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheSpec,
    SlidingWindowSpec,
    UniformTypeKVCacheSpecs,
)

__all__ = ["blocks_per_request", "promotion_succeeds", "worker_estimate"]


def promotion_succeeds(specs: Sequence[KVCacheSpec]) -> bool:
    """Whether disabling the hybrid manager leaves one group, conservatively.

    See contract.md#hybrid-manager-disabled.

    True for models already of one type, and for plain full attention plus
    one kind of local attention with a single window (or chunk) and one
    full-attention block size.
    """
    if not specs or UniformTypeKVCacheSpecs.is_uniform_type(list(specs)):
        return True
    plain = (FullAttentionSpec, SlidingWindowSpec, ChunkedLocalAttentionSpec)
    if any(type(s) not in plain for s in specs):
        return False
    fulls = [s for s in specs if type(s) is FullAttentionSpec]
    windows = {s.sliding_window for s in specs if isinstance(s, SlidingWindowSpec)}
    chunks = {s.attention_chunk_size for s in specs if isinstance(s, ChunkedLocalAttentionSpec)}
    return (
        bool(fulls)
        and len(windows) + len(chunks) == 1
        and len({s.block_size for s in fulls}) == 1
        and len({s.dcp_sharded for s in specs}) == 1
    )


def blocks_per_request(spec: KVCacheSpec, config: PlanningConfig) -> int:
    """Blocks one request at ``config.max_model_len`` needs for a layer of ``spec``."""
    return cdiv(spec.max_memory_usage_bytes(config), spec.page_size_bytes)


def worker_estimate(
    worker: Mapping[str, KVCacheSpec],
    config: PlanningConfig,
    model: Mapping[str, KVCacheSpec] | None = None,
) -> tuple[int, int]:
    """``(Σ block strides, bytes one request needs)`` over a worker's device layers.

    The first is about the bytes per block (exact for one layer-outer group,
    an upper bound otherwise).  The second is a lower bound of Core's figure
    (contract.md#core-admission), ``bpb * Σ_groups blocks``: the per-layer sum of
    ``max_memory_usage_bytes`` (vLLM's legacy estimate), or the worker's
    largest page times the most blocks any layer of ``model`` needs (every
    global group counts on every worker), whichever is larger.  Neither needs
    grouping, so the kit's inputs do not depend on the planner it tests.
    """
    host = config.host_resident_layers
    device = [s for n, s in worker.items() if n not in host]
    if not device:
        return 0, 0
    everyone = [s for n, s in (model or worker).items() if n not in host] or device
    page_sum = sum(s.block_stride for s in device)
    usage = sum(s.max_memory_usage_bytes(config) for s in device)
    most_blocks = max(blocks_per_request(s, config) for s in everyone)
    largest_page = max(s.page_size_bytes for s in device)
    return page_sum, max(usage, largest_page * most_blocks)
