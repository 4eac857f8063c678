"""The kit's own geometry of layer specs, layouts and requests (contract.md#views-and-strides).

Everything the kit expects of a plan's bytes is computed here from the
fields of a spec and the formulas of the contract, and from nothing else:
kvref's stride math, page properties and admission formula are never called
(kvref is used for its record types only).  A bug in kvref's geometry then
shows as a disagreement between the reference's plans and this module,
instead of passing unnoticed (``tests/kit/check/test_oracle.py`` plants such bugs).

Notation (contract.md#views-and-strides): a page is ``H`` head slots of ``S``
states of ``C`` content bytes; a layout orders the logical axes
``(L, B, H, S, C)`` physically, outermost first; strides are in bytes.

- :func:`page_geometry`: ``H``, ``S``, ``C``, the padded page and the bytes one
  layer owns per block (contract.md#memory-safety);
- :func:`block_stride_alignment` and :func:`aligned_page`: the block stride a
  layer asks for (contract.md#views-and-strides);
- :func:`layout_strides`: byte strides of a tensor in a layout, some pinned;
- :func:`max_memory_bytes` and :func:`request_need_bytes`: what one request at
  the maximum length needs, per layer and per worker (contract.md#core-admission).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Sequence
from fractions import Fraction
from typing import Protocol

import attrs
import torch

from kvref.records import KVCacheGroupSpec
from kvref.specs import (
    AttentionSpec,
    ChunkedLocalAttentionSpec,
    CircularBufferSpec,
    CrossAttentionSpec,
    EncoderOnlyAttentionSpec,
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    MultipleOf,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
    UniformTypeKVCacheSpecs,
)

__all__ = [
    "AXES",
    "LengthInputs",
    "OracleError",
    "PageGeometry",
    "Strides",
    "aligned_page",
    "block_stride_alignment",
    "cdiv",
    "dtype_bytes",
    "group_blocks_per_request",
    "is_block_outermost",
    "layout_name",
    "layout_strides",
    "max_memory_bytes",
    "page_bytes",
    "page_geometry",
    "physical_order",
    "request_need_bytes",
    "round_up",
    "typed_view_misfits",
    "view_extents",
]

#: The logical axes, in logical order: layers, blocks, heads, states, content bytes.
AXES = "LBHNC"

#: Byte strides in logical order ``(L, B, H, S, C)``.
Strides = tuple[int, int, int, int, int]

_Pinned = tuple[int | None, int | None, int | None, int | None, int | None]

_MLA_KINDS = (MLAAttentionSpec, SlidingWindowMLASpec)


class OracleError(ValueError):
    """The contract gives no geometry for this input (unknown spec kind, unpaddable layout...)."""


class LengthInputs(Protocol):
    """The lengths a request's need depends on (a :class:`kvref.PlanningConfig` has them)."""

    @property
    def max_model_len(self) -> int:
        """Tokens of the longest request."""
        ...

    @property
    def decode_context_parallel_size(self) -> int:
        """Decode-context-parallel ranks a sharded layer's tokens are spread over."""
        ...

    @property
    def max_in_flight_tokens(self) -> int:
        """Tokens scheduled but not yet retired, across concurrent batches."""
        ...

    @property
    def encoder_input_tokens(self) -> int:
        """Encoder tokens one request may bring (cross attention)."""
        ...

    @property
    def mamba_cache_mode(self) -> str:
        """``"align"`` keeps extra state blocks per request."""
        ...


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for ``b > 0``."""
    return -(-a // b)


def round_up(x: int, a: int) -> int:
    """The smallest multiple of ``a`` (``> 0``) that is at least ``x``."""
    return cdiv(x, a) * a


def dtype_bytes(dtype: torch.dtype) -> int:
    """``sizeof(dtype)`` in bytes."""
    return int(dtype.itemsize)


# -- layouts --------------------------------------------------------------------------


def layout_name(layout: object) -> str:
    """The five-letter name of a layout (an enum member or a string such as ``"BLHNC"``).

    Raises:
        OracleError: not a permutation of ``LBHNC``.
    """
    name = str(getattr(layout, "name", layout)).upper()
    if sorted(name) != sorted(AXES):
        raise OracleError(f"layout {layout!r} is not an order of the axes {AXES}")
    return name


def physical_order(layout: object) -> tuple[int, ...]:
    """Logical axis index at each physical position, outermost first."""
    return tuple(AXES.index(letter) for letter in layout_name(layout))


def is_block_outermost(layout: object) -> bool:
    """Whether blocks are the outermost axis (one block's bytes of every layer are together)."""
    return layout_name(layout)[0] == "B"


# -- pages ----------------------------------------------------------------------------


@attrs.frozen
class PageGeometry:
    """One layer's page, from its spec's fields (contract.md#memory-safety).

    Attributes:
        heads: ``H``, head slots a view has.
        states: ``S``, states per block.
        content: ``C``, bytes of one (head, state) cell.
        padded: the padded page, or ``None``.
        page: bytes the layer owns per block: the padded page, else the dense page.
        layer_views: whether a worker views the layer as ``(N, H, S, C)`` (else raw bytes).
        dtype: what a worker reinterprets the bytes as (``None``: raw bytes).
        dense: the page without padding: ``H * S * C``, except Mamba's, which leaves
            ``num_heads`` out (its ``S * C``).

    """

    heads: int
    states: int
    content: int
    padded: int | None
    page: int
    layer_views: bool
    dtype: torch.dtype | None
    dense: int = attrs.field(
        default=attrs.Factory(lambda g: g.heads * g.states * g.content, takes_self=True)
    )

    @property
    def footprint(self) -> int:
        """Bytes a view addresses in one page: ``H * S * C`` (padding excluded)."""
        return self.heads * self.states * self.content


def _states(tokens_per_state: int | Fraction, block_size: int) -> int:
    # A state may cover several tokens (compression) or a fraction of one; floored.
    if tokens_per_state > 0:
        return int(block_size // tokens_per_state)
    return 1


def _attention_page(spec: AttentionSpec, block_size: int, padded: int | None) -> PageGeometry:
    heads = spec.num_head_slots if spec.num_head_slots is not None else spec.num_kv_heads
    states = _states(spec.tokens_per_state, block_size)
    if spec.state_content_bytes is not None:
        content = spec.state_content_bytes
    else:
        value_size = spec.head_size_v
        if value_size is None:
            value_size = 0 if isinstance(spec, _MLA_KINDS) else spec.head_size
        content = (spec.head_size + value_size) * dtype_bytes(spec.dtype)
    dense = heads * states * content
    # Only MLA kinds have the field (a missing one is slow to ask a slotted spec).
    alignment = spec.alignment if isinstance(spec, _MLA_KINDS) else None
    if alignment is not None and dense % alignment:
        padded = round_up(dense, alignment)
    return PageGeometry(
        heads=heads,
        states=states,
        content=content,
        padded=padded,
        page=dense if padded is None else padded,
        layer_views=True,
        dtype=spec.dtype,
    )


def _page_at(spec: KVCacheSpec, block_size: int, padded: int | None) -> PageGeometry:
    if not getattr(spec, "has_layer_views", True):
        # Raw-page specs (HiSparse hot and resident) own page_size bytes and no view.
        size = _int_field(spec, "page_size")
        return PageGeometry(1, 1, size, None, size, layer_views=False, dtype=None)
    if isinstance(spec, MambaSpec):
        content = sum(
            math.prod(shape) * dtype_bytes(dtype)
            for shape, dtype in zip(spec.shapes, spec.dtypes, strict=True)
        )
        # One state per block; num_heads shapes the view but is not part of the page.
        page = content if padded is None else padded
        return PageGeometry(spec.num_heads, 1, content, padded, page, True, None, dense=content)
    if isinstance(spec, AttentionSpec):
        return _attention_page(spec, block_size, padded)
    raise OracleError(f"the contract gives no page formula for {type(spec).__name__}")


def _int_field(spec: KVCacheSpec, name: str) -> int:
    value = getattr(spec, name, None)
    if not isinstance(value, int) or value <= 0:
        raise OracleError(f"{type(spec).__name__}.{name}={value!r} is not a positive int")
    return value


def _padded_field(spec: KVCacheSpec) -> int | None:
    value = getattr(spec, "page_size_padded", None)
    return value if isinstance(value, int) else None


def page_geometry(spec: KVCacheSpec) -> PageGeometry:
    """The page of one layer (contract.md#memory-safety).

    Attention: ``H = num_head_slots or num_kv_heads``, ``S = block_size //
    tokens_per_state``, ``C = state_content_bytes or (head_size + head_size_v)
    * sizeof(dtype)``; MLA kinds with an ``alignment`` pad an unaligned dense
    page up to it.  Mamba: ``C`` is the sum of its state tensors, ``S = 1``.
    A ``page_size_padded`` replaces the dense page.

    Raises:
        OracleError: a spec kind the contract has no formula for.
    """
    return _page_at(spec, spec.block_size, _padded_field(spec))


def page_bytes(spec: KVCacheSpec | UniformTypeKVCacheSpecs) -> int:
    """Bytes per block of a layer spec, or of a uniform-type group (the sum of its layers')."""
    if isinstance(spec, UniformTypeKVCacheSpecs):
        return sum(page_bytes(s) for s in spec.kv_cache_specs.values())
    return page_geometry(spec).page


def block_stride_alignment(spec: KVCacheSpec) -> int:
    """Bytes a layer's block stride must be a multiple of (contract.md#views-and-strides).

    ``None`` asks nothing (1) and an int asks itself.  ``MultipleOf(b)`` asks for
    kernel blocks of ``k = gcd(b, block_size)`` tokens: nothing when ``k`` is
    the whole block, else the page of the same layer at ``k`` tokens per block
    (an explicit padded page carries over).
    """
    wanted = spec.block_stride_alignment
    if wanted is None:
        return 1
    if isinstance(wanted, MultipleOf):
        kernel = math.gcd(wanted.n, spec.block_size)
        if kernel == spec.block_size:
            return 1
        return _page_at(spec, kernel, _padded_field(spec)).page
    return int(wanted)


def aligned_page(spec: KVCacheSpec, alignment: int | None = None) -> int:
    """``round_up(page, alignment)``; the alignment defaults to the layer's own."""
    step = block_stride_alignment(spec) if alignment is None else alignment
    return round_up(page_bytes(spec), step)


# -- strides --------------------------------------------------------------------------


def view_extents(
    spec: KVCacheSpec, num_blocks: int, kernel_block_size: int | None = None
) -> tuple[int, int, int, int]:
    """``(N * r, H, S_k, C)`` of one layer's view, with ``r`` kernel blocks per block.

    Raises:
        OracleError: the kernel block size does not divide the block size.
    """
    kernel = kernel_block_size or spec.block_size
    if kernel <= 0 or spec.block_size % kernel:
        raise OracleError(
            f"kernel_block_size={kernel_block_size} does not divide block_size={spec.block_size}"
        )
    page = page_geometry(spec)
    states = page.states
    if isinstance(spec, AttentionSpec) and page.layer_views:
        states = _states(spec.tokens_per_state, kernel)
    return num_blocks * (spec.block_size // kernel), page.heads, states, page.content


def layout_strides(
    spec: KVCacheSpec,
    num_blocks: int,
    num_layers: int,
    layout: object,
    *,
    pinned: _Pinned = (None, None, None, None, None),
    kernel_block_size: int | None = None,
) -> Strides:
    """Byte strides ``(L, B, H, S, C)`` of ``num_layers`` layers in ``layout``.

    Each axis, from the innermost, is as wide as everything inside it,
    unless ``pinned`` gives its stride (a worker pins ``L`` and ``B`` from
    the tensor record).  A padded page widens the innermost of the layer and
    block axes to the padded page, which needs every axis outside it to be a
    layer or block axis, or of extent 1.

    Raises:
        OracleError: the layout cannot hold the padded page, or the kernel
            block size splits one.
    """
    blocks, heads, states, content = view_extents(spec, num_blocks, kernel_block_size)
    extents = (num_layers, blocks, heads, states, content)
    order = physical_order(layout)
    padded = page_geometry(spec).padded
    widen_at = -1
    if padded is not None:
        if kernel_block_size not in (None, spec.block_size):
            raise OracleError(
                f"a padded page of {padded} B cannot be split into kernel blocks of "
                f"{kernel_block_size} tokens"
            )
        widen_at = max(order.index(0), order.index(1))
        outside = math.prod(extents[order[pos]] for pos in range(widen_at + 1))
        if outside != num_layers * blocks:
            raise OracleError(
                f"layout {layout_name(layout)} cannot pad pages of {type(spec).__name__} to "
                f"{padded} B: a head or state axis lies outside the layer and block axes"
            )
    strides = [0, 0, 0, 0, 0]
    inner = 1
    for pos in reversed(range(5)):
        axis = order[pos]
        if pos == widen_at:
            inner = max(inner, padded or 0)
        given = pinned[axis]
        strides[axis] = inner if given is None else given
        inner = strides[axis] * extents[axis]
    return strides[0], strides[1], strides[2], strides[3], strides[4]


# -- what a request needs ---------------------------------------------------------------


def _attention_need(spec: AttentionSpec, config: LengthInputs, page: int) -> int:
    length = config.max_model_len
    dcp = config.decode_context_parallel_size
    in_flight = config.max_in_flight_tokens
    bs = spec.block_size
    if isinstance(spec, EncoderOnlyAttentionSpec):
        return 0
    if isinstance(spec, CrossAttentionSpec):
        return cdiv(config.encoder_input_tokens, bs) * page
    if isinstance(spec, CircularBufferSpec):
        return page
    if isinstance(spec, ChunkedLocalAttentionSpec):
        return cdiv(min(spec.attention_chunk_size + in_flight, length), bs) * page
    if isinstance(spec, SlidingWindowSpec):
        if spec.dcp_sharded and dcp > 1:
            raise OracleError(
                f"{type(spec).__name__} is DCP-sharded with decode_context_parallel_size={dcp}; "
                "a sliding window has no need defined then"
            )
        window = spec.sliding_window - 1 + spec.extra_retained_tokens + in_flight
        return (cdiv(min(window, length), bs) + 1) * page
    if isinstance(spec, FullAttentionSpec):
        if spec.dcp_sharded and dcp > 1:
            length = cdiv(length, dcp)
        return cdiv(length, bs) * page
    raise OracleError(f"the contract gives no memory formula for {type(spec).__name__}")


def max_memory_bytes(spec: KVCacheSpec, config: LengthInputs) -> int:
    """Bytes one request at ``config.max_model_len`` keeps in one layer.

    See contract.md#core-admission.

    Raises:
        OracleError: a spec kind the contract has no formula for, or a
            sliding window sharded over several DCP ranks.
    """
    page = page_bytes(spec)
    if not getattr(spec, "has_layer_views", True):
        per_request = getattr(spec, "blocks_per_request", None)
        if isinstance(per_request, int):
            return per_request * page
        tokens = min(config.max_in_flight_tokens, config.max_model_len)
        return cdiv(tokens, spec.block_size) * page
    if isinstance(spec, MambaSpec):
        if config.mamba_cache_mode == "align":
            extra = 2 + spec.num_speculative_blocks + spec.num_prefill_checkpoint_blocks
            return page * extra
        return page * (1 + spec.num_speculative_blocks)
    if isinstance(spec, AttentionSpec):
        return _attention_need(spec, config, page)
    raise OracleError(f"the contract gives no memory formula for {type(spec).__name__}")


def _blocks(specs: Iterable[KVCacheSpec], config: LengthInputs) -> int:
    counts = [cdiv(max_memory_bytes(s, config), page_bytes(s)) for s in specs]
    return max(counts, default=0)


def group_blocks_per_request(
    group: KVCacheGroupSpec, config: LengthInputs, worker_layers: Collection[str] | None = None
) -> int:
    """Blocks of the shared pool one request takes in ``group`` (contract.md#core-admission).

    A plain group counts its spec's blocks.  A uniform-type group counts its
    hungriest layer, among those on the worker (``worker_layers``); when none
    of its layers is on the worker it still counts, over all its layers,
    because block IDs are shared by every worker.
    """
    spec = group.kv_cache_spec
    if not isinstance(spec, UniformTypeKVCacheSpecs):
        return _blocks([spec], config)
    names = [n for n in group.layer_names if n in spec.kv_cache_specs]
    present = names if worker_layers is None else [n for n in names if n in worker_layers]
    chosen = present or list(spec.kv_cache_specs)
    return _blocks((spec.kv_cache_specs[n] for n in chosen), config)


def request_need_bytes(
    config: LengthInputs,
    groups: Sequence[KVCacheGroupSpec],
    bytes_per_block: int,
    worker_layers: Collection[str] | None = None,
) -> int:
    """Device bytes one request at ``config.max_model_len`` needs on a worker.

    See contract.md#core-admission.

    ``bytes_per_block * Σ blocks(g)`` over the device groups (host-resident
    groups have their own pool): every group claims whole blocks of the one
    shared pool, so a block is charged at the worker's bytes per block, not
    at the group's own page.  ``groups`` are the global groups (or a worker's
    projection of them); ``worker_layers`` restricts uniform-type groups to
    the worker's layers (see :func:`group_blocks_per_request`).
    """
    blocks = sum(
        group_blocks_per_request(g, config, worker_layers) for g in groups if not g.host_resident
    )
    return bytes_per_block * blocks


# -- typed views ------------------------------------------------------------------------


def typed_view_misfits(
    offset: int, num_layers: int, strides: Strides, page: PageGeometry
) -> dict[str, int]:
    """Offsets and strides a worker cannot view in the layer's dtype.

    See contract.md#views-and-strides.

    Reinterpreting a layer's bytes as ``dtype`` needs its storage offset, its
    block, head and state strides and ``C`` to be multiples of
    ``sizeof(dtype)``; the layer stride too when the tensor has several
    layers (one layer's view never steps over it).  Empty when the layer is
    viewed as raw bytes.
    """
    if page.dtype is None or not page.layer_views:
        return {}
    size = dtype_bytes(page.dtype)
    values = {"offset": offset}
    if num_layers > 1:
        values["layer_stride"] = strides[0]
    values.update(
        block_stride=strides[1],
        head_stride=strides[2],
        state_stride=strides[3],
        content_bytes=page.content,
    )
    return {name: value for name, value in values.items() if value % size}
