"""The kit's model of a worker turning a plan into tensors (contract.md#views-and-strides).

A worker allocates one zeroed byte buffer of the device tensors' single
``size``, one host buffer per distinct host-resident size
(contract.md#host-residency), and views every layer of a tensor through a
5-D strided view ``(L, N, H, S, C)`` with the layer and block strides of the
record and the rest from the layout.  The device checks
(:mod:`conformance.check.device`) allocate plans through this module, whose
strides come from :mod:`conformance.check.geometry`, so a plan is judged by
the contract's geometry rather than by kvref's own allocation code.

Every view is checked with exact integers before :func:`torch.as_strided`
sees it, so a hostile plan raises :class:`WorkerError` instead of addressing
memory it does not own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import TracebackType

import attrs
import torch

from conformance.check.geometry import (
    OracleError,
    PageGeometry,
    Strides,
    layout_strides,
    page_geometry,
    typed_view_misfits,
    view_extents,
)
from kvref.axes import HOST_LAYOUT
from kvref.layout import KVCacheLayout
from kvref.records import KVCacheConfig, KVCacheTensor
from kvref.specs import KVCacheSpec

__all__ = [
    "DEVICE_BACKING",
    "TensorGeometry",
    "ViewProblem",
    "WorkerAllocation",
    "WorkerError",
    "allocate_backings",
    "allocate_kv_cache",
    "drop_scratch",
    "planned_device_bytes",
    "planned_host_bytes",
    "resolve_layout",
    "tensor_geometries",
    "view_problems",
]

#: Index in :attr:`WorkerAllocation.backing_of` meaning "the device buffer".
DEVICE_BACKING = -1


class WorkerError(ValueError):
    """A worker could not allocate or view the plan; the message names the tensor and numbers."""


def resolve_layout(
    config: KVCacheConfig, layout: KVCacheLayout | str | None = None
) -> KVCacheLayout:
    """The layout of the device tensors: ``layout``, else the config's, else LBNHC."""
    if layout is not None:
        return KVCacheLayout.parse(layout)
    return config.kv_cache_layout or KVCacheLayout.LBNHC


def planned_device_bytes(config: KVCacheConfig) -> int:
    """Bytes of the device backing (the largest device size; 0 without device tensors)."""
    return max((t.size for t in config.kv_cache_tensors if not t.host_resident), default=0)


def planned_host_bytes(config: KVCacheConfig) -> int:
    """Bytes of all host backings: one per distinct host-resident tensor size."""
    return sum({t.size for t in config.kv_cache_tensors if t.host_resident})


@attrs.frozen(kw_only=True)
class TensorGeometry:
    """One tensor record as a worker views it.

    Attributes:
        index: position of the tensor in ``config.kv_cache_tensors``.
        tensor: the record.
        spec: the per-layer spec of ``tensor.layers[0]`` (``None`` without layers).
        page: that spec's page (``None`` without layers).
        layout: the layout the strides are in.
        shape: extents ``(L, N, H, S, C)``, ``C`` in bytes.
        strides: byte strides ``(L, B, H, S, C)``.

    """

    index: int
    tensor: KVCacheTensor
    spec: KVCacheSpec | None
    page: PageGeometry | None
    layout: KVCacheLayout
    shape: tuple[int, int, int, int, int]
    strides: Strides

    @property
    def offset(self) -> int:
        """Byte of layer 0, block 0 in the backing."""
        return self.tensor.offset

    @property
    def is_empty(self) -> bool:
        """Whether the tensor addresses no byte (no layers, no blocks, an empty page)."""
        return 0 in self.shape

    @property
    def page_bytes(self) -> int:
        """Bytes one (layer, block) view addresses: ``H * S * C``."""
        return self.shape[2] * self.shape[3] * self.shape[4]

    def layer_start(self, layer: int) -> int:
        """Byte where layer index ``layer`` starts."""
        return self.offset + layer * self.strides[0]

    def layer_end(self, layer: int) -> int:
        """One past the farthest byte of layer index ``layer`` (its start when empty)."""
        start = self.layer_start(layer)
        if self.is_empty:
            return start
        # Strides are non-negative: the last index of every axis is the farthest byte.
        reach = sum((e - 1) * s for e, s in zip(self.shape[1:], self.strides[1:], strict=True))
        return start + reach + 1

    @property
    def end(self) -> int:
        """One past the farthest byte of the tensor (0 when empty)."""
        return 0 if self.is_empty else self.layer_end(self.shape[0] - 1)

    def block_address(self, layer: int, block: int) -> int:
        """Byte where ``(layer, block)``'s view starts."""
        return self.layer_start(layer) + block * self.strides[1]


