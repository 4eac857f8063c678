"""KV cache layouts and their stride math (SPEC 1.8).

The logical axes of a tensor are always ``(L, B, H, S, C)``: layers, blocks,
heads, states and content bytes.  A layout names the physical order of those
axes, outermost first.  Strides are in bytes.
"""

from __future__ import annotations

import enum

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

_AXIS = {"L": 0, "B": 1, "H": 2, "N": 3, "C": 4}


class KVCacheLayout(enum.Enum):
    """Physical order of the ``(L, B, H, N, C)`` axes, outermost first (vLLM ``KVCacheLayout``)."""

    LBHNC = "LBHNC"
    LBNHC = "LBNHC"
    LHBNC = "LHBNC"
    BLHNC = "BLHNC"
    BLNHC = "BLNHC"
    BHLNC = "BHLNC"

    @classmethod
    def parse(cls, value: KVCacheLayout | str) -> KVCacheLayout:
        """The layout named ``value`` (case-insensitive).

        Raises:
            LayoutError: ``value`` names no layout.
        """
        if isinstance(value, KVCacheLayout):
            return value
        if isinstance(value, str):
            try:
                return cls[value.upper()]
            except KeyError:
                pass
        names = ", ".join(m.name for m in cls)
        raise LayoutError(f"kv_cache_layout={value!r} is not a layout (one of {names})")

    @property
    def physical_axes(self) -> tuple[int, ...]:
        """Logical axis index at each physical position, outermost first."""
        return tuple(_AXIS[c] for c in self.value)

    @property
    def is_layer_compact(self) -> bool:
        """The layer axis is outermost."""
        return self.value[0] == "L"

    @property
    def is_block_compact(self) -> bool:
        """Layers and blocks are the two outermost axes."""
        return set(self.value[:2]) == {"L", "B"}

    @property
    def is_block_outermost(self) -> bool:
        """The block axis is outermost."""
        return self.value[0] == "B"


#: vLLM's order of preference when no backend states one (SPEC 1.8).
DEFAULT_LAYOUT_PREFERENCE: tuple[KVCacheLayout, ...] = (
    KVCacheLayout.LBNHC,
    KVCacheLayout.LBHNC,
    KVCacheLayout.BLNHC,
    KVCacheLayout.BLHNC,
    KVCacheLayout.BHLNC,
    KVCacheLayout.LHBNC,
)


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
    """Byte strides ``(L, B, H, S, C)`` of ``num_layers`` layers of ``spec`` (SPEC 1.8).

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
