"""The kit's model of a worker turning a plan into tensors (contract.md#views-and-strides).

A worker allocates one zeroed byte buffer of the device tensors' single
``size``, one host buffer per distinct host-resident size
(contract.md#host-residency), and views every layer of a tensor through a
5-D strided view ``(L, N, H, S, C)`` with the layer and block strides of the
record and the rest from the layout.  The device checks
(the device extension, ``conformance/extensions/device/``) allocate plans through this module, whose
strides come from :mod:`conformance.check.geometry`, so a plan is judged by
the contract's geometry rather than by kvref's own allocation code.

Every view is checked with exact integers before :func:`torch.as_strided`
sees it, so a hostile plan raises :class:`WorkerError` instead of addressing
memory it does not own.

This module is plumbing under the oracle of :mod:`conformance.check.worker_model`:
it turns the kit's own geometry into buffers and ``as_strided`` views and
decides nothing about where bytes belong.  ``kvref.allocation`` does the same
for kvref's geometry; the kit keeps its own copy because its allocation must
hold only views the kit's geometry built, and because it adds what only the
checks need (unzeroed and reused scratch backings, :class:`WorkerError`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import TracebackType

import attrs
import torch

from conformance.check.worker_model import (
    WorkerError,
    WorkerTensor,
    resolve_layout,
    view_problems,
    worker_tensors,
)
from kvref.layout import KVCacheLayout
from kvref.records import KVCacheConfig, KVCacheTensor

__all__ = [
    "BYTES",
    "DEVICE_BACKING",
    "WorkerAllocation",
    "allocate_backings",
    "allocate_kv_cache",
    "drop_scratch",
]

#: Index in :attr:`WorkerAllocation.backing_of` meaning "the device buffer".
DEVICE_BACKING = -1

#: The element type of every backing: vLLM's worker allocates ``int8`` bytes, so
#: a layer whose spec has no dtype (Mamba states, raw pages) is viewed as ``int8``.
BYTES = torch.int8


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
            return make(size, dtype=BYTES, pin_memory=True), True
        except RuntimeError:
            pass  # an unpinned pool is slower, not wrong
    return make(size, dtype=BYTES, device=host), False


#: The reused CPU device backing of ``scratch`` allocations (at most one buffer).
_SCRATCH: list[torch.Tensor] = []


def _scratch_backing(size: int) -> torch.Tensor:
    # A fresh CPU buffer of this size costs a page fault per 4 KiB page on first
    # touch, which is most of what writing it costs; a reused one is warm.
    if not _SCRATCH or _SCRATCH[0].numel() < size:
        _SCRATCH.clear()  # free the smaller buffer before taking the larger one
        _SCRATCH.append(torch.empty(size, dtype=BYTES))
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
        device_buffer = make(size, dtype=BYTES, device=target)
    if not include_host:
        return device_buffer, (), False
    host = torch.device(host_device)
    sizes = list(dict.fromkeys(t.size for t in config.kv_cache_tensors if t.host_resident))
    want = _pinning_possible(target) if pin_host is None else pin_host
    pin = bool(sizes) and host.type == "cpu" and want
    buffers: list[torch.Tensor] = []
    for host_size in sizes:
        if pin and pin_host:
            buffers.append(make(host_size, dtype=BYTES, pin_memory=True))
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
        device_buffer: the ``int8`` device backing (``None`` without device tensors);
            zeroed unless allocated with ``zeroed=False``.
        host_buffers: host backings, one per distinct host size.
        host_pinned: whether the host backings are pinned.
        views: layer name to its view ``(N, H, S, C / sizeof(dtype))`` in the layer's dtype
            (``int8`` bytes without one); a layer without views maps to its whole backing.
        geometries: the geometry of every tensor, in config order.
        tensor_views: the raw ``int8`` view ``(L, N, H, S, C)`` of every tensor.
        backing_of: per tensor, its host buffer's index or :data:`DEVICE_BACKING`.
        closed: whether :meth:`close` ran.

    """

    device: torch.device
    layout: KVCacheLayout
    device_buffer: torch.Tensor | None
    host_buffers: tuple[torch.Tensor, ...]
    host_pinned: bool
    views: dict[str, torch.Tensor]
    geometries: tuple[WorkerTensor, ...]
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


def _validate(geometries: Sequence[WorkerTensor]) -> None:
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


def _raw_view(buffer: torch.Tensor, geometry: WorkerTensor) -> torch.Tensor:
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
    geometries = worker_tensors(config, chosen)
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
