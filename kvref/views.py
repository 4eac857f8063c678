"""Where a plan's tensors put their bytes: each tensor as a 5-D strided view of its backing.

See contract.md#views-and-strides.  The geometry is computed and checked with
exact integer arithmetic, before any storage exists: :mod:`kvref.allocation`
allocates only what :func:`view_problems` finds nothing wrong with.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from kvref.axes import HOST_LAYOUT
from kvref.config import PlanningConfig
from kvref.errors import PlacementError
from kvref.kernel_blocks import (
    KernelBlockSplit,
    KernelTensorGeometry,
    first_group_of,
    kernel_geometry,
    kernel_tensor_geometries,
)
from kvref.layout import KVCacheLayout, Strides
from kvref.records import KVCacheConfig, KVCacheTensor
from kvref.specs import KVCacheSpec

__all__ = [
    "TensorGeometry",
    "ViewProblem",
    "kernel_geometries",
    "resolve_layout",
    "tensor_geometries",
    "view_problems",
]

_STRIDE_NAMES = ("layer_stride", "block_stride", "head_stride", "state_stride")


def resolve_layout(
    kv_cache_config: KVCacheConfig, layout: KVCacheLayout | str | None = None
) -> KVCacheLayout:
    """Return the layout of the device tensors: ``layout``, else the config's, else LBNHC."""
    if layout is not None:
        return KVCacheLayout.parse(layout)
    return kv_cache_config.kv_cache_layout or KVCacheLayout.LBNHC


@attrs.frozen(kw_only=True)
class TensorGeometry:
    """Where one :class:`KVCacheTensor` puts its bytes: a 5-D strided view of its backing.

    Attributes:
        index: position of the tensor in ``kv_cache_config.kv_cache_tensors``.
        tensor: the tensor record.
        spec: the per-layer spec of ``tensor.layers[0]`` (``None`` for a tensor without layers).
        layout: the layout the strides were computed in.
        shape: extents ``(L, N, H, S, C)``; ``C`` in bytes.
        strides: byte strides ``(L, B, H, S, C)``.

    """

    index: int
    tensor: KVCacheTensor
    spec: KVCacheSpec | None
    layout: KVCacheLayout
    shape: tuple[int, int, int, int, int]
    strides: Strides

    @property
    def offset(self) -> int:
        """Byte offset of layer 0, block 0 in the backing."""
        return self.tensor.offset

    @property
    def is_empty(self) -> bool:
        """Whether the tensor addresses no byte at all (no layers, no blocks...)."""
        return 0 in self.shape

    @property
    def page_bytes(self) -> int:
        """Footprint bytes of one (layer, block) page: ``H * S * C`` (padding excluded)."""
        return self.shape[2] * self.shape[3] * self.shape[4]

    def layer_start(self, layer: int) -> int:
        """Byte where layer index ``layer`` starts (its block 0, head 0, state 0)."""
        return self.offset + layer * self.strides[0]

    def layer_end(self, layer: int) -> int:
        """One past the last byte layer index ``layer`` addresses (its start when empty)."""
        start = self.layer_start(layer)
        if self.is_empty:
            return start
        # Strides are non-negative, so the last element along every axis is the farthest.
        reach = sum((e - 1) * s for e, s in zip(self.shape[1:], self.strides[1:], strict=True))
        return start + reach + 1

    @property
    def end(self) -> int:
        """One past the last byte of the whole tensor (0 when empty)."""
        return 0 if self.is_empty else self.layer_end(self.shape[0] - 1)

    def block_address(self, layer: int, block: int) -> int:
        """Byte where ``(layer, block)``'s page starts."""
        return self.layer_start(layer) + block * self.strides[1]


@attrs.frozen(kw_only=True)
class ViewProblem:
    """Why a layer's view cannot be built.

    Attributes:
        kind: ``"bounds"`` (outside the backing) or ``"dtype"`` (cannot be reinterpreted).
        tensor_index: position of the tensor in the config.
        layer: the layer concerned.
        message: what is wrong, with the numbers.
        byte_range: the bytes the layer would address, end exclusive, for ``"bounds"``.

    """

    kind: str
    tensor_index: int
    layer: str
    message: str
    byte_range: tuple[int, int] | None = None


def _as_tensor_geometry(k: KernelTensorGeometry) -> TensorGeometry:
    return TensorGeometry(
        index=k.index,
        tensor=k.tensor,
        spec=k.spec,
        layout=k.layout,
        shape=k.shape,
        strides=k.strides,
    )


