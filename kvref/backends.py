"""Attention backends as planning and the worker see them: layouts and kernel block sizes.

vLLM asks each layer's attention backend two questions that shape a plan:

- ``supported_kv_cache_layouts()``: the layouts its kernels read, most
  preferred first, or ``None`` (any layout, no preference).  Core intersects
  the answers of every backend (:func:`get_supported_kv_cache_layouts`) before
  it resolves the layout (:mod:`kvref.layout_resolution`).
- ``get_supported_kernel_block_sizes()``: the block sizes its kernels take,
  each an exact ``int`` or a :class:`~kvref.specs.MultipleOf`.  When the
  manager's block size is not one of them, the worker splits each manager
  block into kernel blocks of the largest size every backend of the group
  takes (:func:`select_common_block_size`, :mod:`kvref.kernel_blocks`).

An :class:`AttentionBackend` is the explicit description of one backend and
the layers that run it, so kvref never imports vLLM to answer these
questions.  A layer no backend names runs vLLM's base backend: any layout,
any block size (``MultipleOf(1)``).

Deliberate difference: vLLM's backends may answer per spec (a quantised
cache on one GPU family takes other sizes); here a backend's answer is
fixed, so two kinds of layers that get different answers are described as
two backends.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

import attrs

from kvref._spec_fields import MultipleOf
from kvref.axes import DEFAULT_LAYOUT_PREFERENCE, KVCacheLayout
from kvref.errors import ConfigError, LayoutError, LayoutResolutionError

__all__ = [
    "DEFAULT_BACKEND",
    "AttentionBackend",
    "KernelBlockSize",
    "block_size_is_supported",
    "get_supported_kv_cache_layouts",
    "preferred_block_size",
    "select_common_block_size",
]

#: One supported kernel block size: exactly ``n`` tokens, or any multiple of ``MultipleOf.n``.
KernelBlockSize = int | MultipleOf


def _name(inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"AttentionBackend.{attribute.name}={value!r} must be a non-empty str")


def _layer_names(value: object) -> frozenset[str]:
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise ConfigError(f"AttentionBackend.layers={value!r} must be a set of layer names")
    names = tuple(value)
    bad = [n for n in names if not isinstance(n, str)]
    if bad:
        raise ConfigError(f"AttentionBackend.layers contains {bad[0]!r}, which is not a str")
    return frozenset(names)


def _layouts(value: object) -> tuple[KVCacheLayout, ...] | None:
    if value is None:
        return None
    if isinstance(value, (str, KVCacheLayout)) or not isinstance(value, Iterable):
        raise ConfigError(
            f"AttentionBackend.supported_kv_cache_layouts={value!r} must be None or a "
            "sequence of layouts, most preferred first"
        )
    try:
        layouts = tuple(KVCacheLayout.parse(v) for v in value)
    except LayoutError as exc:
        raise ConfigError(f"AttentionBackend.supported_kv_cache_layouts={value!r}: {exc}") from None
    if not layouts or len(set(layouts)) != len(layouts):
        # vLLM's intersection of an empty set is empty: no model could run.
        raise ConfigError(
            f"AttentionBackend.supported_kv_cache_layouts={value!r} must name at least one "
            "layout, each once (None means any layout)"
        )
    return layouts


def _kernel_sizes(value: object) -> tuple[KernelBlockSize, ...]:
    if isinstance(value, (str, int, MultipleOf)) or not isinstance(value, Iterable):
        raise ConfigError(
            f"AttentionBackend.supported_kernel_block_sizes={value!r} must be a sequence of "
            "positive ints and MultipleOf(n)"
        )
    sizes = tuple(value)
    for size in sizes:
        if isinstance(size, MultipleOf):
            continue
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            raise ConfigError(
                f"AttentionBackend.supported_kernel_block_sizes contains {size!r}, which is "
                "neither a positive int nor MultipleOf(n)"
            )
    return sizes


@attrs.frozen(kw_only=True)
class AttentionBackend:
    """One attention backend and the layers that run it (vLLM ``AttentionBackend``).

    Attributes:
        name: the backend's name (vLLM ``get_name()``), used in messages.
        layers: the layers whose attention runs this backend.
        supported_kv_cache_layouts: layouts its kernels read, most preferred
            first; ``None``: any layout, no preference.
        supported_kernel_block_sizes: block sizes its kernels take (vLLM's
            default is ``(MultipleOf(1),)``: any); an empty tuple takes none,
            so a group holding the backend cannot be given a kernel block size.
    """

    name: str = attrs.field(validator=_name)
    layers: frozenset[str] = attrs.field(default=frozenset(), converter=_layer_names)
    supported_kv_cache_layouts: tuple[KVCacheLayout, ...] | None = attrs.field(
        default=None, converter=_layouts
    )
    supported_kernel_block_sizes: tuple[KernelBlockSize, ...] = attrs.field(
        default=(MultipleOf(1),), converter=_kernel_sizes
    )

    def supports_block_size(self, block_size: int) -> bool:
        """Whether a kernel block of exactly ``block_size`` tokens is one this backend takes."""
        return any(
            block_size % size.n == 0 if isinstance(size, MultipleOf) else block_size == size
            for size in self.supported_kernel_block_sizes
        )

    def accepts_block_size(self, block_size: int) -> bool:
        """Whether a deployment may give this backend's layers ``block_size``-token cache blocks.

        vLLM's ``AttentionBackend.supports_block_size``: any multiple of one of
        its kernel block sizes, since the worker splits a cache block into
        kernel blocks; a backend that declares no size accepts any.
        """
        sizes = self.supported_kernel_block_sizes
        return not sizes or any(block_size % _base(size) == 0 for size in sizes)

    def preferred_block_size(self, default_block_size: int) -> int:
        """The cache block size this backend asks for when a deployment gives none.

        vLLM's ``AttentionBackend.get_preferred_block_size``: the default when it
        accepts it (or declares no size), else its smallest kernel block size.
        """
        sizes = self.supported_kernel_block_sizes
        if not sizes or self.accepts_block_size(default_block_size):
            return default_block_size
        return min(_base(size) for size in sizes)


def _base(size: KernelBlockSize) -> int:
    return size.n if isinstance(size, MultipleOf) else size


#: vLLM's base backend: what a layer no :class:`AttentionBackend` names runs.
DEFAULT_BACKEND = AttentionBackend(name="default")


def get_supported_kv_cache_layouts(
    backends: Iterable[AttentionBackend],
) -> list[KVCacheLayout]:
    """The layouts every backend supports, most preferred first (vLLM's function of that name).

    Backends without a declaration are ignored; with none declared the
    result is vLLM's default preference.  Identical declarations keep their
    order; otherwise the layouts in every declaration are ordered by how
    many backends put them first, ties in :class:`KVCacheLayout` order.

    Raises:
        LayoutResolutionError: no layout is in every declaration (names each backend's set).
    """
    declared = [
        (b.name, b.supported_kv_cache_layouts)
        for b in backends
        if b.supported_kv_cache_layouts is not None
    ]
    lists = [layouts for _, layouts in declared] or [DEFAULT_LAYOUT_PREFERENCE]
    if all(layouts == lists[0] for layouts in lists[1:]):
        return list(lists[0])
    firsts = Counter(layouts[0] for layouts in lists)
    common = set.intersection(*(set(layouts) for layouts in lists))
    # sorted() is stable: enum order breaks ties, as in vLLM.
    candidates = sorted(
        (layout for layout in KVCacheLayout if layout in common),
        key=lambda layout: firsts[layout],
        reverse=True,
    )
    if not candidates:
        sets = "; ".join(f"{name}: {[m.name for m in layouts]}" for name, layouts in declared)
        raise LayoutResolutionError(
            f"no KV cache layout is supported by every attention backend ({sets})"
        )
    return candidates


def block_size_is_supported(backends: Sequence[AttentionBackend], block_size: int) -> bool:
    """Whether every backend takes kernel blocks of ``block_size`` tokens."""
    return all(b.supports_block_size(block_size) for b in backends)


def select_common_block_size(block_size: int, backends: Sequence[AttentionBackend]) -> int:
    """The kernel block size the worker uses for manager blocks of ``block_size`` tokens.

    vLLM ``select_common_block_size``: ``block_size`` itself when every
    backend takes it, else the largest exact size of some backend that
    divides ``block_size`` and every backend takes.

    Raises:
        LayoutError: no such size (names ``block_size`` and each backend's sizes).
    """
    if block_size_is_supported(backends, block_size):
        return block_size
    # A MultipleOf that takes a divisor of block_size takes block_size too, so
    # only exact sizes are left to try.
    candidates = {
        size
        for backend in backends
        for size in backend.supported_kernel_block_sizes
        if isinstance(size, int) and block_size % size == 0
    }
    for size in sorted(candidates, reverse=True):
        if block_size_is_supported(backends, size):
            return size
    sizes = "; ".join(f"{b.name}: {list(b.supported_kernel_block_sizes)}" for b in backends)
    raise LayoutError(
        f"no kernel block size divides block_size={block_size} and is supported by every "
        f"attention backend ({sizes}); choose a block size these backends share"
    )


def preferred_block_size(backends: Sequence[AttentionBackend], default_block_size: int) -> int:
    """The cache block size a deployment that gives none runs with.

    vLLM's ``Platform._preferred_block_size_for_backends`` (called by
    ``update_block_size_for_backend`` when ``--block-size`` is not given): a
    lone backend's :meth:`~AttentionBackend.preferred_block_size`; with
    several, the default when all accept it, else the smallest least common
    multiple of one kernel block size per backend that all accept (one always
    is: each accepts the multiples of its sizes).  No backend is vLLM's base
    backend, which accepts the default.  A FlashMLA deployment (64-token
    kernel blocks) runs 64-token blocks under both defaults (16 in vLLM
    0.33.0, 64 in 0.34.0).
    """
    distinct = list(dict.fromkeys(backends))
    if not distinct:
        return default_block_size
    if len(distinct) == 1:
        return distinct[0].preferred_block_size(default_block_size)
    if all(b.accepts_block_size(default_block_size) for b in distinct):
        return default_block_size
    # A backend declaring no size accepts any: it contributes 1.
    per_backend = [[_base(s) for s in b.supported_kernel_block_sizes] or [1] for b in distinct]
    return min(
        size
        for size in {math.lcm(*pick) for pick in itertools.product(*per_backend)}
        if all(b.accepts_block_size(size) for b in distinct)
    )