@attrs.frozen(kw_only=True)
class ViewProblem:
    """Why a layer's view cannot be built.

    Attributes:
        kind: ``"bounds"`` (outside the backing) or ``"dtype"`` (not reinterpretable).
        tensor_index: position of the tensor in the config.
        layer: the layer concerned.
        message: what is wrong, with the numbers.
        byte_range: the bytes the layer would address, end exclusive (``"bounds"`` only).

    """

    kind: str
    tensor_index: int
    layer: str
    message: str
    byte_range: tuple[int, int] | None = None


def _owners(config: KVCacheConfig) -> dict[str, int]:
    owner: dict[str, int] = {}
    for index, group in enumerate(config.kv_cache_groups):
        for name in group.layer_names:
            owner.setdefault(name, index)
    return owner


def _geometry(
    config: KVCacheConfig, index: int, tensor: KVCacheTensor, layout: KVCacheLayout, group: int
) -> TensorGeometry:
    first = tensor.layers[0]
    # A worker views every layer of a tensor with its first layer's spec.
    spec = config.kv_cache_groups[group].layer_spec(first)
    num_blocks = config.num_blocks_of(tensor)
    try:
        page = page_geometry(spec)
        blocks, heads, states, content = view_extents(spec, num_blocks)
        strides = layout_strides(
            spec,
            num_blocks,
            len(tensor.layers),
            layout,
            pinned=(tensor.layer_stride, tensor.block_stride, None, None, None),
        )
    except OracleError as error:
        raise WorkerError(f"kv_cache_tensors[{index}] layer {first!r}: {error}") from error
    return TensorGeometry(
        index=index,
        tensor=tensor,
        spec=spec,
        page=page,
        layout=layout,
        shape=(len(tensor.layers), blocks, heads, states, content),
        strides=strides,
    )


def tensor_geometries(
    config: KVCacheConfig, layout: KVCacheLayout | str | None = None
) -> tuple[TensorGeometry, ...]:
    """The geometry of every tensor, in config order.

    Device tensors use ``layout`` (see :func:`resolve_layout`) and ``num_blocks``;
    host-resident ones use LBNHC and the host pool's block count.

    Raises:
        WorkerError: a tensor's first layer is in no group, or its spec has no
            geometry in the layout (a padded page the layout cannot hold).
    """
    device_layout = resolve_layout(config, layout)
    owner = _owners(config)
    out: list[TensorGeometry] = []
    for index, tensor in enumerate(config.kv_cache_tensors):
        this_layout = HOST_LAYOUT if tensor.host_resident else device_layout
        if not tensor.layers:
            empty = (tensor.layer_stride, tensor.block_stride, 0, 0, 1)
            out.append(
                TensorGeometry(
                    index=index,
                    tensor=tensor,
                    spec=None,
                    page=None,
                    layout=this_layout,
                    shape=(0, 0, 0, 0, 0),
                    strides=empty,
                )
            )
            continue
        group = owner.get(tensor.layers[0])
        if group is None:
            raise WorkerError(
                f"kv_cache_tensors[{index}]: layer {tensor.layers[0]!r} belongs to no KV cache "
                "group, so its page shape is unknown"
            )
        out.append(_geometry(config, index, tensor, this_layout, group))
    return tuple(out)


