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

from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Any, Generic, Protocol, TypeVar

import attrs
import torch

from kvref.axes import HOST_LAYOUT
from kvref.config import PlanningConfig
from kvref.errors import PlacementError
from kvref.layout import KVCacheLayout
from kvref.records import KVCacheConfig, KVCacheTensor

# The geometry lives in kvref.views; it is re-exported here, where it was first published.
from kvref.views import (
    TensorGeometry,
    ViewProblem,
    kernel_geometries,
    resolve_layout,
    tensor_geometries,
    view_problems,
)

__all__ = [
    "BACKING_DTYPE",
    "DEVICE_BACKING",
    "HOST_LAYOUT",
    "KVCacheAllocation",
    "KVCacheBackings",
    "StridedGeometry",
    "TensorGeometry",
    "ViewProblem",
    "allocate_backings",
    "allocate_kv_cache",
    "kernel_geometries",
    "planned_device_bytes",
    "planned_host_bytes",
    "resolve_layout",
    "strided_view",
    "tensor_geometries",
    "view_problems",
]


#: Index in ``KVCacheAllocation.backing_of`` meaning "the device buffer".
DEVICE_BACKING = -1

#: The element type of every backing, hence of the views of specs without a
#: dtype: vLLM's worker allocates ``torch.int8`` (``allocate_kv_cache``, and
#: HiSparse's host pool, ``allocate_pinned_host_pool``).
BACKING_DTYPE = torch.int8


def planned_device_bytes(kv_cache_config: KVCacheConfig) -> int:
    """Bytes of the device backing the config asks for (0 without device tensors).

    With mismatched device sizes (which allocation rejects) this is the largest.
    """
    return kv_cache_config.device_size


def planned_host_bytes(kv_cache_config: KVCacheConfig) -> int:
    """Bytes of all host backings: one per distinct host-resident tensor size."""
    return sum({t.size for t in kv_cache_config.host_tensors})


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
    zeroed: bool = True,
    device_backing: Callable[[int], torch.Tensor] | None = None,
) -> tuple[torch.Tensor | None, tuple[torch.Tensor, ...], bool]:
    """Allocate the backings of a config (zeroed by default), without any view.

    Returns ``(device_buffer, host_buffers, host_pinned)``: the device buffer
    (``None`` without device tensors), one host buffer per distinct host
    tensor size in order of first appearance, and whether they are pinned.

    Args:
        kv_cache_config: the plan.
        device: where the device backing goes.
        pin_host: pin host backings (``None``: when ``device`` is this
            process's accelerator and pinning works).
        host_device: where host backings go; ``"meta"`` only to check shapes.
        include_host: allocate the host backings (``False``: none).
        zeroed: zero the backings (``False`` leaves the bytes as the allocator
            hands them out: only for a caller that reads nothing it did not
            write first; zeroing is most of what a large CPU allocation costs).
        device_backing: given the device backing's size in bytes, the
            :data:`BACKING_DTYPE` buffer to use (``None``: a fresh one on
            ``device``); for a caller that reuses one buffer from call to call.

    Raises:
        PlacementError: device tensors disagree on ``size`` (contract.md#placement-backing).
        RuntimeError: ``pin_host=True`` but this process cannot pin memory.

    """
    target = torch.device(device)
    make = torch.zeros if zeroed else torch.empty
    size = _single_size(kv_cache_config.device_tensors, "device")
    device_buffer: torch.Tensor | None = None
    if size is not None and device_backing is not None:
        device_buffer = device_backing(size)
    elif size is not None:
        # int8 as vLLM's worker allocates it: the views of specs without a dtype
        # (Mamba states, HiSparse's raw pages) are these bytes, as a kernel sees them.
        device_buffer = make(size, dtype=BACKING_DTYPE, device=target)
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
                    buffer = make(host_size, dtype=BACKING_DTYPE, pin_memory=True)
                except RuntimeError:
                    if pin_host:
                        raise
                    # Auto mode: an unpinned pool is slower, not wrong.
                    pin = False
            if buffer is None:
                buffer = make(host_size, dtype=BACKING_DTYPE, device=host)
            host_buffers.append(buffer)
        pinned = pin
    return device_buffer, tuple(host_buffers), pinned


