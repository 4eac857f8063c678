"""KV cache layouts: the physical orders of a tensor's logical axes.

The logical axes of a tensor are always ``(L, B, H, N, C)``: layers, blocks,
heads, states and content bytes.  A :class:`KVCacheLayout` names their
physical order, outermost first.

This module depends on nothing in kvref but the errors, so that the config
(which holds a layout) and the spec kinds (whose pages the stride math in
:mod:`kvref.layout` lays out) can both import it without importing each other.
"""

from __future__ import annotations

import enum

from kvref.errors import LayoutError

__all__ = ["DEFAULT_LAYOUT_PREFERENCE", "HOST_LAYOUT", "KVCacheLayout"]

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


#: vLLM's order of preference when no backend states one.
DEFAULT_LAYOUT_PREFERENCE: tuple[KVCacheLayout, ...] = (
    KVCacheLayout.LBNHC,
    KVCacheLayout.LBHNC,
    KVCacheLayout.BLNHC,
    KVCacheLayout.BLHNC,
    KVCacheLayout.BHLNC,
    KVCacheLayout.LHBNC,
)

#: Host-resident tensors are always laid out LBNHC, whatever the device layout.
HOST_LAYOUT = KVCacheLayout.LBNHC
