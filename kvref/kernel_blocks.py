"""Kernel-block splitting: how a worker reads a plan's blocks through its attention kernels.

A KV cache manager block of ``block_size`` tokens is what planning sizes and
places.  An attention kernel may take only smaller blocks; vLLM's worker
then splits every manager block into ``r = block_size // kernel_block_size``
kernel blocks (vLLM ``prepare_kernel_block_sizes``, ``create_kv_cache_views``,
``AttentionGroup.map_to_kernel_block_table``):

- the kernel block size of a group is :func:`~kvref.backends.select_common_block_size`
  over the backends of its layers, except that a group whose tensors step
  blocks further than layers (block-outermost packing) is never split, and
  groups without per-layer views (HiSparse resident and hot) and Mamba
  groups keep their block size; encoder-only groups get no entry;
- kernel block ``j`` of manager block ``b`` is ``b * r + j``;
- a split is only possible when a manager block is one dense page: the
  tensor's block stride equals ``H * S * C`` at the manager block size (no
  padding, no other layer's page before the next block); the kernel view
  then steps ``block_stride // r`` per kernel block and holds
  ``S_k = get_num_kernel_states(kernel_block_size)`` states per block.

HiSparse picks one kernel block size for all its MLA layers before the
worker reports its specs (vLLM ``resolve_hisparse_specs``), and its MLA
specs take that block size: :func:`hisparse_kernel_block_size`.

When the worker binds the caches, each layer's own backend is asked again
(vLLM ``AttentionGroup.create_metadata_builders`` and
``map_kv_cache_to_kernel_blocks``; :func:`kernel_tensor_geometries` with a
``config``): where it needs kernel blocks smaller than the view it is given
(in a packed group, whose blocks are never split), a compressed cache
(``tokens_per_state > 1``) of one head slot whose block stride is a whole
number of kernel pages is re-strided, kernel block ``j`` of block ``b``
being ``b * s + j`` with ``s = block_stride // kernel page``; any other
cache is refused (:class:`~kvref.errors.KernelBlockError`, naming the layer,
the block size and the backend's kernel block sizes), as vLLM refuses
FlashMLA's 64-token kernel blocks under a packed 128-token block.

Not modelled: encoder-only layers at bind time (vLLM's kernel block size
list skips their groups), and layers of one tensor that bind different
kernel block sizes (:class:`~kvref.errors.UnsupportedError`).  Every refusal
is a typed kvref error (vLLM: ``ValueError``, ``AssertionError``,
``NotImplementedError``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs

from kvref.axes import HOST_LAYOUT, KVCacheLayout
from kvref.backends import DEFAULT_BACKEND, AttentionBackend, select_common_block_size
from kvref.config import PlanningConfig
from kvref.errors import (
    HiSparseError,
    KernelBlockError,
    LayoutError,
    PlacementError,
    UnsupportedError,
)
from kvref.layout import Strides, compute_layer_kv_cache_shape_bytes, compute_layout_strides
from kvref.records import KVCacheConfig, KVCacheGroupSpec, KVCacheTensor
from kvref.specs import (
    AttentionSpec,
    EncoderOnlyAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    UniformTypeKVCacheSpecs,
)

__all__ = [
    "KernelBlockSplit",
    "KernelTensorGeometry",
    "hisparse_kernel_block_size",
    "kernel_block_split",
    "kernel_tensor_geometries",
    "prepare_kernel_block_sizes",
]


@attrs.frozen(kw_only=True)
class KernelBlockSplit:
    """How manager blocks of one group split into kernel blocks.

    Attributes:
        block_size: tokens per manager block (the spec's ``block_size``).
        kernel_block_size: tokens per kernel block; divides ``block_size``.
        kernel_block_stride: kernel block IDs from one manager block to the
            next: ``0`` for ``r`` (the blocks are split in place); larger where
            a packed compressed cache is re-strided at bind time, whose kernel
            block IDs ``b * s + r`` to ``(b + 1) * s - 1`` then address other
            layers' pages and belong to no block (vLLM's ``kernel_block_stride``).
    """

    block_size: int
    kernel_block_size: int = attrs.field()
    kernel_block_stride: int = attrs.field(default=0)

    @kernel_block_size.validator
    def _divides(self, attribute: attrs.Attribute[int], value: int) -> None:
        if value <= 0 or self.block_size % value:
            raise LayoutError(
                f"KernelBlockSplit.kernel_block_size={value} must divide "
                f"block_size={self.block_size}"
            )

    @kernel_block_stride.validator
    def _covers(self, attribute: attrs.Attribute[int], value: int) -> None:
        if value and value < self.kernel_blocks_per_block:
            raise LayoutError(
                f"KernelBlockSplit.kernel_block_stride={value} must be 0 or at least the "
                f"{self.kernel_blocks_per_block} kernel blocks of a block"
            )

    @property
    def kernel_blocks_per_block(self) -> int:
        """``r``: kernel blocks per manager block."""
        return self.block_size // self.kernel_block_size

    @property
    def step(self) -> int:
        """Kernel block IDs from one manager block to the next (``kernel_block_stride or r``)."""
        return self.kernel_block_stride or self.kernel_blocks_per_block

    def kernel_block_ids(self, block_id: int) -> range:
        """The kernel block IDs of manager block ``block_id``: ``b * step + j`` for ``j < r``."""
        first = block_id * self.step
        return range(first, first + self.kernel_blocks_per_block)

    def manager_block_of(self, kernel_block_id: int) -> tuple[int, int]:
        """``(b, j)``: the manager block a kernel block belongs to, and its index inside it.

        Raises:
            LayoutError: with a ``kernel_block_stride``, an ID between two blocks' kernel blocks.
        """
        block, j = divmod(kernel_block_id, self.step)
        if j >= self.kernel_blocks_per_block:
            raise LayoutError(
                f"kernel block {kernel_block_id} lies between manager blocks {block} and "
                f"{block + 1} (kernel_block_stride={self.kernel_block_stride}): it is no "
                "block's"
            )
        return block, j


def kernel_block_split(block_size: int, backends: Sequence[AttentionBackend]) -> KernelBlockSplit:
    """The split the worker uses for manager blocks of ``block_size`` under ``backends``.

    Raises:
        LayoutError: the backends share no kernel block size dividing ``block_size``.
    """
    return KernelBlockSplit(
        block_size=block_size, kernel_block_size=select_common_block_size(block_size, backends)
    )


def _dispatch_spec(group: KVCacheGroupSpec) -> KVCacheSpec:
    spec = group.kv_cache_spec
    if isinstance(spec, UniformTypeKVCacheSpecs):
        # One type throughout: any layer answers for the group.
        return next(iter(spec.kv_cache_specs.values()))
    return spec


def _packed(kv_cache_config: KVCacheConfig, group: KVCacheGroupSpec) -> bool:
    names = set(group.layer_names)
    return any(
        t.block_stride > t.layer_stride
        for t in kv_cache_config.kv_cache_tensors
        if not names.isdisjoint(t.layers)
    )


def prepare_kernel_block_sizes(config: PlanningConfig, kv_cache_config: KVCacheConfig) -> list[int]:
    """The kernel block size of each group, as vLLM's worker computes it.

    Encoder-only groups get no entry (as in vLLM, the list then no longer
    lines up with the group IDs after them).

    Raises:
        LayoutError: an unpacked attention group's backends share no kernel
            block size that divides its block size.
        UnsupportedError: a group spec that is neither attention nor Mamba.
    """
    sizes: list[int] = []
    for group in kv_cache_config.kv_cache_groups:
        spec = _dispatch_spec(group)
        block_size = group.kv_cache_spec.block_size
        if isinstance(spec, EncoderOnlyAttentionSpec):
            continue
        if not getattr(spec, "has_layer_views", True) or isinstance(spec, MambaSpec):
            sizes.append(spec.block_size)
        elif isinstance(spec, AttentionSpec):
            if _packed(kv_cache_config, group):
                # Other layers' pages sit between this group's blocks.
                sizes.append(block_size)
            else:
                backends = config.backends_of(group.layer_names)
                sizes.append(select_common_block_size(block_size, backends))
        else:
            raise UnsupportedError(
                f"no kernel block size for a group of {type(spec).__name__} "
                f"(layers {list(group.layer_names)[:4]}): vLLM splits attention groups only"
            )
    return sizes


def hisparse_kernel_block_size(
    config: PlanningConfig, kv_cache_specs: Mapping[str, KVCacheSpec]
) -> int | None:
    """The block size HiSparse gives its MLA layers (vLLM ``resolve_hisparse_specs``).

    ``None`` without MLA layers.  Every MLA layer must have one block size;
    the result is the kernel block size all their backends take for it.

    Raises:
        HiSparseError: the MLA layers have several block sizes, or their
            backends share no kernel block size dividing it.
    """
    mla = {n: s for n, s in kv_cache_specs.items() if isinstance(s, MLAAttentionSpec)}
    if not mla:
        return None
    sizes = sorted({s.block_size for s in mla.values()})
    if len(sizes) != 1:
        raise HiSparseError(
            f"HiSparse requires one scheduler block size, but its MLA layers have {sizes}"
        )
    try:
        return select_common_block_size(sizes[0], config.backends_of(mla))
    except LayoutError as exc:
        raise HiSparseError(
            "HiSparse requires a GPU block size supported by every sparse attention and "
            f"indexer backend: {exc}"
        ) from None


@attrs.frozen(kw_only=True)
class KernelTensorGeometry:
    """One tensor as the kernels read it: ``(L, N * r, H, S_k, C)`` with kernel block strides.

    Attributes:
        index: position of the tensor in ``kv_cache_config.kv_cache_tensors``.
        tensor: the tensor record.
        spec: the per-layer spec of ``tensor.layers[0]``.
        layout: the layout the strides were computed in.
        split: how its manager blocks split (with a ``kernel_block_stride`` where a
            packed compressed cache is re-strided at bind time).
        shape: extents ``(L, N * r, H, S_k, C)``, ``C`` in bytes; re-strided,
            ``(N - 1) * s + r`` kernel blocks (``s`` the kernel block stride).
        strides: byte strides ``(L, B_k, H, S, C)``; ``B_k = block_stride // r``,
            re-strided the kernel page ``S_k * S``.
    """

    index: int
    tensor: KVCacheTensor
    spec: KVCacheSpec
    layout: KVCacheLayout
    split: KernelBlockSplit
    shape: tuple[int, int, int, int, int]
    strides: Strides

    def kernel_block_address(self, layer: int, kernel_block: int) -> int:
        """Byte where ``(layer, kernel_block)``'s kernel page starts."""
        return self.tensor.offset + layer * self.strides[0] + kernel_block * self.strides[1]