class StridedGeometry(Protocol):
    """What the view plumbing reads of a tensor's geometry.

    kvref's :class:`TensorGeometry` is one; a caller with geometry of its own
    (the conformance kit's worker model) views buffers through the same
    plumbing with that.
    """

    @property
    def index(self) -> int:
        """Position of the tensor in ``kv_cache_config.kv_cache_tensors``."""

    @property
    def tensor(self) -> KVCacheTensor:
        """The tensor record."""

    @property
    def shape(self) -> tuple[int, ...]:
        """Extents ``(L, N, H, S, C)``; ``C`` in bytes."""

    @property
    def strides(self) -> tuple[int, ...]:
        """Byte strides ``(L, B, H, S, C)``."""

    @property
    def offset(self) -> int:
        """Byte of layer 0, block 0 in the backing."""

    @property
    def is_empty(self) -> bool:
        """Whether the tensor addresses no byte."""


_G = TypeVar("_G", bound=StridedGeometry)
_B = TypeVar("_B", bound="KVCacheBackings[Any]")


def strided_view(buffer: torch.Tensor, geometry: StridedGeometry) -> torch.Tensor:
    """The raw ``int8`` view ``(L, N, H, S, C)`` of ``geometry`` over ``buffer``.

    Unchecked: the caller checks the view against its backing first (with
    exact integers, as :func:`view_problems` does), so that ``as_strided``
    never addresses memory the buffer does not own.
    """
    if geometry.is_empty:
        # Nothing is addressed; keep torch from range-checking a meaningless offset.
        return buffer.as_strided(geometry.shape, (0, 0, 0, 0, 1), 0)
    return buffer.as_strided(geometry.shape, geometry.strides, geometry.offset)


@attrs.define(kw_only=True, eq=False)
class KVCacheBackings(Generic[_G]):
    """A worker's backings and the views over them, for geometry of any make.

    The plumbing that :class:`KVCacheAllocation` (over kvref's geometry) and
    the conformance kit's worker (over its own) share: :meth:`bind` views
    every tensor and layer; :meth:`close` (or leaving a ``with`` block)
    drops this object's references to the memory (views the caller still
    holds keep it alive).

    Attributes:
        device: where ``device_buffer`` lives.
        layout: the layout of the device tensors' views.
        device_buffer: the :data:`BACKING_DTYPE` (``int8``) backing of ``size``
            bytes (``None`` without device tensors).
        host_buffers: host backings, one per distinct host tensor size.
        host_pinned: whether the host backings are pinned.
        views: layer name to its view (what ``views_of`` gave :meth:`bind`).
        geometries: the geometry of every config tensor, in config order.
        tensor_views: the raw 5-D ``int8`` view ``(L, N, H, S, C)`` of every config tensor.
        backing_of: for every config tensor, the index of its host buffer, or
            :data:`DEVICE_BACKING`.
        closed: whether :meth:`close` ran.

    """

    device: torch.device
    layout: KVCacheLayout
    device_buffer: torch.Tensor | None
    host_buffers: tuple[torch.Tensor, ...]
    host_pinned: bool
    views: dict[str, torch.Tensor]
    geometries: tuple[_G, ...]
    tensor_views: tuple[torch.Tensor, ...]
    backing_of: tuple[int, ...]
    closed: bool = False

    @classmethod
    def bind(
        cls: type[_B],
        *,
        device: torch.device,
        layout: KVCacheLayout,
        geometries: Sequence[_G],
        backings: tuple[torch.Tensor | None, tuple[torch.Tensor, ...], bool],
        views_of: Callable[[_G, torch.Tensor, torch.Tensor], Mapping[str, torch.Tensor]],
        **fields: Any,
    ) -> _B:
        """View ``geometries`` over ``backings`` (what :func:`allocate_backings` returns).

        Each tensor gets its raw view (:func:`strided_view`) over its backing:
        a host tensor the host buffer of its size, any other the device
        buffer.  ``views_of(geometry, raw_view, backing)`` gives its layers'
        views.  The geometries must be checked against their backings first.
        ``fields``: a subclass's own fields.

        Raises:
            PlacementError: a device tensor without a device backing.
        """
        device_buffer, host_buffers, host_pinned = backings
        host_index = {int(buffer.numel()): i for i, buffer in enumerate(host_buffers)}
        backing_of: list[int] = []
        tensor_views: list[torch.Tensor] = []
        views: dict[str, torch.Tensor] = {}
        for geometry in geometries:
            tensor = geometry.tensor
            where = host_index[tensor.size] if tensor.host_resident else DEVICE_BACKING
            buffer = _buffer(where, device_buffer, host_buffers)
            backing_of.append(where)
            raw = strided_view(buffer, geometry)
            tensor_views.append(raw)
            views.update(views_of(geometry, raw, buffer))
        return cls(
            device=device,
            layout=layout,
            device_buffer=device_buffer,
            host_buffers=host_buffers,
            host_pinned=host_pinned,
            views=views,
            geometries=tuple(geometries),
            tensor_views=tuple(tensor_views),
            backing_of=tuple(backing_of),
            **fields,
        )

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
        self.tensor_views = ()
        self.closed = True

    def __enter__(self: _B) -> _B:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


