"""Tags and the attention kernel's view of a layer: vectorised writes and readbacks.

Every state a kernel stores gets a 64-bit *tag*: the hash of the content it
was computed from (the tokens up to it) mixed with a per-layer salt.  Two
requests only share tags where they share a prefix, which is exactly where
vLLM lets them share blocks.  A tag is written as its 8 little-endian bytes,
repeated over the state's ``H * C`` bytes, through the layer's view from
:func:`conformance.check.worker.allocate_kv_cache`.
"""

from __future__ import annotations

from fractions import Fraction

import attrs
import torch

from conformance.check.worker import BYTES
from conformance.serve.pool import Retention

__all__ = [
    "MASK64",
    "LayerSlot",
    "mix64",
    "observed_tag",
    "patterns",
    "read_states",
    "wide_view",
    "write_states",
]

MASK64 = (1 << 64) - 1


def mix64(*values: int) -> int:
    """A 64-bit hash (splitmix64 steps) of ``values``, as a signed int64 that is never 0."""
    h = 0x9E3779B97F4A7C15
    for v in values:
        h = (h ^ (v & MASK64)) & MASK64
        h = ((h ^ (h >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        h = ((h ^ (h >> 27)) * 0x94D049BB133111EB) & MASK64
        h ^= h >> 31
    # An odd tag is never all zero bytes, so a zeroed page never reads as written.
    h |= 1
    return h - (1 << 64) if h >= 1 << 63 else h


@attrs.define(kw_only=True, eq=False)
class LayerSlot:
    """One layer as its kernel sees it.

    Attributes:
        name: the layer.
        worker: the worker whose allocation holds it.
        group_id: its group in the config.
        view: its ``(N, H, S, C)`` byte view.
        salt: the layer's tag salt.
        tokens_per_state: tokens per kernel state (a ``Fraction`` below 1: states per token).
        declared: the layer's own retention (what it reads), from the model's spec.
        wide: the int64 form of ``view`` (see :func:`wide_view`), when it exists.
    """

    name: str
    worker: int
    group_id: int
    view: torch.Tensor
    salt: int
    tokens_per_state: Fraction
    declared: Retention
    wide: torch.Tensor | None = None

    @property
    def num_blocks(self) -> int:
        """Pages in the view."""
        return int(self.view.shape[0])

    @property
    def states_per_page(self) -> int:
        """States one page of the view holds (``S``)."""
        return int(self.view.shape[2])

    @property
    def state_bytes(self) -> int:
        """Bytes of one state across heads (``H * C``)."""
        return int(self.view.shape[1] * self.view.shape[3])


def patterns(tags: torch.Tensor, heads: int, content: int) -> torch.Tensor:
    """The ``(K, H, C)`` bytes of ``K`` int64 tags: each tag's 8 bytes, repeated.

    In the backing's element type (``int8``, as vLLM's worker allocates it),
    so that they store into and compare with its byte views.
    """
    count = tags.shape[0]
    total = heads * content
    words = -(-total // 8)
    # Repeating whole int64 words is a plain copy; the byte view then trims the tail.
    raw = tags[:, None].expand(count, words).contiguous().view(BYTES)
    return raw[:, :total].reshape(count, heads, content)


def wide_view(view: torch.Tensor) -> torch.Tensor | None:
    """The ``(N, H, S, C / 8)`` int64 view of a byte view, when offsets and strides allow it.

    A tag repeated over a state is one int64 per word, so writes and
    readbacks through this view move 8 times fewer elements.
    """
    if view.shape[3] % 8 or view.storage_offset() % 8:
        return None
    if view.stride(3) != 1 or any(view.stride(i) % 8 for i in range(3)):
        return None
    try:
        return view.view(torch.int64)
    except RuntimeError:
        return None


def write_states(
    view: torch.Tensor,
    pages: torch.Tensor,
    states: torch.Tensor,
    tags: torch.Tensor,
    wide: torch.Tensor | None = None,
) -> None:
    """Store ``tags[k]`` in state ``states[k]`` of page ``pages[k]``, as a kernel would."""
    if pages.numel() == 0:
        return
    if wide is not None:
        wide[pages, :, states, :] = tags[:, None, None]
        return
    heads, content = int(view.shape[1]), int(view.shape[3])
    view[pages, :, states, :] = patterns(tags, heads, content)


def read_states(
    view: torch.Tensor,
    pages: torch.Tensor,
    states: torch.Tensor,
    tags: torch.Tensor,
    wide: torch.Tensor | None = None,
) -> torch.Tensor:
    """Indices ``k`` whose state does not hold ``tags[k]`` (a 1-D int64 tensor)."""
    if pages.numel() == 0:
        return torch.zeros(0, dtype=torch.int64, device=view.device)
    if wide is not None:
        bad = (wide[pages, :, states, :] != tags[:, None, None]).flatten(1).any(dim=1)
    else:
        heads, content = int(view.shape[1]), int(view.shape[3])
        got = view[pages, :, states, :]
        bad = (got != patterns(tags, heads, content)).flatten(1).any(dim=1)
    return bad.nonzero().flatten()


def observed_tag(view: torch.Tensor, page: int, state: int) -> int | None:
    """The tag the first 8 bytes of a state spell (``None`` when the state is shorter)."""
    flat = view[page, :, state, :].flatten()
    if flat.numel() < 8:
        return None
    return int(flat[:8].contiguous().view(torch.int64).item())