def tensor_geometries(
    kv_cache_config: KVCacheConfig, layout: KVCacheLayout | str | None = None
) -> tuple[TensorGeometry, ...]:
    """Return the geometry of every tensor of the config, in config order.

    See contract.md#views-and-strides.

    Device tensors use ``layout`` (see :func:`resolve_layout`); host tensors
    use :data:`HOST_LAYOUT` and ``host_num_blocks``.

    Raises:
        PlacementError: a tensor's first layer belongs to no group.
        LayoutError: the spec's padded page cannot be expressed in the layout.

    """
    device_layout = resolve_layout(kv_cache_config, layout)
    owner = first_group_of(kv_cache_config)
    out: list[TensorGeometry] = []
    for index, tensor in enumerate(kv_cache_config.kv_cache_tensors):
        this_layout = HOST_LAYOUT if tensor.host_resident else device_layout
        if not tensor.layers:
            out.append(
                TensorGeometry(
                    index=index,
                    tensor=tensor,
                    spec=None,
                    layout=this_layout,
                    shape=(0, 0, 0, 0, 0),
                    strides=(tensor.layer_stride, tensor.block_stride, 0, 0, 1),
                )
            )
            continue
        first = tensor.layers[0]
        if first not in owner:
            raise PlacementError(
                f"kv_cache_tensors[{index}]: layer {first!r} belongs to no KV cache group, "
                "so its spec (and page shape) is unknown"
            )
        # The worker views every layer of a tensor with its first layer's spec
        # (contract.md#records).
        spec = kv_cache_config.kv_cache_groups[owner[first]].layer_spec(first)
        # The manager blocks' view is the kernel view of blocks split into one.
        unsplit = KernelBlockSplit(block_size=spec.block_size, kernel_block_size=spec.block_size)
        out.append(
            _as_tensor_geometry(
                kernel_geometry(kv_cache_config, index, tensor, spec, unsplit, device_layout)
            )
        )
    return tuple(out)


def view_problems(geometry: TensorGeometry, backing_bytes: int) -> list[ViewProblem]:
    """Why the views of ``geometry`` cannot be built in a backing of ``backing_bytes`` bytes.

    Checks the footprint bound of contract.md#memory-safety (the first layer out of bounds is
    reported) and the typed-view divisibility of P10 (every stride a view
    needs, plus ``C`` and each layer's storage offset).  An empty list means
    :func:`torch.as_strided` and ``Tensor.view(dtype)`` will both succeed.
    """
    problems: list[ViewProblem] = []
    tensor = geometry.tensor
    if geometry.spec is None:
        return problems
    num_layers, num_blocks, heads, states, content = geometry.shape
    if not geometry.is_empty and geometry.end > backing_bytes:
        # layer_end is increasing in the layer index: find the first layer that leaves.
        rest = geometry.layer_end(0) - geometry.offset
        stride = geometry.strides[0]
        first_out = 0 if stride == 0 else (backing_bytes - geometry.offset - rest) // stride + 1
        first_out = min(max(first_out, 0), num_layers - 1)
        start, end = geometry.layer_start(first_out), geometry.layer_end(first_out)
        problems.append(
            ViewProblem(
                kind="bounds",
                tensor_index=geometry.index,
                layer=tensor.layers[first_out],
                message=(
                    f"kv_cache_tensors[{geometry.index}] layer {tensor.layers[first_out]!r} "
                    f"(index {first_out}) spans bytes [{start}, {end}) but its backing holds "
                    f"{backing_bytes} bytes (offset={tensor.offset}, "
                    f"layer_stride={tensor.layer_stride}, block_stride={tensor.block_stride}, "
                    f"num_blocks={num_blocks}, (H, S, C)=({heads}, {states}, {content}))"
                ),
                byte_range=(start, end),
            )
        )
    dtype = geometry.spec.view_dtype if geometry.spec is not None else None
    itemsize = int(dtype.itemsize) if dtype is not None else 1
    if dtype is not None and itemsize > 1:
        fields: list[tuple[str, int]] = [("offset", tensor.offset)]
        # A single layer's view never uses the layer stride: only its storage offset.
        if num_layers > 1:
            fields.append(("layer_stride", geometry.strides[0]))
        fields += list(zip(_STRIDE_NAMES[1:], geometry.strides[1:4], strict=True))
        fields.append(("state_content_bytes (C)", content))
        for name, value in fields:
            if value % itemsize:
                problems.append(
                    ViewProblem(
                        kind="dtype",
                        tensor_index=geometry.index,
                        layer=tensor.layers[0],
                        message=(
                            f"kv_cache_tensors[{geometry.index}] layer {tensor.layers[0]!r}: "
                            f"{name}={value} is not a multiple of sizeof({dtype})={itemsize}, "
                            f"so the layer's bytes cannot be viewed as {dtype}"
                        ),
                    )
                )
                break
    return problems


def kernel_geometries(
    kv_cache_config: KVCacheConfig,
    kernel_block_sizes: Sequence[int],
    layout: KVCacheLayout | str | None = None,
    config: PlanningConfig | None = None,
) -> tuple[TensorGeometry | None, ...]:
    """Every tensor's geometry as the attention kernels read it, in config order.

    Shapes count kernel blocks (``N * r``) and strides step them
    (:func:`kvref.kernel_blocks.kernel_tensor_geometries`, which ``config``'s
    backends re-stride or refuse at bind time); ``None`` for a tensor
    without per-layer views.  ``layout`` as in :func:`resolve_layout`.

    Raises:
        PlacementError: a tensor's first layer belongs to no group.
        LayoutError: a split block that is not one dense page, or a layer's
            backend needs kernel blocks its cache cannot be viewed as
            (:class:`~kvref.errors.KernelBlockError`).
    """
    chosen = resolve_layout(kv_cache_config, layout)
    return tuple(
        None if k is None else _as_tensor_geometry(k)
        for k in kernel_tensor_geometries(kv_cache_config, kernel_block_sizes, chosen, config)
    )