def first_group_of(kv_cache_config: KVCacheConfig) -> dict[str, int]:
    """Layer name -> the first group listing it (the group whose spec its tensor is viewed with)."""
    owner: dict[str, int] = {}
    for index, group in enumerate(kv_cache_config.kv_cache_groups):
        for name in group.layer_names:
            owner.setdefault(name, index)
    return owner


def _group_sizes(
    kv_cache_config: KVCacheConfig, kernel_block_sizes: Sequence[int]
) -> dict[int, int]:
    """Group ID -> kernel block size, skipping encoder-only groups as vLLM's list does."""
    out: dict[int, int] = {}
    sizes = iter(kernel_block_sizes)
    for gid, group in enumerate(kv_cache_config.kv_cache_groups):
        if isinstance(_dispatch_spec(group), EncoderOnlyAttentionSpec):
            continue
        size = next(sizes, None)
        if size is not None:
            out[gid] = size
    return out


def kernel_tensor_geometries(
    kv_cache_config: KVCacheConfig,
    kernel_block_sizes: Sequence[int],
    layout: KVCacheLayout,
    config: PlanningConfig | None = None,
) -> tuple[KernelTensorGeometry | None, ...]:
    """Every tensor's kernel view as the worker binds it, in config order (``None``: no view).

    Tensors without layers and those of specs without per-layer views
    (HiSparse resident and hot, which the worker binds to the raw backing)
    have no kernel view.  Host tensors use :data:`~kvref.axes.HOST_LAYOUT`.
    With ``config``, each attention layer's own backend is asked at bind time
    (see the module docstring); without it, every layer runs vLLM's base
    backend, which takes its group's kernel blocks.

    Raises:
        PlacementError: a tensor's first layer belongs to no group.
        LayoutError: a split block is not one dense page (vLLM's ``ValueError``
            "does not store blocks as dense, unpadded pages"), or the kernel
            block size does not divide the block size.
        KernelBlockError: a layer's backend needs kernel blocks its cache
            cannot be viewed as (vLLM's bind-time ``ValueError``).
        UnsupportedError: layers of one tensor bind different kernel blocks.
    """
    owner = first_group_of(kv_cache_config)
    by_group = _group_sizes(kv_cache_config, kernel_block_sizes)
    out: list[KernelTensorGeometry | None] = []
    for index, tensor in enumerate(kv_cache_config.kv_cache_tensors):
        if not tensor.layers:
            out.append(None)
            continue
        first = tensor.layers[0]
        if first not in owner:
            raise PlacementError(
                f"kv_cache_tensors[{index}]: layer {first!r} belongs to no KV cache group"
            )
        gid = owner[first]
        spec = kv_cache_config.kv_cache_groups[gid].layer_spec(first)
        if not getattr(spec, "has_layer_views", True):
            out.append(None)
            continue
        split = KernelBlockSplit(
            block_size=spec.block_size, kernel_block_size=by_group.get(gid, spec.block_size)
        )
        geometry = kernel_geometry(kv_cache_config, index, tensor, spec, split, layout)
        out.append(geometry if config is None else _bound(config, geometry))
    return tuple(out)


