"""Turn a :class:`~kvref.records.KVCacheConfig` into torch tensors on a device.

See contract.md#views-and-strides and contract.md#host-residency.

This is what a worker does with a plan: one zeroed byte buffer of ``size``
bytes on the device, host buffers for host-resident tensors, and one strided
view per layer.  Every view is checked against its storage with exact integer
arithmetic *before* ``torch.as_strided`` sees it, so a hostile plan raises a
:class:`~kvref.errors.PlacementError` instead of addressing memory it does
not own.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType

import attrs
import torch

from kvref.axes import HOST_LAYOUT
from kvref.errors import PlacementError
from kvref.kernel_blocks import kernel_tensor_geometries
from kvref.layout import (
    KVCacheLayout,
    Strides,
    compute_layer_kv_cache_shape_bytes,
    compute_layout_strides,
)
from kvref.records import KVCacheConfig, KVCacheTensor
from kvref.specs import KVCacheSpec

__all__ = [
    "HOST_LAYOUT",
    "KVCacheAllocation",
    "TensorGeometry",
    "ViewProblem",
    "allocate_backings",
    "allocate_kv_cache",
    "kernel_geometries",
    "planned_device_bytes",
    "planned_host_bytes",
    "resolve_layout",
    "tensor_geometries",
    "view_problems",
]


#: Index in ``KVCacheAllocation.backing_of`` meaning "the device buffer".
DEVICE_BACKING = -1

_STRIDE_NAMES = ("layer_stride", "block_stride", "head_stride", "state_stride")


def resolve_layout(
    kv_cache_config: KVCacheConfig, layout: KVCacheLayout | str | None = None
) -> KVCacheLayout:
    """Return the layout of the device tensors: ``layout``, else the config's, else LBNHC."""
    if layout is not None:
        return KVCacheLayout.parse(layout)
    return kv_cache_config.kv_cache_layout or KVCacheLayout.LBNHC


def planned_device_bytes(kv_cache_config: KVCacheConfig) -> int:
    """Bytes of the device backing the config asks for (0 without device tensors).

    With mismatched device sizes (which allocation rejects) this is the largest.
    """
    return kv_cache_config.device_size


def planned_host_bytes(kv_cache_config: KVCacheConfig) -> int:
    """Bytes of all host backings: one per distinct host-resident tensor size."""
    return sum({t.size for t in kv_cache_config.host_tensors})


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