def _bounds_problem(geometry: TensorGeometry, backing_bytes: int) -> ViewProblem:
    tensor = geometry.tensor
    num_layers, num_blocks, heads, states, content = geometry.shape
    # layer_end grows with the layer index: find the first layer that leaves the backing.
    stride = geometry.strides[0]
    reach = geometry.layer_end(0) - geometry.offset
    first = 0 if stride == 0 else (backing_bytes - geometry.offset - reach) // stride + 1
    first = min(max(first, 0), num_layers - 1)
    start, end = geometry.layer_start(first), geometry.layer_end(first)
    return ViewProblem(
        kind="bounds",
        tensor_index=geometry.index,
        layer=tensor.layers[first],
        message=(
            f"kv_cache_tensors[{geometry.index}] layer {tensor.layers[first]!r} (index {first}) "
            f"spans bytes [{start}, {end}) but its backing holds {backing_bytes} bytes "
            f"(offset={tensor.offset}, layer_stride={tensor.layer_stride}, "
            f"block_stride={tensor.block_stride}, num_blocks={num_blocks}, "
            f"(H, S, C)=({heads}, {states}, {content}))"
        ),
        byte_range=(start, end),
    )


def view_problems(geometry: TensorGeometry, backing_bytes: int) -> list[ViewProblem]:
    """Why the views of ``geometry`` cannot be built in ``backing_bytes`` bytes.

    The farthest byte must lie inside the backing (contract.md#memory-safety),
    and typed views need their offsets and strides in whole elements
    (contract.md#views-and-strides).  Empty: :func:`torch.as_strided` and
    ``Tensor.view(dtype)`` both succeed.
    """
    page = geometry.page
    if page is None:
        return []
    problems: list[ViewProblem] = []
    if not geometry.is_empty and geometry.end > backing_bytes:
        problems.append(_bounds_problem(geometry, backing_bytes))
    misfits = typed_view_misfits(geometry.offset, geometry.shape[0], geometry.strides, page)
    if misfits and page.dtype is not None:
        name, value = next(iter(misfits.items()))
        layer = geometry.tensor.layers[0]
        problems.append(
            ViewProblem(
                kind="dtype",
                tensor_index=geometry.index,
                layer=layer,
                message=(
                    f"kv_cache_tensors[{geometry.index}] layer {layer!r}: {name}={value} is not "
                    f"a multiple of sizeof({page.dtype})={page.dtype.itemsize}, so the layer's "
                    f"bytes cannot be viewed as {page.dtype}"
                ),
            )
        )
    return problems


def _single_size(tensors: Sequence[KVCacheTensor]) -> int | None:
    sizes = sorted({t.size for t in tensors})
    if len(sizes) > 1:
        raise WorkerError(
            f"device tensors must share one backing size, got sizes {sizes} bytes "
            "(contract.md#placement-backing)"
        )
    return sizes[0] if sizes else None


def _pinning_possible(device: torch.device) -> bool:
    # Pinned memory belongs to an accelerator runtime: ask for it only next to this
    # process's accelerator.
    if device.type in ("cpu", "meta"):
        return False
    if device.type == "cuda":
        return torch.cuda.is_available()
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is None or not accelerator.is_available():
        return False
    current = accelerator.current_accelerator()
    return current is not None and current.type == device.type


def _host_buffer(
    size: int, host: torch.device, pin: bool, make: Callable[..., torch.Tensor]
) -> tuple[torch.Tensor, bool]:
    if pin:
        try:
            return make(size, dtype=torch.uint8, pin_memory=True), True
        except RuntimeError:
            pass  # an unpinned pool is slower, not wrong
    return make(size, dtype=torch.uint8, device=host), False


#: The reused CPU device backing of ``scratch`` allocations (at most one buffer).
_SCRATCH: list[torch.Tensor] = []


def _scratch_backing(size: int) -> torch.Tensor:
    # A fresh CPU buffer of this size costs a page fault per 4 KiB page on first
    # touch, which is most of what writing it costs; a reused one is warm.
    if not _SCRATCH or _SCRATCH[0].numel() < size:
        _SCRATCH.clear()  # free the smaller buffer before taking the larger one
        _SCRATCH.append(torch.empty(size, dtype=torch.uint8))
    return _SCRATCH[0][:size]