@attrs.define(kw_only=True, eq=False)
class KVCacheAllocation(KVCacheBackings[TensorGeometry]):
    """The tensors of one worker's KV cache: backings and per-layer views.

    :class:`KVCacheBackings` over kvref's geometry, with zeroed backings
    (:func:`allocate_kv_cache`).  Its ``views`` map each layer to its view,
    shape ``(N, H, S, C / sizeof(dtype))`` in the spec's dtype (the backing's
    ``int8`` bytes for specs without one, such as Mamba); a spec without
    layer views (HiSparse resident and hot) maps to the whole backing.

    Attributes:
        kernel_block_sizes: the kernel block size of each group the views were
            split with (``None``: not asked for).
        kernel_geometries: with ``kernel_block_sizes``, every tensor's kernel
            view geometry (``None`` where it has no per-layer view).
        kernel_views: with ``kernel_block_sizes``, layer name to its kernel view,
            shape ``(N * r, H, S_k, C / sizeof(dtype))`` (a re-strided packed cache:
            ``(N - 1) * s + r`` kernel blocks, :mod:`kvref.kernel_blocks`): what the worker binds
            to the layer and its attention kernels read (vLLM's views with
            ``kernel_block_sizes``, as ``map_kv_caches_to_kernel_blocks`` binds
            them); layers without layer views map to the whole backing, as in
            :attr:`views`.

    """

    kernel_block_sizes: tuple[int, ...] | None = None
    kernel_geometries: tuple[TensorGeometry | None, ...] = ()
    kernel_views: dict[str, torch.Tensor] = attrs.Factory(dict)

    def close(self) -> None:
        """Drop every reference this object holds to device and host memory."""
        super().close()
        self.kernel_views = {}


