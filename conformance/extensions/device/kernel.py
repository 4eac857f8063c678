"""KV-DEV-KERNEL-VIEWS: a worker's kernel views read the bytes a plan gives each block.

vLLM's model runner does not read a plan through the planning views: per
group it takes the kernel block size its attention backends support and,
where that is smaller than the cache block, views each tensor with ``r``
kernel blocks per cache block; when it binds the views, each layer's own
backend may still need smaller kernel blocks than a packed group's, and the
runner then re-strides a compressed cache (kernel block ``b * s + j``) or
refuses (kvref's :mod:`kvref.kernel_blocks` models that reading; the kit
uses it only as *the worker's* reading).  What the kit expects it computes
from the plan itself: kernel block ``j`` of block ``b`` of layer ``l`` is
the ``j``-th of ``r`` equal slices of that page,
``[a + j * page / r, a + (j + 1) * page / r)`` with ``a`` the page's byte
address in the plan (contract.md#kernel-views).

On the device, a distinct tag is written to every (layer, kernel block)
through the kernel view and read back through the planning view, then the
other way round, one tensor at a time (aliasing between tensors is
KV-DEV-TAGS' concern); the tags and their element width come from the
kit's tag engine (:mod:`conformance.extensions.tags`).  A plan the worker cannot
read (no kernel block size divides a group's block size, a split block that
is not one dense page, a packed cache a layer's backend cannot bind) is a
violation unless the worker cannot read the reference's plan of the same
input either; where no layer is read in kernel blocks smaller than its cache
block the invariant does not apply.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import torch

from conformance.check.bounds import tensor_problems
from conformance.check.catalog import Unjudged, invariant
from conformance.check.observations import PlacementObservation
from conformance.check.violations import Violation
from conformance.check.worker import WorkerAllocation, allocate_kv_cache
from conformance.check.worker_model import WorkerError, WorkerTensor, resolve_layout
from conformance.extensions.device.memory import check_budget, ordered_copy, release
from conformance.extensions.tags import WIDTH_DTYPES, layer_tags, movable, widest_width
from kvref.builder import ReferenceKVCacheConfigBuilder
from kvref.errors import KVRefError, LayoutError, UnsupportedError
from kvref.kernel_blocks import (
    KernelTensorGeometry,
    kernel_tensor_geometries,
    prepare_kernel_block_sizes,
)
from kvref.layout import KVCacheLayout
from kvref.records import KVCacheConfig
from kvref.specs import (
    EncoderOnlyAttentionSpec,
    UniformTypeKVCacheSpecs,
)

__all__ = ["KV_DEV_KERNEL_VIEWS", "kernel_view_findings"]

KV_DEV_KERNEL_VIEWS = "KV-DEV-KERNEL-VIEWS"

#: Elements compared per call; bounds the expected-tags temporary.
_CHUNK_ELEMENTS = 1 << 24


def _v(message: str) -> Violation:
    return Violation(invariant=KV_DEV_KERNEL_VIEWS, message=message)


def _split_groups(config: KVCacheConfig, sizes: Sequence[int]) -> dict[int, tuple[int, int]]:
    """Group ID -> (block size, kernel block size) of the groups the worker splits."""
    out: dict[int, tuple[int, int]] = {}
    remaining = iter(sizes)
    for gid, group in enumerate(config.kv_cache_groups):
        spec = group.kv_cache_spec
        inner = (
            next(iter(spec.kv_cache_specs.values()))
            if isinstance(spec, UniformTypeKVCacheSpecs)
            else spec
        )
        if isinstance(inner, EncoderOnlyAttentionSpec):
            # The worker's list skips encoder-only groups.
            continue
        size = next(remaining, spec.block_size)
        if size != spec.block_size:
            out[gid] = (spec.block_size, size)
    return out


def _reference_refused(obs: PlacementObservation) -> str | None:
    """Why the worker cannot read the reference's plan of this input either (``None``: it can).

    The reference groups the layers itself: a builder's grouping that pads
    pages or changes block sizes is judged against what the reference does.
    """
    try:
        reference = ReferenceKVCacheConfigBuilder()
        groups = obs.reference_groups()
        plan = reference.get_kv_cache_config_from_groups(obs.config, groups, obs.num_blocks)
        layout = resolve_layout(plan, obs.config.kv_cache_layout)
        sizes = prepare_kernel_block_sizes(obs.config, plan)
        kernel_tensor_geometries(plan, sizes, layout, obs.config)
    except (KVRefError, ValueError) as exc:
        return str(exc)
    return None


def _width(pairs: Sequence[tuple[WorkerTensor, KernelTensorGeometry]]) -> int:
    # One element width for the whole check: the widest every offset, stride,
    # content size and kernel slice of the split tensors is a multiple of.
    values: list[int] = []
    for plan, kernel in pairs:
        r = kernel.split.kernel_blocks_per_block
        values += [plan.offset, plan.shape[4], plan.page_bytes // r]
        values += [int(s) for s in plan.strides[:4]] + [int(s) for s in kernel.strides[:4]]
    return widest_width(values)


def _slice_map(plan: WorkerTensor, r: int, width: int, device: torch.device) -> torch.Tensor:
    """For each element ``(h, s, c)`` of a planning page, the kernel block it belongs to.

    Computed from the plan's own strides: the element's byte offset in its
    page divided by the slice size ``page / r``.
    """
    _, _, heads, states, content = plan.shape
    hs, ss = int(plan.strides[2]), int(plan.strides[3])
    offset = (
        torch.arange(heads, dtype=torch.int64)[:, None, None] * hs
        + torch.arange(states, dtype=torch.int64)[None, :, None] * ss
        + torch.arange(0, content, width, dtype=torch.int64)[None, None, :]
    )
    return (offset // (plan.page_bytes // r)).to(device)


def _tags(
    num_layers: int, kernel_blocks: int, first: int, seed: int, dtype: torch.dtype
) -> torch.Tensor:
    columns = np.arange(kernel_blocks, dtype=np.uint64)
    mixed = layer_tags(first, num_layers, columns, kernel_blocks + 1, seed)
    return torch.from_numpy(mixed.copy()).to(dtype)


def _block_chunks(num_blocks: int, page_elements: int) -> Iterator[slice]:
    step = max(1, _CHUNK_ELEMENTS // max(1, page_elements))
    for first in range(0, num_blocks, step):
        yield slice(first, min(num_blocks, first + step))


def _kernel_raw(
    allocation: WorkerAllocation, kernel: KernelTensorGeometry, num_blocks: int
) -> torch.Tensor:
    """The kernel view as ``(L, N, r, H, S_k, C)``, kernel block ``j`` of block ``b`` at ``b, j``.

    Kernel block ``b * step + j`` sits ``step`` kernel pages after block
    ``b``'s first: ``step`` is ``r`` where blocks are split in place and the
    kernel block stride where a packed cache is re-strided at bind time, whose
    kernel blocks in between hold other layers' pages and are never written.
    """
    buffer = allocation.backing(kernel.index)
    split = kernel.split
    layers, _, heads, states, content = kernel.shape
    stride = kernel.strides
    return buffer.as_strided(
        (layers, num_blocks, split.kernel_blocks_per_block, heads, states, content),
        (stride[0], split.step * stride[1], stride[1], *stride[2:]),
        kernel.tensor.offset,
    )


def _first_mismatch(got: torch.Tensor, want: torch.Tensor) -> tuple[int, ...]:
    where = (got != want).nonzero()[0].tolist()
    return tuple(int(v) for v in where)


def _runs_order(plan: WorkerTensor, slices: torch.Tensor, r: int) -> tuple[int, ...] | None:
    """The page's dims in memory order when the ``r`` slices cut it into equal runs.

    Then kernel block ``k`` of a page is elements ``[k * E, (k + 1) * E)`` of
    the page read in that order, and the tags are compared and written by
    broadcasting one tag per kernel block, without gathering through a
    page-sized index (which cost about 8x a plain comparison).  ``None``: the
    slices interleave, and the general gather decides.
    """
    order = tuple(sorted((0, 1, 2), key=lambda d: -int(plan.strides[2 + d])))
    flat = slices.permute(order).reshape(-1)
    count = int(flat.numel())
    if count == 0 or count % r:
        return None
    even = torch.arange(count, device=flat.device) // (count // r)
    return order if torch.equal(flat, even) else None


def _as_runs(view: torch.Tensor, order: tuple[int, ...] | None, r: int) -> torch.Tensor | None:
    """``view`` (layers, blocks, H, S, C) as (layers, blocks, r, E) without a copy, or ``None``."""
    if order is None:
        return None
    try:
        return view.permute(0, 1, *(2 + d for d in order)).view(view.shape[0], view.shape[1], r, -1)
    except RuntimeError:  # the page has gaps in memory order: no view merges its dims
        return None


def _tensor_findings(
    allocation: WorkerAllocation,
    plan: WorkerTensor,
    kernel: KernelTensorGeometry,
    width: int,
    first_layer: int,
) -> list[Violation]:
    """Both directions for one split tensor: kernel writes, planning reads, and back."""
    dtype = WIDTH_DTYPES[width][0]
    r = kernel.split.kernel_blocks_per_block
    num_layers, num_blocks = plan.shape[0], plan.shape[1]
    pview = allocation.tensor_views[plan.index].view(dtype)
    kview = _kernel_raw(allocation, kernel, num_blocks).view(dtype)
    # torch refuses to write a view whose elements share memory; such a plan
    # is other invariants' fault (KV-DEV-VIEWS, KV-PLACE-NO-LAYER-OVERLAP).
    if not (movable(pview) and movable(kview)):
        return []
    device = pview.device
    slices = _slice_map(plan, r, width, device)
    order = _runs_order(plan, slices, r)
    layer_page = int(slices.numel()) * num_layers
    for direction, salt in (("kernel", 0x6B65726E), ("planning", 0x706C616E)):
        tags = _tags(num_layers, num_blocks * r, first_layer, salt, dtype).to(device)
        per_block = tags.view(num_layers, num_blocks, r)
        if direction == "kernel":
            ordered_copy(kview, per_block[:, :, :, None, None, None].expand(kview.shape))
            for chunk in _block_chunks(num_blocks, layer_page):
                got = pview[:, chunk]
                runs = _as_runs(got, order, r)
                if runs is not None and torch.equal(
                    runs, per_block[:, chunk, :, None].expand_as(runs)
                ):
                    continue
                # The general reading, and where a mismatch is found, where it is.
                want = per_block[:, chunk][:, :, slices]
                if not torch.equal(got, want):
                    layer, block, h, s, c = _first_mismatch(got, want)
                    offset = h * plan.strides[2] + s * plan.strides[3] + c * width
                    j = offset // (plan.page_bytes // r)
                    kb = (block + chunk.start) * kernel.split.step + j
                    address = plan.block_address(layer, block + chunk.start) + offset
                    return [_mismatch(plan, kernel, direction, layer, kb, address)]
        else:
            for chunk in _block_chunks(num_blocks, layer_page):
                runs = _as_runs(pview[:, chunk], order, r)
                if runs is not None:
                    ordered_copy(runs, per_block[:, chunk, :, None].expand_as(runs))
                else:
                    ordered_copy(pview[:, chunk], per_block[:, chunk][:, :, slices])
            for chunk in _block_chunks(num_blocks, layer_page):
                got = kview[:, chunk]
                want = per_block[:, chunk][:, :, :, None, None, None].expand(got.shape)
                if not torch.equal(got, want):
                    layer, block, j, h, s, c = _first_mismatch(got, want)
                    kb = (block + chunk.start) * kernel.split.step + j
                    address = (
                        kernel.kernel_block_address(layer, kb)
                        + h * kernel.strides[2]
                        + s * kernel.strides[3]
                        + c * width
                    )
                    return [_mismatch(plan, kernel, direction, layer, kb, address)]
    return []


def _mismatch(
    plan: WorkerTensor,
    kernel: KernelTensorGeometry,
    direction: str,
    layer: int,
    kernel_block: int,
    address: int,
) -> Violation:
    r = kernel.split.kernel_blocks_per_block
    block, j = kernel.split.manager_block_of(kernel_block)
    slice_bytes = plan.page_bytes // r
    start = plan.block_address(layer, block) + j * slice_bytes
    name = plan.tensor.layers[layer]
    how = (
        "written through the worker's kernel view reads back wrong through the planning view"
        if direction == "kernel"
        else "written through the planning view reads back wrong through the worker's kernel view"
    )
    return Violation(
        invariant=KV_DEV_KERNEL_VIEWS,
        layer=name,
        block=block,
        byte_range=(int(address), int(address) + 1),
        message=(
            f"kv_cache_tensors[{plan.index}] layer {name!r} block {block}: kernel block "
            f"{kernel_block} (slice {j} of {r}, {kernel.split.kernel_block_size} of "
            f"{kernel.split.block_size} tokens) {how} at byte {address}; the plan gives "
            f"that slice bytes [{start}, {start + slice_bytes})"
        ),
    )


def _device_findings(
    config: KVCacheConfig,
    kernels: Sequence[KernelTensorGeometry | None],
    obs: PlacementObservation,
    layout: KVCacheLayout,
) -> list[Violation] | Unjudged:
    target = torch.device(obs.device)
    if target.type == "meta":
        return Unjudged("meta tensors hold no data: tags not written", applicable=False)
    budget = check_budget(config, target, obs.max_alloc_bytes, None)
    if not (budget.device_ok and budget.host_ok):
        return Unjudged("; ".join(budget.notes) or "above the allocation cap")
    try:
        allocation = allocate_kv_cache(config, target, layout=layout, zeroed=False, scratch=True)
    except (KVRefError, WorkerError) as exc:
        return Unjudged(f"the config cannot be allocated ({exc}); see KV-DEV-VIEWS", spoiled=True)
    except torch.OutOfMemoryError as exc:
        return Unjudged(f"the device ran out of memory: {exc}")
    try:
        pairs: list[tuple[WorkerTensor, KernelTensorGeometry, int]] = []
        first = 0
        for plan, kernel in zip(allocation.geometries, kernels, strict=True):
            if (
                kernel is not None
                and kernel.split.kernel_blocks_per_block > 1
                and not plan.is_empty
            ):
                pairs.append((plan, kernel, first))
            first += len(plan.tensor.layers)
        width = _width([(p, k) for p, k, _ in pairs])
        found: list[Violation] = []
        for plan, kernel, layer_base in pairs:
            found += _tensor_findings(allocation, plan, kernel, width, layer_base)
            if len(found) >= 3:
                break
        return found
    finally:
        allocation.close()
        del allocation
        release(target)


def _kernel_sizes(
    obs: PlacementObservation, config: KVCacheConfig
) -> tuple[int, ...] | list[Violation] | Unjudged:
    """The kernel block size of each group, as the worker picks it, or why it cannot."""
    try:
        return tuple(prepare_kernel_block_sizes(obs.config, config))
    except LayoutError as exc:
        refused = _reference_refused(obs)
        if refused is not None:
            return Unjudged(f"the worker cannot read the reference's plan either: {refused}")
        return [_v(f"the worker cannot choose a kernel block size for this plan: {exc}")]
    except KVRefError as exc:
        return Unjudged(f"the worker's kernel block sizes are not defined here: {exc}")


_Reading = tuple[tuple[KernelTensorGeometry | None, ...], KVCacheLayout]


def _worker_reading(
    obs: PlacementObservation, config: KVCacheConfig
) -> _Reading | list[Violation] | Unjudged:
    """The kernel views the worker builds from ``config``, or why there are none."""
    sizes = _kernel_sizes(obs, config)
    if not isinstance(sizes, tuple):
        return sizes
    if not _split_groups(config, sizes) and not obs.config.attention_backends:
        return _NO_SPLIT
    reading = _bound_reading(obs, config, sizes)
    if isinstance(reading, tuple) and not any(
        k is not None and k.split.kernel_blocks_per_block > 1 for k in reading[0]
    ):
        return _NO_SPLIT
    return reading


def _bound_reading(
    obs: PlacementObservation, config: KVCacheConfig, sizes: tuple[int, ...]
) -> _Reading | list[Violation] | Unjudged:
    """The kernel views as the worker binds them, or why it cannot (see the module docstring)."""
    try:
        layout = resolve_layout(config, obs.config.kv_cache_layout)
        # At bind time each layer's own backend is asked again: a packed group,
        # never split group-wide, may still be read in smaller kernel blocks.
        return kernel_tensor_geometries(config, sizes, layout, obs.config), layout
    except UnsupportedError as exc:
        return Unjudged(f"the worker's reading of this plan is not modelled: {exc}")
    except LayoutError as exc:
        refused = _reference_refused(obs)
        if refused is not None:
            return Unjudged(f"the worker cannot read the reference's plan either: {refused}")
        return [_v(f"the worker cannot view this plan through its kernels: {exc}")]
    except (KVRefError, ValueError) as exc:
        return Unjudged(f"the config cannot be laid out for the kernels: {exc}", spoiled=True)


_NO_SPLIT = Unjudged(
    "no kernel split applies: every layer's kernel block is its cache block", applicable=False
)


def kernel_view_findings(obs: PlacementObservation) -> list[Violation] | Unjudged:
    """KV-DEV-KERNEL-VIEWS on one placement (see the module docstring).

    Returns violations, or :class:`Unjudged` (``applicable=False`` where no
    kernel split applies or the device holds no data).
    """
    config = obs.config_at(obs.num_blocks)
    if config is None:
        return Unjudged("the builder returned no config for this example", spoiled=True)
    if not config.kv_cache_tensors:
        return Unjudged("the config has no tensor to allocate")
    problems = tensor_problems(config)
    if problems:
        return Unjudged(
            f"the config's byte counts cannot be allocated: {problems[0]}", spoiled=True
        )
    reading = _worker_reading(obs, config)
    if not isinstance(reading, tuple):
        return reading
    kernels, layout = reading
    return _device_findings(config, kernels, obs, layout)


@invariant(
    KV_DEV_KERNEL_VIEWS,
    "the worker's kernel views read each block's kernel slices where the plan puts them",
    anchor="kernel-views",
    scenario="device",
)
def _kernel_views(obs: PlacementObservation) -> list[Violation] | Unjudged:
    return kernel_view_findings(obs)