def drop_scratch() -> None:
    """Free the reused CPU backing of ``scratch=True`` allocations (if any)."""
    _SCRATCH.clear()


def allocate_backings(
    config: KVCacheConfig,
    device: str | torch.device,
    *,
    pin_host: bool | None = None,
    host_device: str | torch.device = "cpu",
    include_host: bool = True,
    zeroed: bool = True,
    scratch: bool = False,
) -> tuple[torch.Tensor | None, tuple[torch.Tensor, ...], bool]:
    """Allocate the backings of a plan, without views.

    Returns ``(device_buffer, host_buffers, host_pinned)``: the device buffer
    (``None`` without device tensors), one host buffer per distinct host size
    in order of first appearance, and whether all of those are pinned.

    ``zeroed=False`` leaves the bytes as the allocator hands them out: for a
    caller that reads nothing it did not write first.  Zeroing is most of
    what a large CPU allocation costs, since it touches every page.
    ``scratch=True`` (with ``zeroed=False``) takes a CPU device backing from
    one buffer reused from call to call (freed by :func:`drop_scratch`):
    only for a caller that also addresses nothing past the planned size,
    since torch bounds views by the larger buffer.

    Raises:
        WorkerError: device tensors disagree on ``size``.
        RuntimeError: ``pin_host=True`` and this process cannot pin memory.
    """
    target = torch.device(device)
    make = torch.zeros if zeroed else torch.empty
    size = _single_size([t for t in config.kv_cache_tensors if not t.host_resident])
    if size is None:
        device_buffer = None
    elif scratch and not zeroed and target.type == "cpu":
        device_buffer = _scratch_backing(size)
    else:
        device_buffer = make(size, dtype=torch.uint8, device=target)
    if not include_host:
        return device_buffer, (), False
    host = torch.device(host_device)
    sizes = list(dict.fromkeys(t.size for t in config.kv_cache_tensors if t.host_resident))
    want = _pinning_possible(target) if pin_host is None else pin_host
    pin = bool(sizes) and host.type == "cpu" and want
    buffers: list[torch.Tensor] = []
    for host_size in sizes:
        if pin and pin_host:
            buffers.append(make(host_size, dtype=torch.uint8, pin_memory=True))
            continue
        buffer, pinned = _host_buffer(host_size, host, pin, make)
        pin = pin and pinned
        buffers.append(buffer)
    return device_buffer, tuple(buffers), pin