def allocate_kv_cache(
    kv_cache_config: KVCacheConfig,
    device: str | torch.device,
    *,
    layout: KVCacheLayout | str | None = None,
    pin_host: bool | None = None,
    host_device: str | torch.device = "cpu",
    kernel_block_sizes: Sequence[int] | None = None,
    config: PlanningConfig | None = None,
) -> KVCacheAllocation:
    """Allocate a config's backings on ``device`` and build every layer's view.

    See contract.md#views-and-strides.

    The device backing is one zeroed ``int8`` buffer of the (single) device
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
        config: the planning config whose ``attention_backends`` the worker binds the
            kernel views for (a layer's own backend may need smaller kernel blocks
            than its group's: :func:`kvref.kernel_blocks.kernel_tensor_geometries`);
            ``None``: vLLM's base backend everywhere.

    Raises:
        PlacementError: device tensors of different sizes, a layer in two tensors, a
            layer without a group, a view outside its backing, or a view (kernel
            view included) whose offset or strides are not multiples of ``sizeof(dtype)``.
        LayoutError: a padded page the layout cannot express, a split block
            that is not one dense page, or a layer whose backend needs kernel
            blocks its cache cannot be viewed as (:class:`~kvref.errors.KernelBlockError`).

    """
    target = torch.device(device)
    chosen = resolve_layout(kv_cache_config, layout)
    geometries = _checked_geometries(kv_cache_config, chosen)
    kernel = _checked_kernel_geometries(kv_cache_config, kernel_block_sizes, chosen, config)
    allocation = KVCacheAllocation.bind(
        device=target,
        layout=chosen,
        geometries=geometries,
        backings=allocate_backings(
            kv_cache_config, target, pin_host=pin_host, host_device=host_device
        ),
        views_of=_layer_views,
        kernel_block_sizes=None if kernel_block_sizes is None else tuple(kernel_block_sizes),
        kernel_geometries=kernel,
    )
    views = allocation.views
    for geometry, kernel_geometry in zip(geometries, kernel, strict=False):
        if kernel_geometry is None:
            # No kernel view: the worker binds what it allocated (HiSparse's raw backing).
            allocation.kernel_views.update(
                (n, views[n]) for n in geometry.tensor.layers if n in views
            )
            continue
        backing = allocation.backing(kernel_geometry.index)
        raw = strided_view(backing, kernel_geometry)
        allocation.kernel_views.update(_views_of(kernel_geometry, raw))
    return allocation


def _buffer(
    where: int, device_buffer: torch.Tensor | None, host_buffers: Sequence[torch.Tensor]
) -> torch.Tensor:
    """The buffer ``where`` names: :data:`DEVICE_BACKING`, or an index into ``host_buffers``."""
    if where != DEVICE_BACKING:
        return host_buffers[where]
    if device_buffer is None:
        # allocate_backings makes the device buffer whenever a device tensor exists.
        raise PlacementError("a device tensor without a device backing")
    return device_buffer


def _checked_geometries(config: KVCacheConfig, layout: KVCacheLayout) -> tuple[TensorGeometry, ...]:
    """Every tensor's geometry, each view inside its tensor and each layer in one tensor."""
    _single_size(config.device_tensors, "device")
    geometries = tensor_geometries(config, layout)
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
    return geometries


def _checked_kernel_geometries(
    config: KVCacheConfig,
    kernel_block_sizes: Sequence[int] | None,
    layout: KVCacheLayout,
    planning: PlanningConfig | None,
) -> tuple[TensorGeometry | None, ...]:
    """The kernel views' geometries (none without kernel block sizes), each inside its tensor."""
    if kernel_block_sizes is None:
        return ()
    kernel = tuple(kernel_geometries(config, kernel_block_sizes, layout, planning))
    for geometry in kernel:
        problems = [] if geometry is None else view_problems(geometry, geometry.tensor.size)
        if problems:
            raise PlacementError(f"kernel view: {problems[0].message}")
    return kernel


def _views_of(geometry: TensorGeometry, raw: torch.Tensor) -> dict[str, torch.Tensor]:
    """Each layer of ``geometry``'s tensor: its slice of ``raw``, in its spec's view dtype."""
    dtype = geometry.spec.view_dtype if geometry.spec is not None else None
    return {
        name: raw[index] if dtype is None else raw[index].view(dtype)
        for index, name in enumerate(geometry.tensor.layers)
    }


def _layer_views(
    geometry: TensorGeometry, raw: torch.Tensor, buffer: torch.Tensor
) -> dict[str, torch.Tensor]:
    """The views of ``geometry``'s layers, given its raw view over ``buffer``."""
    if geometry.spec is not None and not getattr(geometry.spec, "has_layer_views", True):
        # HiSparse resident and hot layers address the backing themselves.
        return dict.fromkeys(geometry.tensor.layers, buffer)
    return _views_of(geometry, raw)
