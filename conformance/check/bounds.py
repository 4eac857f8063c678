"""Sanity bounds on backing sizes, shared by the invariants and the Core-flow proxy."""

from __future__ import annotations

import math
from collections.abc import Sequence

from conformance.check.geometry import aligned_page, block_stride_alignment
from kvref.records import KVCacheGroupSpec
from kvref.specs import KVCacheSpec, UniformTypeKVCacheSpecs

__all__ = ["absurd_size", "named_layer_specs", "size_bound"]


def named_layer_specs(group: KVCacheGroupSpec) -> list[tuple[str, KVCacheSpec]]:
    """``(name, per-layer spec)`` of the group's layers that have one.

    Unlike :meth:`KVCacheGroupSpec.layer_specs` it never raises: a wrapper
    that lacks a named layer is a builder bug that ``KV-GROUP-WRAPPER``
    reports, and the other checks skip that layer.
    """
    spec = group.kv_cache_spec
    if isinstance(spec, UniformTypeKVCacheSpecs):
        return [(n, spec.kv_cache_specs[n]) for n in group.layer_names if n in spec.kv_cache_specs]
    return [(n, spec) for n in group.layer_names]


def size_bound(groups: Sequence[KVCacheGroupSpec]) -> int:
    """Bytes per block if every device layer had its own aligned pages (no aliasing)."""
    specs = [s for g in groups if not g.host_resident for _, s in named_layer_specs(g)]
    alignment = math.lcm(1, *(block_stride_alignment(s) for s in specs))
    return sum(aligned_page(s, alignment) for s in specs)


def absurd_size(size: int, num_blocks: int, bound: int) -> bool:
    """Whether a backing is beyond any sane plan: over twice the no-aliasing bytes plus 1 MiB."""
    return size > 2 * bound * num_blocks + 2**20