@attrs.define(kw_only=True, eq=False)
class WorkerAllocation:
    """A worker's KV cache: backings and per-layer views.

    Use as a context manager, or call :meth:`close`, to drop this object's
    references to the memory.

    Attributes:
        device: where ``device_buffer`` lives.
        layout: the layout of the device tensors.
        device_buffer: the ``uint8`` device backing (``None`` without device tensors);
            zeroed unless allocated with ``zeroed=False``.
        host_buffers: host backings, one per distinct host size.
        host_pinned: whether the host backings are pinned.
        views: layer name to its view ``(N, H, S, C / sizeof(dtype))`` in the layer's dtype
            (raw bytes without one); a layer without views maps to its whole backing.
        geometries: the geometry of every tensor, in config order.
        tensor_views: the raw ``uint8`` view ``(L, N, H, S, C)`` of every tensor.
        backing_of: per tensor, its host buffer's index or :data:`DEVICE_BACKING`.
        closed: whether :meth:`close` ran.

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
    closed: bool = False

    def backing(self, index: int) -> torch.Tensor:
        """The backing buffer of tensor ``index``.

        Raises:
            WorkerError: the allocation is closed.
        """
        where = self.backing_of[index]
        buffer = self.device_buffer if where == DEVICE_BACKING else self.host_buffers[where]
        if buffer is None:
            raise WorkerError("the allocation is closed")
        return buffer

    def close(self) -> None:
        """Drop every reference this object holds to device and host memory."""
        self.device_buffer = None
        self.host_buffers = ()
        self.views = {}
        self.tensor_views = ()
        self.closed = True

    def __enter__(self) -> WorkerAllocation:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _validate(geometries: Sequence[TensorGeometry]) -> None:
    seen: dict[str, int] = {}
    for geometry in geometries:
        problems = view_problems(geometry, geometry.tensor.size)
        if problems:
            raise WorkerError(problems[0].message)
        for name in geometry.tensor.layers:
            if name in seen:
                raise WorkerError(
                    f"layer {name!r} is in kv_cache_tensors[{seen[name]}] and "
                    f"kv_cache_tensors[{geometry.index}]; a layer has exactly one view"
                )
            seen[name] = geometry.index


def _raw_view(buffer: torch.Tensor, geometry: TensorGeometry) -> torch.Tensor:
    if geometry.is_empty:
        # Nothing is addressed; keep torch from range-checking a meaningless offset.
        return buffer.as_strided(geometry.shape, (0, 0, 0, 0, 1), 0)
    return buffer.as_strided(geometry.shape, geometry.strides, geometry.offset)


def allocate_kv_cache(
    config: KVCacheConfig,
    device: str | torch.device,
    *,
    layout: KVCacheLayout | str | None = None,
    pin_host: bool | None = None,
    host_device: str | torch.device = "cpu",
    zeroed: bool = True,
    scratch: bool = False,
) -> WorkerAllocation:
    """Allocate a plan's backings on ``device`` and view every layer, as a worker does.

    Everything is validated before anything is allocated.

    Args:
        config: the plan.
        device: any torch device (``"cpu"``, ``"cuda:1"``, ``"meta"``...).
        layout: layout of the device tensors; default the config's, else LBNHC.
        pin_host: pin host backings (``None``: when ``device`` is this process's accelerator).
        host_device: where host backings go (``"meta"`` only to check shapes).
        zeroed: zero the backings (``False``: only for a caller that reads
            nothing it did not write first).
        scratch: take a CPU device backing from a reused buffer (see
            :func:`allocate_backings`); safe here, where every view is
            checked against the planned size first.

    Raises:
        WorkerError: device sizes differ, a layer is in two tensors or in no
            group, a view leaves its backing or cannot be typed, or a padded
            page the layout cannot hold.
    """
    target = torch.device(device)
    chosen = resolve_layout(config, layout)
    _single_size([t for t in config.kv_cache_tensors if not t.host_resident])
    geometries = tensor_geometries(config, chosen)
    _validate(geometries)
    device_buffer, host_buffers, pinned = allocate_backings(
        config, target, pin_host=pin_host, host_device=host_device, zeroed=zeroed, scratch=scratch
    )
    host_index = {int(buffer.numel()): i for i, buffer in enumerate(host_buffers)}
    backing_of: list[int] = []
    tensor_views: list[torch.Tensor] = []
    views: dict[str, torch.Tensor] = {}
    for geometry in geometries:
        host = geometry.tensor.host_resident
        where = host_index[geometry.tensor.size] if host else DEVICE_BACKING
        buffer = device_buffer if where == DEVICE_BACKING else host_buffers[where]
        if buffer is None:
            raise WorkerError(f"kv_cache_tensors[{geometry.index}] has no backing")
        backing_of.append(where)
        raw = _raw_view(buffer, geometry)
        tensor_views.append(raw)
        page = geometry.page
        if page is None:
            continue
        if not page.layer_views:
            # Raw-page layers (HiSparse resident and hot) address the backing themselves.
            views.update(dict.fromkeys(geometry.tensor.layers, buffer))
            continue
        for layer, name in enumerate(geometry.tensor.layers):
            views[name] = raw[layer] if page.dtype is None else raw[layer].view(page.dtype)
    return WorkerAllocation(
        device=target,
        layout=chosen,
        device_buffer=device_buffer,
        host_buffers=host_buffers,
        host_pinned=pinned,
        views=views,
        geometries=geometries,
        tensor_views=tuple(tensor_views),
        backing_of=tuple(backing_of),
    )
