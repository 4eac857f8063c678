"""Sanity bounds on backing sizes, shared by the invariants and the Core-flow proxy."""

from __future__ import annotations

import math
from collections.abc import Sequence

from conformance.check.geometry import aligned_page, block_stride_alignment, page_bytes, round_up
from kvref.extra_specs import HiSparseHotSpec
from kvref.records import KVCacheGroupSpec
from kvref.specs import KVCacheSpec, UniformTypeKVCacheSpecs

__all__ = [
    "MAX_BYTES",
    "absurd_size",
    "byte_count_problem",
    "named_layer_specs",
    "size_bound",
    "tensor_problems",
]

#: Torch sizes and strides are int64: no byte count past this can be allocated or viewed.
MAX_BYTES = 2**63 - 1

#: The byte counts of a tensor record that reach an allocator or a view.
_BYTE_FIELDS = ("size", "offset", "layer_stride", "block_stride")


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
    """Bytes per block if every device layer had its own aligned pages (no aliasing).

    Where HiSparse hot groups are placed, the block is then rounded up to tile
    every hot page and every alignment: vLLM's own block-outermost rule
    (contract.md#placement-backing).  With a raised alignment that lcm can
    be many pages (a 10,496-byte hot page and 4 KiB: 167,936 bytes), and a
    legal plan that follows vLLM's rule must stay inside the bound.
    """
    specs = [s for g in groups if not g.host_resident for _, s in named_layer_specs(g)]
    alignment = math.lcm(1, *(block_stride_alignment(s) for s in specs))
    pages = sum(aligned_page(s, alignment) for s in specs)
    hot = math.lcm(1, *(page_bytes(g.kv_cache_spec) for g in groups if _is_hot(g)))
    return round_up(pages, math.lcm(alignment, hot)) if hot > 1 else pages


def _is_hot(group: KVCacheGroupSpec) -> bool:
    # vLLM counts every hot group, even one with no layer on this worker.
    return isinstance(group.kv_cache_spec, HiSparseHotSpec) and not group.host_resident


#: Padding a legal plan may add to every block: rounding a block up to a page of
#: the allocator (4 KiB, ROCm's 4096-byte rounding, up to 64 KiB pages) is legal,
#: however small the layers' pages are (contract.md#placement-backing).
BLOCK_PADDING_ALLOWANCE = 64 * 1024


def absurd_size(size: int, num_blocks: int, bound: int) -> bool:
    """Whether a backing is beyond any sane plan.

    Sane: at most twice the no-aliasing bytes of a block plus a 64 KiB padding
    allowance, per block, plus 1 MiB.
    """
    return size > num_blocks * (2 * bound + BLOCK_PADDING_ALLOWANCE) + 2**20


def byte_count_problem(value: object) -> str | None:
    """Why ``value`` is no byte count an allocator can take (``None``: an int in [0, 2**63))."""
    if isinstance(value, bool) or not isinstance(value, int):
        return f"{value!r:.40} is a {type(value).__name__}, not an int"
    if value < 0:
        return f"{value} is negative"
    if value > MAX_BYTES:
        return f"{value} is past the 2**63 - 1 bytes a torch size can hold"
    return None


def tensor_problems(config: object) -> list[str]:
    """Each byte count of ``config`` no allocator can take, named (empty: all can be).

    The records' validators refuse such values, but a builder may bypass them
    (``object.__setattr__``); the checks that do arithmetic on the sizes, and
    the device checks that hand them to torch, skip a config this names, and
    ``KV-PLACE-SIZE-BOUND`` reports it.
    """
    out = []
    blocks = byte_count_problem(getattr(config, "num_blocks", 0))
    if blocks is not None:
        out.append(f"num_blocks {blocks}")
    for i, tensor in enumerate(getattr(config, "kv_cache_tensors", None) or ()):
        for field in _BYTE_FIELDS:
            problem = byte_count_problem(getattr(tensor, field, None))
            if problem is not None:
                out.append(f"tensor {i}'s {field} {problem}")
    return out
