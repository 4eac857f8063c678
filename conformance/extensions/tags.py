"""The kit's one tag engine: 64-bit tags and moving them through strided byte views.

Three checks, all of extensions, write tags into a plan's memory and read
them back: the device extension's KV-DEV-TAGS (``extensions/device/tags.py``,
one tag per (layer, block) page) and KV-DEV-KERNEL-VIEWS
(``extensions/device/kernel.py``, one tag per kernel block, written through
one view and read through the other), and the serve extension's simulation
(``extensions/serve/``, one tag per kernel state).  It is not an extension
itself: no entry in the registry or the contributions names it, and the core
never imports it.  It sits beside the two extensions that share it, so that
neither depends on the other's folder; deleting one of them leaves it to the
other.  This module is their shared *plumbing*: how a tag is made,
which element width a set of byte offsets and strides allows, and how tags
are stored into and compared with views of a torch byte buffer.

What it does not hold is the *oracle*: which bytes a page, kernel block or
state should occupy.  Each check derives that from the plan with the kit's
own geometry (:mod:`conformance.check.worker_model`,
:mod:`conformance.check.geometry`), never from kvref's views or
allocation, so a planted bug in kvref's formulas cannot hide itself here.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import numpy.typing as npt
import torch

from conformance.check.worker import BYTES

__all__ = [
    "MASK64",
    "WIDTH_DTYPES",
    "layer_tags",
    "mix64",
    "movable",
    "observed_tag",
    "patterns",
    "read_states",
    "splitmix64",
    "wide_view",
    "widest_width",
    "write_states",
]

MASK64 = (1 << 64) - 1

#: Element width in bytes -> the torch and numpy integer types tags are moved in.
WIDTH_DTYPES: dict[int, tuple[torch.dtype, type[np.generic]]] = {
    8: (torch.int64, np.int64),
    4: (torch.int32, np.int32),
    2: (torch.int16, np.int16),
    1: (torch.uint8, np.uint8),
}


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


def splitmix64(values: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """splitmix64 of every element: a bijection, so distinct ids get distinct, unrelated tags."""
    z = values + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    mixed: npt.NDArray[np.uint64] = z ^ (z >> np.uint64(31))
    return mixed


def layer_tags(
    first_layer: int, num_layers: int, columns: npt.NDArray[np.uint64], id_space: int, seed: int
) -> npt.NDArray[np.int64]:
    """The ``(num_layers, len(columns))`` int64 tags of (layer, column) pairs.

    Layers are numbered from ``first_layer`` across a plan; each pair's id
    ``layer * id_space + column`` (``column < id_space``) is unique, so
    splitmix64 of it, mixed with ``seed``, gives every pair its own tag.
    """
    layers = np.arange(first_layer, first_layer + num_layers, dtype=np.uint64)
    ids = layers[:, None] * np.uint64(id_space) + columns[None, :]
    tags: npt.NDArray[np.int64] = splitmix64(ids ^ np.uint64(seed & MASK64)).view(np.int64)
    return tags


def widest_width(values: Iterable[int]) -> int:
    """The widest element (8, 4, 2 or 1 bytes) that divides every byte offset and stride given.

    Tags moved in that element start on one grid for every writer, so a
    corrupted element always holds exactly one other writer's whole tag.
    """
    numbers = [int(v) for v in values]
    for width in (8, 4, 2):
        if all(v % width == 0 for v in numbers):
            return width
    return 1


def movable(view: torch.Tensor) -> bool:
    """Whether torch can write ``view``: no axis of more than one index with a zero stride."""
    return all(s != 0 or e <= 1 for e, s in zip(view.shape, view.stride(), strict=True))


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