def _first_group_of(kv_cache_config: KVCacheConfig) -> dict[str, int]:
    owner: dict[str, int] = {}
    for index, group in enumerate(kv_cache_config.kv_cache_groups):
        for name in group.layer_names:
            owner.setdefault(name, index)
    return owner


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
    owner = _first_group_of(kv_cache_config)
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
        num_blocks = kv_cache_config.num_blocks_of(tensor)
        blocks, heads, states, content = compute_layer_kv_cache_shape_bytes(spec, num_blocks)
        strides = compute_layout_strides(
            spec,
            num_blocks,
            len(tensor.layers),
            this_layout,
            fixed=(tensor.layer_stride, tensor.block_stride, None, None, None),
        )
        out.append(
            TensorGeometry(
                index=index,
                tensor=tensor,
                spec=spec,
                layout=this_layout,
                shape=(len(tensor.layers), blocks, heads, states, content),
                strides=strides,
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
) -> tuple[TensorGeometry | None, ...]:
    """Every tensor's geometry as the attention kernels read it, in config order.

    Shapes count kernel blocks (``N * r``) and strides step them
    (:func:`kvref.kernel_blocks.kernel_tensor_geometries`); ``None`` for a
    tensor without per-layer views.  ``layout`` as in :func:`resolve_layout`.

    Raises:
        PlacementError: a tensor's first layer belongs to no group.
        LayoutError: a split block that is not one dense page.
    """
    chosen = resolve_layout(kv_cache_config, layout)
    return tuple(
        None
        if k is None
        else TensorGeometry(
            index=k.index,
            tensor=k.tensor,
            spec=k.spec,
            layout=k.layout,
            shape=k.shape,
            strides=k.strides,
        )
        for k in kernel_tensor_geometries(kv_cache_config, kernel_block_sizes, chosen)
    )


def _single_size(tensors: Sequence[KVCacheTensor], what: str) -> int | None:
    sizes = sorted({t.size for t in tensors})
    if len(sizes) > 1:
        raise PlacementError(
            f"{what} tensors must share one backing size, got sizes {sizes} bytes "
            "(vLLM's allocate_kv_cache asserts a single size)"
        )
    return sizes[0] if sizes else None


def _accelerator_type() -> str | None:
    if torch.cuda.is_available():
        return "cuda"
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is None or not accelerator.is_available():
        return None
    current = accelerator.current_accelerator()
    return None if current is None else str(current.type)


def _wants_pinning(device: torch.device, pin_host: bool | None) -> bool:
    if pin_host is not None:
        return pin_host
    # Pinned memory belongs to an accelerator runtime: only ask for it when the
    # target device is the accelerator this process has.
    return device.type not in ("cpu", "meta") and _accelerator_type() == device.type


def allocate_backings(
    kv_cache_config: KVCacheConfig,
    device: str | torch.device,
    *,
    pin_host: bool | None = None,
    host_device: str | torch.device = "cpu",
    include_host: bool = True,
) -> tuple[torch.Tensor | None, tuple[torch.Tensor, ...], bool]:
    """Allocate the zeroed backings of a config, without any view.

    Returns ``(device_buffer, host_buffers, host_pinned)``: the device buffer
    (``None`` without device tensors), one host buffer per distinct host
    tensor size in order of first appearance, and whether they are pinned.

    Raises:
        PlacementError: device tensors disagree on ``size`` (contract.md#placement-backing).
        RuntimeError: ``pin_host=True`` but this process cannot pin memory.

    """
    target = torch.device(device)
    size = _single_size(kv_cache_config.device_tensors, "device")
    # vLLM allocates int8; uint8 is the same bytes and prints as unsigned.
    device_buffer = None if size is None else torch.zeros(size, dtype=torch.uint8, device=target)
    host_buffers: list[torch.Tensor] = []
    pinned = False
    if include_host:
        host = torch.device(host_device)
        host_sizes = list(dict.fromkeys(t.size for t in kv_cache_config.host_tensors))
        pin = bool(host_sizes) and host.type == "cpu" and _wants_pinning(target, pin_host)
        for host_size in host_sizes:
            buffer: torch.Tensor | None = None
            if pin:
                try:
                    buffer = torch.zeros(host_size, dtype=torch.uint8, pin_memory=True)
                except RuntimeError:
                    if pin_host:
                        raise
                    # Auto mode: an unpinned pool is slower, not wrong.
                    pin = False
            if buffer is None:
                buffer = torch.zeros(host_size, dtype=torch.uint8, device=host)
            host_buffers.append(buffer)
        pinned = pin
    return device_buffer, tuple(host_buffers), pinned


def _raw_view(buffer: torch.Tensor, geometry: TensorGeometry) -> torch.Tensor:
    if geometry.is_empty:
        # Nothing is addressed; keep torch from range-checking a meaningless offset.
        return buffer.as_strided(geometry.shape, (0, 0, 0, 0, 1), 0)
    return buffer.as_strided(geometry.shape, geometry.strides, geometry.offset)


@attrs.define(kw_only=True, eq=False)
class KVCacheAllocation:
    """The tensors of one worker's KV cache: backings and per-layer views.

    Use as a context manager, or call :meth:`close`, to drop this object's
    references to the memory (views the caller still holds keep it alive).

    Attributes:
        device: where ``device_buffer`` lives.
        layout: the layout of the device tensors' views.
        device_buffer: the zeroed ``uint8`` backing of ``size`` bytes (``None`` without
            device tensors).
        host_buffers: host backings, one per distinct host tensor size.
        host_pinned: whether the host backings are pinned.
        views: layer name to its view, shape ``(N, H, S, C / sizeof(dtype))`` in the spec's
            dtype (raw bytes for specs without one, such as Mamba); a spec without
            layer views (HiSparse resident and hot) maps to the whole backing.
        geometries: the geometry of every config tensor, in config order.
        tensor_views: the raw 5-D ``uint8`` view ``(L, N, H, S, C)`` of every config tensor.
        backing_of: for every config tensor, the index of its host buffer, or
            :data:`DEVICE_BACKING`.
        kernel_block_sizes: the kernel block size of each group the views were
            split with (``None``: not asked for).
        kernel_geometries: with ``kernel_block_sizes``, every tensor's kernel
            view geometry (``None`` where it has no per-layer view).
        kernel_views: with ``kernel_block_sizes``, layer name to its kernel view,
            shape ``(N * r, H, S_k, C / sizeof(dtype))``: what the worker binds
            to the layer and its attention kernels read (vLLM's views with
            ``kernel_block_sizes``).

    """

    device: torch.device
    layout: KVCacheLayout
    device_buffer: torch.Tensor | None
    host_buffers: tuple[torch.Tensor, ...]
    host_pinned: bool
    views: dict[str, torch.Tensor]
    geometries: tuple[TensorGeometry, ...]
    tensor_views: tuple[torch.Tensor, ...]
    backing_of: tuple[int, ...]
    kernel_block_sizes: tuple[int, ...] | None = None
    kernel_geometries: tuple[TensorGeometry | None, ...] = ()
    kernel_views: dict[str, torch.Tensor] = attrs.Factory(dict)
    closed: bool = False

    def backing(self, index: int) -> torch.Tensor:
        """Return the backing buffer of config tensor ``index``."""
        where = self.backing_of[index]
        if where == DEVICE_BACKING:
            assert self.device_buffer is not None  # a device tensor implies a device buffer
            return self.device_buffer
        return self.host_buffers[where]

    def close(self) -> None:
        """Drop every reference this object holds to device and host memory."""
        self.device_buffer = None
        self.host_buffers = ()
        self.views = {}
        self.kernel_views = {}
        self.tensor_views = ()
        self.closed = True

    def __enter__(self) -> KVCacheAllocation:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def allocate_kv_cache(
    kv_cache_config: KVCacheConfig,
    device: str | torch.device,
    *,
    layout: KVCacheLayout | str | None = None,
    pin_host: bool | None = None,
    host_device: str | torch.device = "cpu",
    kernel_block_sizes: Sequence[int] | None = None,
) -> KVCacheAllocation:
    """Allocate a config's backings on ``device`` and build every layer's view.

    See contract.md#views-and-strides.

    The device backing is one zeroed ``uint8`` buffer of the (single) device
    tensor ``size``; host-resident tensors get zeroed buffers on
    ``host_device`` (the CPU), pinned when ``pin_host`` is true, or, with
    ``pin_host=None``, when ``device`` is this process's accelerator and
    pinning works.  Each layer gets an ``as_strided`` view
    ``(N, H, S, C)`` reinterpreted as its spec's ``view_dtype``.  Everything
    is validated before anything is allocated.

    Args:
        kv_cache_config: the plan.
        device: any torch device: ``"cpu"``, ``"cuda:1"``, ``"xpu"``, ``"meta"``...
        layout: layout of the device tensors; default the config's, else LBNHC.
        pin_host: pin host backings (``None``: automatic).
        host_device: where host backings go; ``"meta"`` only to check shapes.
        kernel_block_sizes: the kernel block size of each group (vLLM's
            ``kernel_block_sizes``; :func:`kvref.kernel_blocks.prepare_kernel_block_sizes`
            computes the worker's); also builds :attr:`KVCacheAllocation.kernel_views`.

    Raises:
        PlacementError: device tensors of different sizes, a layer in two tensors, a
            layer without a group, a view outside its backing, or a view (kernel
            view included) whose offset or strides are not multiples of ``sizeof(dtype)``.
        LayoutError: a padded page the layout cannot express, or a split block
            that is not one dense page.

    """
    target = torch.device(device)
    chosen = resolve_layout(kv_cache_config, layout)
    _single_size(kv_cache_config.device_tensors, "device")
    geometries = tensor_geometries(kv_cache_config, chosen)
    seen: dict[str, int] = {}
    for geometry in geometries:
        problems = view_problems(geometry, geometry.tensor.size)
        if problems:
            raise PlacementError(problems[0].message)
        for name in geometry.tensor.layers:
            if name in seen:
                raise PlacementError(
                    f"layer {name!r} appears in kv_cache_tensors[{seen[name]}] and "
                    f"kv_cache_tensors[{geometry.index}]; a layer needs exactly one view"
                )
            seen[name] = geometry.index

    kernel = (
        ()
        if kernel_block_sizes is None
        else kernel_geometries(kv_cache_config, kernel_block_sizes, chosen)
    )
    for kernel_geometry in kernel:
        problems = (
            []
            if kernel_geometry is None
            else view_problems(kernel_geometry, kernel_geometry.tensor.size)
        )
        if problems:
            raise PlacementError(f"kernel view: {problems[0].message}")

    device_buffer, host_buffers, pinned = allocate_backings(
        kv_cache_config, target, pin_host=pin_host, host_device=host_device
    )
    host_index = {buf.numel(): i for i, buf in enumerate(host_buffers)}
    backing_of: list[int] = []
    tensor_views: list[torch.Tensor] = []
    views: dict[str, torch.Tensor] = {}
    for geometry in geometries:
        if geometry.tensor.host_resident:
            where = host_index[geometry.tensor.size]
            buffer = host_buffers[where]
        else:
            where = DEVICE_BACKING
            assert device_buffer is not None  # allocated because this tensor exists
            buffer = device_buffer
        backing_of.append(where)
        raw = _raw_view(buffer, geometry)
        tensor_views.append(raw)
        dtype = geometry.spec.view_dtype if geometry.spec is not None else None
        if geometry.spec is not None and not getattr(geometry.spec, "has_layer_views", True):
            # HiSparse resident and hot layers address the backing themselves.
            views.update(dict.fromkeys(geometry.tensor.layers, buffer))
            continue
        for index, name in enumerate(geometry.tensor.layers):
            layer_view = raw[index]
            if dtype is not None:
                layer_view = layer_view.view(dtype)
            views[name] = layer_view
    kernel_views: dict[str, torch.Tensor] = {}
    for kernel_geometry in kernel:
        if kernel_geometry is None:
            continue
        where = backing_of[kernel_geometry.index]
        backing = device_buffer if where == DEVICE_BACKING else host_buffers[where]
        assert backing is not None  # a device tensor implies a device buffer
        raw = _raw_view(backing, kernel_geometry)
        dtype = kernel_geometry.spec.view_dtype if kernel_geometry.spec is not None else None
        for index, name in enumerate(kernel_geometry.tensor.layers):
            kernel_views[name] = raw[index] if dtype is None else raw[index].view(dtype)
    return KVCacheAllocation(
        device=target,
        layout=chosen,
        device_buffer=device_buffer,
        host_buffers=host_buffers,
        host_pinned=pinned,
        views=views,
        geometries=geometries,
        tensor_views=tuple(tensor_views),
        backing_of=tuple(backing_of),
        kernel_block_sizes=None if kernel_block_sizes is None else tuple(kernel_block_sizes),
        kernel_geometries=kernel,
        kernel_views=kernel_views,
    )
