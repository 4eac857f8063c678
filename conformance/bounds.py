"""Sanity bounds on backing sizes, shared by the invariants and the Core-flow proxy."""

from __future__ import annotations

from collections.abc import Sequence

from kvref._math import lcm_all, round_up
from kvref.records import KVCacheGroupSpec
from kvref.specs import UniformTypeKVCacheSpecs, iter_layer_specs

__all__ = ["absurd_size", "size_bound"]


def size_bound(groups: Sequence[KVCacheGroupSpec]) -> int:
    """Bytes per block if every device layer had its own aligned pages (no aliasing)."""
    specs = []
    for g in groups:
        if g.host_resident:
            continue
        spec = g.kv_cache_spec
        if isinstance(spec, UniformTypeKVCacheSpecs):
            specs += [spec.kv_cache_specs[n] for n in g.layer_names if n in spec.kv_cache_specs]
        else:
            specs += list(iter_layer_specs(spec)) * len(g.layer_names)
    alignment = lcm_all(s.get_block_stride_alignment() for s in specs)
    return sum(round_up(s.page_size_bytes, alignment) for s in specs)


def absurd_size(size: int, num_blocks: int, bound: int) -> bool:
    """Whether a backing is beyond any sane plan: over twice the no-aliasing bytes plus 1 MiB."""
    return size > 2 * bound * num_blocks + 2**20