def _bind_size(config: PlanningConfig, name: str, geometry: KernelTensorGeometry) -> int:
    """The kernel block size layer ``name``'s own backend takes for its group's kernel blocks.

    vLLM ``create_metadata_builders``: ``select_common_block_size`` over the
    layer's backend alone, from the size its group's view was split into.
    """
    backends = config.backends_of([name]) or [DEFAULT_BACKEND]
    given = geometry.split.kernel_block_size
    try:
        return select_common_block_size(given, backends)
    except LayoutError:
        sizes = "; ".join(f"{b.name}: {list(b.supported_kernel_block_sizes)}" for b in backends)
        raise KernelBlockError(
            f"layer {name!r} (kv_cache_tensors[{geometry.index}]): its attention backend "
            f"takes no kernel block size dividing its {given}-token blocks ({sizes}); the "
            "worker cannot bind it"
        ) from None


def _bound(config: PlanningConfig, geometry: KernelTensorGeometry) -> KernelTensorGeometry:
    """``geometry`` as the worker binds it to its layers (vLLM ``map_kv_cache_to_kernel_blocks``).

    A layer whose backend takes the view's kernel blocks keeps the view.  One
    whose backend needs smaller ones than its view holds (only in a packed,
    unsplit group) gets a compressed cache re-strided, or is refused.
    """
    spec = geometry.spec
    if not isinstance(spec, AttentionSpec) or isinstance(spec, EncoderOnlyAttentionSpec):
        return geometry
    outcomes: dict[int, tuple[str, KernelTensorGeometry]] = {}
    for name in geometry.tensor.layers:
        size = _bind_size(config, name, geometry)
        if size not in outcomes:
            outcomes[size] = (name, _restrided(config, name, geometry, size))
    if len(outcomes) > 1:
        names = {size: name for size, (name, _) in outcomes.items()}
        raise UnsupportedError(
            f"kv_cache_tensors[{geometry.index}]: its layers bind different kernel block "
            f"sizes ({names}); kvref models one kernel view per tensor"
        )
    ((_, bound),) = outcomes.values()
    return bound


