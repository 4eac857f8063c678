"""The kit's model of a worker turning a plan into tensors (contract.md#views-and-strides).

A worker allocates one zeroed byte buffer of the device tensors' single
``size``, one host buffer per distinct host-resident size
(contract.md#host-residency), and views every layer of a tensor through a
5-D strided view ``(L, N, H, S, C)`` with the layer and block strides of the
record and the rest from the layout.  The device checks
(the device extension, ``conformance/extensions/device/``) allocate plans through this module, whose
strides come from :mod:`conformance.check.geometry`, so a plan is judged by
the contract's geometry rather than by kvref's own geometry.

Every view is checked with exact integers before :func:`torch.as_strided`
sees it, so a hostile plan raises :class:`WorkerError` instead of addressing
memory it does not own.

This module is plumbing under the oracle of :mod:`conformance.check.worker_model`:
it turns the kit's own geometry into buffers and ``as_strided`` views and
decides nothing about where bytes belong.  The buffers and views are made by
``kvref.allocation``'s plumbing (:func:`kvref.allocation.allocate_backings`,
:meth:`kvref.allocation.KVCacheBackings.bind`), which computes no geometry:
every view it makes is one the kit's geometry built and checked.  What only
the checks need stays here: the kit's own checks and errors
(:class:`WorkerError`), and reused scratch backings.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import torch

from conformance.check.worker_model import (
    WorkerError,
    WorkerTensor,
    resolve_layout,
    view_problems,
    worker_tensors,
)
from kvref.allocation import BACKING_DTYPE, DEVICE_BACKING, KVCacheBackings
from kvref.allocation import allocate_backings as _allocate_backings
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

#: The element type of every backing (the plumbing's): vLLM's worker allocates ``int8``
#: bytes, so a layer whose spec has no dtype (Mamba states, raw pages) is viewed as ``int8``.
BYTES = BACKING_DTYPE


def _single_size(tensors: Sequence[KVCacheTensor]) -> int | None:
    sizes = sorted({t.size for t in tensors})
    if len(sizes) > 1:
        raise WorkerError(
            f"device tensors must share one backing size, got sizes {sizes} bytes "
            "(contract.md#placement-backing)"
        )
    return sizes[0] if sizes else None


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
    # The kit's own message first: its findings cite the contract.
    size = _single_size(config.device_tensors)
    reuse = size is not None and scratch and not zeroed and target.type == "cpu"
    return _allocate_backings(
        config,
        target,
        pin_host=pin_host,
        host_device=host_device,
        include_host=include_host,
        zeroed=zeroed,
        device_backing=_scratch_backing if reuse else None,
    )


@attrs.define(kw_only=True, eq=False)
class WorkerAllocation(KVCacheBackings[WorkerTensor]):
    """A worker's KV cache: backings and per-layer views over the kit's geometry.

    A :class:`kvref.allocation.KVCacheBackings` (its attributes: the backings,
    ``geometries``, ``tensor_views``, ``backing_of``, ``closed``) whose
    ``views`` map each layer to its view ``(N, H, S, C / sizeof(dtype))`` in
    the layer's dtype (``int8`` bytes without one); a layer without views
    maps to its whole backing.  The backings are zeroed unless allocated with
    ``zeroed=False``.  Use as a context manager, or call :meth:`close`, to
    drop this object's references to the memory.
    """

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


def _layer_views(
    geometry: WorkerTensor, raw: torch.Tensor, buffer: torch.Tensor
) -> dict[str, torch.Tensor]:
    """The views of ``geometry``'s layers, given its raw view over ``buffer``."""
    page = geometry.page
    if page is None:
        return {}
    if not page.layer_views:
        # Raw-page layers (HiSparse resident and hot) address the backing themselves.
        return dict.fromkeys(geometry.tensor.layers, buffer)
    return {
        name: raw[layer] if page.dtype is None else raw[layer].view(page.dtype)
        for layer, name in enumerate(geometry.tensor.layers)
    }


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
    _single_size(config.device_tensors)
    geometries = worker_tensors(config, chosen)
    _validate(geometries)
    return WorkerAllocation.bind(
        device=target,
        layout=chosen,
        geometries=geometries,
        backings=allocate_backings(
            config,
            target,
            pin_host=pin_host,
            host_device=host_device,
            zeroed=zeroed,
            scratch=scratch,
        ),
        views_of=_layer_views,
    )
