"""KV-DEV-TAGS: a distinct tag written to every (layer, block) page reads back intact.

Block IDs are handed to groups the way a block pool does (no ID to two
groups at once; block 0, the null block, is never written); every tag is
written through one strided view per tensor, then all are read back, so a
page that another page overwrote shows, with the page that wrote it
(contract.md#memory-safety).  Which bytes a page occupies comes from the
kit's worker model (:mod:`conformance.check.worker_model`); the tags and
their element width from the kit's tag engine (:mod:`conformance.extensions.tags`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import attrs
import numpy as np
import numpy.typing as npt
import torch

from conformance.check.violations import Violation
from conformance.check.worker import WorkerAllocation as KVCacheAllocation
from conformance.check.worker import allocate_kv_cache
from conformance.check.worker_model import WorkerError, WorkerTensor, first_group_of
from conformance.extensions.device.memory import (
    KV_DEV_TAGS,
    DeviceCheckResult,
    check_budget,
    device_result,
    ordered_copy,
    release,
)
from conformance.extensions.tags import WIDTH_DTYPES, layer_tags, widest_width
from kvref.errors import KVRefError
from kvref.layout import KVCacheLayout
from kvref.records import KVCacheConfig

__all__ = ["TagReadback", "check_device_tags", "verify_tags"]

#: Elements compared per kernel in the tag readback; bounds the boolean temporary.
_READ_CHUNK_ELEMENTS = 1 << 25


def _tag_width(geometries: list[WorkerTensor]) -> int:
    # One element width per backing, so that every writer's elements share one grid.
    return widest_width(
        v for g in geometries if not g.is_empty for v in (g.offset, g.shape[4], *g.strides[:4])
    )


def _block_owners(config: KVCacheConfig, host: bool) -> dict[int, int]:
    # The block pool hands each block ID to one group at a time: give block b to the
    # ((b - 1) mod G)-th group holding tensors of this kind; block 0 is the null block.
    owner_of_layer = first_group_of(config.kv_cache_groups)
    order: dict[int, int] = {}
    for tensor in config.kv_cache_tensors:
        if tensor.host_resident == host and tensor.layers:
            owner = owner_of_layer.get(tensor.layers[0])
            if owner is not None:
                order.setdefault(owner, len(order))
    return order


@attrs.frozen(kw_only=True)
class _Writer:
    geometry: WorkerTensor
    first_layer: int  # global index of the tensor's first layer
    start: int  # first block ID written
    step: int  # block IDs written: start, start + step, ...
    width: int
    tags: npt.NDArray[Any]  # (L, blocks written) in the width's numpy dtype
    source: torch.Tensor  # the same tags on the backing's device, shape (L, nb, 1, 1, 1)
    dest: torch.Tensor  # the written blocks, (L, nb, H, S, C / width)
    backing: int


@attrs.frozen(kw_only=True)
class TagReadback:
    """The outcome of :func:`verify_tags`.

    Attributes:
        violations: corrupted pages (the first few) and a count of all of them.
        pages: (layer, block) pages written and read back.
        bytes_written: footprint bytes written.
        bytes_read: footprint bytes read back.

    """

    violations: tuple[Violation, ...]
    pages: int
    bytes_written: int
    bytes_read: int


def _prepare_writers(
    allocation: KVCacheAllocation, config: KVCacheConfig, seed: int
) -> list[_Writer]:
    owners = {False: _block_owners(config, False), True: _block_owners(config, True)}
    owner_of_layer = first_group_of(config.kv_cache_groups)
    by_backing: dict[int, list[WorkerTensor]] = {}
    for geometry in allocation.geometries:
        by_backing.setdefault(allocation.backing_of[geometry.index], []).append(geometry)
    widths = {key: _tag_width(geoms) for key, geoms in by_backing.items()}
    id_space = max(config.num_blocks, config.host_num_blocks or 0) + 1
    writers: list[_Writer] = []
    first_layer = 0
    for geometry in allocation.geometries:
        num_layers = geometry.shape[0]
        layer_base = first_layer
        first_layer += len(geometry.tensor.layers)
        if geometry.is_empty or geometry.spec is None:
            continue
        host = geometry.tensor.host_resident
        order = owners[host]
        start, step = 1 + order[owner_of_layer[geometry.tensor.layers[0]]], len(order)
        num_blocks = config.num_blocks_of(geometry.tensor)
        blocks = np.arange(start, num_blocks, step, dtype=np.uint64)
        if blocks.size == 0:
            continue
        backing = allocation.backing_of[geometry.index]
        width = widths[backing]
        torch_dtype, np_dtype = WIDTH_DTYPES[width]
        tags = layer_tags(layer_base, num_layers, blocks, id_space, seed).astype(np_dtype)
        raw = allocation.tensor_views[geometry.index]
        dest = raw[:, start::step].view(torch_dtype)
        source = torch.from_numpy(tags).to(raw.device).view(num_layers, blocks.size, 1, 1, 1)
        writers.append(
            _Writer(
                geometry=geometry,
                first_layer=layer_base,
                start=start,
                step=step,
                width=width,
                tags=tags,
                source=source,
                dest=dest,
                backing=backing,
            )
        )
    return writers


def _write(writer: _Writer) -> int:
    dest, source = writer.dest, writer.source
    # A zero stride makes every index of that axis the same bytes; torch refuses to write
    # such a tensor, and writing its last index alone leaves what sequential writes would.
    for axis in range(4):
        if dest.stride(axis) == 0 and dest.shape[axis] > 1:
            last = dest.shape[axis] - 1
            dest = dest.narrow(axis, last, 1)
            if source.shape[axis] > 1:
                source = source.narrow(axis, last, 1)
    ordered_copy(dest, source.expand(dest.shape))
    return dest.numel() * writer.width


def _chunks(writer: _Writer) -> Iterator[tuple[slice, slice]]:
    num_layers, num_blocks = writer.dest.shape[:2]
    page = max(1, writer.dest[0, 0].numel()) if num_layers and num_blocks else 1
    per_layer = num_blocks * page
    if num_layers * per_layer <= _READ_CHUNK_ELEMENTS:
        yield slice(0, num_layers), slice(0, num_blocks)
        return
    if per_layer <= _READ_CHUNK_ELEMENTS:
        layers = max(1, _READ_CHUNK_ELEMENTS // per_layer)
        for first in range(0, num_layers, layers):
            yield slice(first, first + layers), slice(0, num_blocks)
        return
    blocks = max(1, _READ_CHUNK_ELEMENTS // page)
    for layer in range(num_layers):
        for first in range(0, num_blocks, blocks):
            yield slice(layer, layer + 1), slice(first, first + blocks)


def _intact(writer: _Writer) -> bool:
    # torch.equal reads both operands once and, on the CPU, allocates nothing: the fast,
    # exact answer for a healthy tensor.  Chunks bound what it allocates on accelerators.
    for layers, blocks in _chunks(writer):
        dest = writer.dest[layers, blocks]
        if not torch.equal(dest, writer.source[layers, blocks].expand(dest.shape)):
            return False
    return True


def _read(writer: _Writer) -> torch.Tensor:
    # (L, nb) booleans: the page differs somewhere from its tag.
    parts = []
    for layers, blocks in _chunks(writer):
        dest = writer.dest[layers, blocks]
        source = writer.source[layers, blocks]
        parts.append((layers, blocks, (dest != source).any(dim=(2, 3, 4))))
    if len(parts) == 1:
        return parts[0][2]
    mismatch = torch.zeros(writer.dest.shape[:2], dtype=torch.bool, device=writer.dest.device)
    for layers, blocks, part in parts:
        mismatch[layers, blocks] = part
    return mismatch


def _unsigned_hex(value: int, width: int) -> str:
    return f"0x{value & ((1 << (8 * width)) - 1):0{2 * width}x}"


def _who_wrote(writers: list[_Writer], backing: int, found: int) -> tuple[_Writer, int, int] | None:
    for other in writers:
        if other.backing != backing:
            continue
        hits = np.argwhere(other.tags == other.tags.dtype.type(found))
        if hits.size:
            layer, column = (int(v) for v in hits[0])
            return other, layer, other.start + column * other.step
    return None


def _corruption(
    writer: _Writer, layer: int, column: int, writers: list[_Writer], worker: int | None
) -> Violation:
    geometry = writer.geometry
    block = writer.start + column * writer.step
    page = writer.dest[layer, column]
    expected = int(writer.tags[layer, column])
    differs = (page != writer.source[layer, column]).nonzero()
    head, state, element = (int(v) for v in differs[0].tolist())
    found = int(page[head, state, element].item())
    address = (
        geometry.block_address(layer, block)
        + head * geometry.strides[2]
        + state * geometry.strides[3]
        + element * writer.width
    )
    culprit = _who_wrote(writers, writer.backing, found)
    if culprit is None:
        origin = "which is no page's tag (a partial or misaligned overwrite)"
    else:
        other, other_layer, other_block = culprit
        other_name = other.geometry.tensor.layers[other_layer]
        origin = (
            f"the tag of layer {other_name!r} block {other_block} "
            f"(kv_cache_tensors[{other.geometry.index}])"
        )
    name = geometry.tensor.layers[layer]
    where = "host pool" if geometry.tensor.host_resident else "device backing"
    return Violation(
        invariant=KV_DEV_TAGS,
        worker=worker,
        layer=name,
        block=block,
        byte_range=(int(address), int(address) + writer.width),
        message=(
            f"the tag written to layer {name!r} block {block} did not survive the other "
            f"writes: at byte {address} of the {where} it reads "
            f"{_unsigned_hex(found, writer.width)} instead of "
            f"{_unsigned_hex(expected, writer.width)}, {origin}"
        ),
    )


def verify_tags(
    allocation: KVCacheAllocation,
    config: KVCacheConfig,
    *,
    seed: int = 0,
    max_report: int = 5,
    worker: int | None = None,
) -> TagReadback:
    """Write a distinct tag to every (layer, block) page of ``allocation``, then read all back.

    Block IDs ``1 .. N-1`` are dealt round-robin to the groups owning device
    tensors (and host IDs to host groups), so no block ID is used by two
    groups, as in vLLM's block pool; block 0, the null block, is not
    written.  A tag is a 64-bit hash of (layer, block) written over every
    footprint byte (all heads, states and content bytes) in the widest
    element every tensor of the backing is aligned to.  Writes and reads go
    through one strided view per tensor, never a loop over pages.  Where a
    backing only allows 1-byte elements (an odd offset, stride or content
    size), tags have 256 values and an overwrite by a page whose tag shares
    the byte goes unseen; the exact footprint checks do not have that limit.

    Args:
        allocation: a live allocation of ``config`` (not on ``meta``).
        config: the plan that was allocated.
        seed: varies the tags between runs.
        max_report: the most corrupted pages to describe.
        worker: worker index to put on violations.

    """
    writers = _prepare_writers(allocation, config, seed)
    written = sum(_write(w) for w in writers)
    corrupted: list[tuple[_Writer, torch.Tensor]] = []
    total = 0
    for writer in writers:
        if _intact(writer):
            continue
        mismatch = _read(writer)
        count = int(mismatch.sum().item())
        if count:
            total += count
            corrupted.append((writer, mismatch))
    violations: list[Violation] = []
    for writer, mismatch in corrupted:
        for layer, column in mismatch.nonzero()[: max_report - len(violations)].tolist():
            violations.append(_corruption(writer, layer, column, writers, worker))
        if len(violations) >= max_report:
            break
    if total > len(violations):
        violations.append(
            Violation(
                invariant=KV_DEV_TAGS,
                worker=worker,
                message=f"{total} (layer, block) pages in all read back corrupted",
            )
        )
    footprint = sum(w.dest.numel() * w.width for w in writers)
    pages = sum(w.dest.shape[0] * w.dest.shape[1] for w in writers)
    return TagReadback(
        violations=tuple(violations), pages=pages, bytes_written=written, bytes_read=footprint
    )


def check_device_tags(
    config: KVCacheConfig,
    device: str | torch.device,
    *,
    layout: KVCacheLayout | str | None = None,
    cap: int | None = None,
    host_cap: int | None = None,
    seed: int = 0,
    max_report: int = 5,
    worker: int | None = None,
) -> DeviceCheckResult:
    """KV-DEV-TAGS: a tag written to every (layer, block) page reads back intact.

    Allocates the config on ``device``, runs :func:`verify_tags` and frees
    everything, except that on the CPU the device backing comes from one
    buffer reused from check to check, kept until
    :func:`conformance.check.worker.drop_scratch` (the kit's run drops it
    after each scenario).  Not measured on ``meta`` (no data), above the cap, or when
    the views cannot be built (KV-DEV-VIEWS reports why).

    Args:
        config: the plan.
        device: the device to write on.
        layout: layout of the device tensors (default: the config's, else LBNHC).
        cap: the most bytes to allocate on the device (default :func:`default_cap`).
        host_cap: the most bytes to allocate on the host.
        seed: varies the tags between runs.
        max_report: the most corrupted pages to describe.
        worker: worker index to put on violations.

    """
    target = torch.device(device)
    if target.type == "meta":
        return device_result(
            KV_DEV_TAGS, [], ["meta tensors hold no data: tags not written"], False
        )
    budget = check_budget(config, target, cap, host_cap)
    if not (budget.device_ok and budget.host_ok):
        return device_result(KV_DEV_TAGS, [], budget.notes, measured=False)
    try:
        # Every byte read back is written first, so zeroing would only cost time,
        # and every view is bounded by the planned size, so a reused buffer serves.
        allocation = allocate_kv_cache(config, target, layout=layout, zeroed=False, scratch=True)
    except (KVRefError, WorkerError) as error:
        note = f"not checked: the config cannot be allocated ({error}); see KV-DEV-VIEWS"
        return device_result(KV_DEV_TAGS, [], [note], measured=False)
    except torch.OutOfMemoryError as error:
        return device_result(KV_DEV_TAGS, [], [f"the device ran out of memory: {error}"], False)
    try:
        readback = verify_tags(allocation, config, seed=seed, max_report=max_report, worker=worker)
    finally:
        allocation.close()
        del allocation
        release(target)
    notes = [f"{readback.pages} pages, {readback.bytes_written} B written and read back"]
    return device_result(KV_DEV_TAGS, list(readback.violations), notes, measured=True)