def _restrided(
    config: PlanningConfig, name: str, geometry: KernelTensorGeometry, size: int
) -> KernelTensorGeometry:
    """The view layer ``name`` binds with ``size``-token kernel blocks, or a KernelBlockError."""
    spec = geometry.spec
    num_layers, blocks, heads, states, content = geometry.shape
    rows = spec.get_num_kernel_states(size)
    if size == spec.block_size or states == rows:
        return geometry
    # Token and pooled caches are written through the manager blocks' slot
    # mapping: only a compressed cache of one head slot, whose blocks sit a
    # whole number of kernel pages apart, can be read in kernel blocks.
    page = rows * geometry.strides[3]
    block_stride = geometry.strides[1]
    if spec.tokens_per_state_value <= 1 or heads != 1 or page <= 0 or block_stride % page:
        sizes = [b.supported_kernel_block_sizes for b in config.backends_of([name])]
        raise KernelBlockError(
            f"layer {name!r} (kv_cache_tensors[{geometry.index}]): its attention backend "
            f"takes kernel blocks of {list(sizes[0]) if sizes else []} tokens and binds "
            f"{size}-token kernel blocks, which the packed {spec.block_size}-token cache blocks "
            f"(block_stride={block_stride}) cannot be split into; reduce the block size to "
            f"{size} or use a layer-compact layout (e.g. LBNHC)"
        )
    step = block_stride // page
    pages = max(0, (blocks - 1) * step + states // rows)
    return attrs.evolve(
        geometry,
        split=KernelBlockSplit(
            block_size=spec.block_size, kernel_block_size=size, kernel_block_stride=step
        ),
        shape=(num_layers, pages, heads, rows, content),
        strides=(geometry.strides[0], page, *geometry.strides[2:]),
    )


def kernel_geometry(
    kv_cache_config: KVCacheConfig,
    index: int,
    tensor: KVCacheTensor,
    spec: KVCacheSpec,
    split: KernelBlockSplit,
    device_layout: KVCacheLayout,
) -> KernelTensorGeometry:
    """Tensor ``index``'s layers viewed with ``spec``, their blocks split as ``split``.

    Host tensors use :data:`~kvref.axes.HOST_LAYOUT`, device ones ``device_layout``;
    an unsplit ``split`` (``r == 1``) gives the manager blocks' own view.

    Raises:
        LayoutError: a split block is not one dense page, or the padded page
            cannot be expressed in the layout.
    """
    layout = HOST_LAYOUT if tensor.host_resident else device_layout
    num_blocks = kv_cache_config.num_blocks_of(tensor)
    r = split.kernel_blocks_per_block
    kbs = split.kernel_block_size
    block_stride = tensor.block_stride
    if r > 1:
        _, heads, states, content = compute_layer_kv_cache_shape_bytes(spec, 1)
        dense = heads * states * content
        if block_stride != dense:
            raise LayoutError(
                f"kv_cache_tensors[{index}] (layers {list(tensor.layers)[:4]}): layout "
                f"{layout.name} does not store blocks as dense, unpadded pages (block_stride="
                f"{block_stride} != page {dense}), so a {split.block_size}-token block cannot "
                f"be split into {r} kernel blocks of {kbs} tokens; reduce the block size to "
                f"{kbs} or use a layer-compact layout"
            )
        block_stride //= r
    blocks, heads, states, content = compute_layer_kv_cache_shape_bytes(spec, num_blocks, kbs)
    strides = compute_layout_strides(
        spec,
        num_blocks,
        len(tensor.layers),
        layout,
        kbs if r > 1 else None,
        fixed=(tensor.layer_stride, block_stride, None, None, None),
    )
    return KernelTensorGeometry(
        index=index,
        tensor=tensor,
        spec=spec,
        layout=layout,
        split=split,
        shape=(len(tensor.layers), blocks, heads, states, content),
        strides=strides,
    )
