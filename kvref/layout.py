"""Stride math of the KV cache layouts (contract.md#layouts).

The logical axes of a tensor are always ``(L, B, H, S, C)``: layers, blocks,
heads, states and content bytes.  A :class:`~kvref.axes.KVCacheLayout` (defined
in :mod:`kvref.axes`, re-exported here) names the physical order of those
axes, outermost first.  Strides are in bytes.
"""

from __future__ import annotations

from kvref.axes import DEFAULT_LAYOUT_PREFERENCE, KVCacheLayout
from kvref.errors import LayoutError
from kvref.specs import KVCacheSpec

__all__ = [
    "DEFAULT_LAYOUT_PREFERENCE",
    "KVCacheLayout",
    "Strides",
    "compute_layer_kv_cache_shape_bytes",
    "compute_layout_strides",
]

#: Byte strides in logical order ``(L, B, H, S, C)``.
Strides = tuple[int, int, int, int, int]


def compute_layer_kv_cache_shape_bytes(
    spec: KVCacheSpec, num_blocks: int, kernel_block_size: int | None = None
) -> tuple[int, int, int, int]:
    """``(N * r, H, S_k, C)`` of one layer, with ``r`` kernel blocks per manager block.

    Raises:
        LayoutError: ``kernel_block_size`` does not divide the spec's block size.
    """
    bs = kernel_block_size or spec.block_size
    if bs <= 0 or spec.block_size % bs != 0:
        raise LayoutError(
            f"kernel_block_size={kernel_block_size} must divide block_size={spec.block_size}"
        )
    r = spec.block_size // bs
    return (
        num_blocks * r,
        spec.num_page_heads,
        spec.get_num_kernel_states(bs),
        spec.state_content_size_bytes,
    )


def compute_layout_strides(
    spec: KVCacheSpec,
    num_blocks: int,
    num_layers: int,
    layout: KVCacheLayout,
    kernel_block_size: int | None = None,
    fixed: tuple[int | None, int | None, int | None, int | None, int | None] = (
        None,
        None,
        None,
        None,
        None,
    ),
) -> Strides:
    """Byte strides ``(L, B, H, S, C)`` of ``num_layers`` layers of ``spec`` (contract.md#layouts).

    ``fixed`` pins some strides (the planner pins ``B``; a worker pins ``L``
    and ``B`` from the tensor).  A padded page puts its padding at the tail of
    the innermost ``{L, B}`` axis, which requires every axis outside it to be
    a layer or block axis (or of extent 1).

    Raises:
        LayoutError: the padded page cannot be expressed in ``layout``.
    """
    nb, heads, states, content = compute_layer_kv_cache_shape_bytes(
        spec, num_blocks, kernel_block_size
    )
    extents = (num_layers, nb, heads, states, content)
    order = layout.physical_axes
    padded = spec.padded_page_size
    gate = -1
    if padded is not None:
        if kernel_block_size not in (None, spec.block_size):
            raise LayoutError(
                f"a padded page (page_size_padded={padded}) cannot be split into kernel "
                f"blocks of {kernel_block_size} tokens"
            )
        gate = 1 + max(order.index(0), order.index(1))
        outer = 1
        for pos in range(gate):
            outer *= extents[order[pos]]
        if outer != num_layers * nb:
            raise LayoutError(
                f"layout {layout.name} cannot pad pages of {type(spec).__name__} "
                f"(page_size_padded={padded}): page padding requires the layer and block "
                "axes (or singletons) outside the page tail"
            )
    strides = [0, 0, 0, 0, 0]
    running = 1
    for pos in range(4, -1, -1):
        axis = order[pos]
        if padded is not None and pos == gate - 1:
            running = max(running, padded)
        pinned = fixed[axis]
        strides[axis] = pinned if pinned is not None else running
        running = strides[axis] * extents[axis]
    return (strides[0], strides[1], strides[2], strides[3], strides[4])
