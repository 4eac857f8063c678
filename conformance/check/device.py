"""On-device allocation checks: the "device" row of the invariant catalog.

Each check allocates a config with :func:`conformance.check.worker.allocate_kv_cache`
(the kit's own model of a worker, with the contract's strides; or just its
backings) on a real torch device, looks at what the device did,
frees everything, and returns a :class:`DeviceCheckResult`:

- ``KV-DEV-ALLOC``: the device backing allocates, and the device's memory
  counter grows by the planned bytes within the allocator's rounding;
- ``KV-DEV-VIEWS``: every layer view is constructible within its storage;
- ``KV-DEV-TAGS``: a distinct tag written to every (layer, block) page reads
  back intact after all writes, with block IDs handed to groups the way a
  block pool does;
- ``KV-DEV-HOST``: host-resident tensors live on the CPU (pinned next to a
  CUDA device), device tensors on the device, and the device counter does not
  include host bytes.

The kit runs untrusted builders, so no check allocates past a cap (default:
the smaller of 1 GiB and half the free memory of the device).  A config above
the cap is not allocated: the result says so, the views are checked on
``meta`` instead, and the caller may re-plan at :func:`checkable_num_blocks`.
A check that could not measure what it promises (no memory counter on
``cpu`` and ``meta``, no data on ``meta``) says ``measured=False`` rather
than passing.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import attrs
import numpy as np
import numpy.typing as npt
import torch

from conformance.check.bounds import tensor_problems
from conformance.check.violations import Violation
from conformance.check.worker import (
    TensorGeometry,
    WorkerError,
    allocate_backings,
    allocate_kv_cache,
    planned_device_bytes,
    planned_host_bytes,
    resolve_layout,
    tensor_geometries,
    view_problems,
)
from conformance.check.worker import WorkerAllocation as KVCacheAllocation
from kvref.errors import KVRefError
from kvref.layout import KVCacheLayout
from kvref.records import KVCacheConfig

__all__ = [
    "DEFAULT_CAP_BYTES",
    "DEFAULT_COUNTER_TOLERANCE",
    "DEVICE_CHECKS",
    "KV_DEV_ALLOC",
    "KV_DEV_HOST",
    "KV_DEV_TAGS",
    "KV_DEV_VIEWS",
    "DeviceCheckResult",
    "TagReadback",
    "available_host_memory",
    "check_device",
    "check_device_alloc",
    "check_device_host",
    "check_device_tags",
    "check_device_views",
    "checkable_num_blocks",
    "default_cap",
    "device_memory_counter",
    "free_device_memory",
    "release",
    "verify_tags",
]

KV_DEV_ALLOC = "KV-DEV-ALLOC"
KV_DEV_VIEWS = "KV-DEV-VIEWS"
KV_DEV_TAGS = "KV-DEV-TAGS"
KV_DEV_HOST = "KV-DEV-HOST"

_MiB = 1 << 20
#: Never allocate more than this for one check, whatever the device has (contract.md#device-checks).
DEFAULT_CAP_BYTES = 1 << 30
#: Slack on the memory counter: CUDA's caching allocator counts blocks rounded to 512 B and
#: may hand out a cached block up to 1 MiB larger than asked; 2 MiB covers both.
DEFAULT_COUNTER_TOLERANCE = 2 * _MiB
#: Elements compared per kernel in the tag readback; bounds the boolean temporary.
_READ_CHUNK_ELEMENTS = 1 << 25

Counter = Callable[[], int]


@attrs.frozen(kw_only=True)
class DeviceCheckResult:
    """What one device check found and what it did.

    Attributes:
        invariant: the invariant id, e.g. ``"KV-DEV-TAGS"``.
        violations: broken promises; empty when the invariant held as far as it was checked.
        notes: what was done instead of the full check, and why (cap, no counter, meta...).
        measured: ``False`` when part of the check could not be carried out on the
            requested device; report it as "not measured", never as a pass.

    """

    invariant: str
    violations: tuple[Violation, ...] = ()
    notes: tuple[str, ...] = ()
    measured: bool = True

    @property
    def ok(self) -> bool:
        """No violation was found (check :attr:`measured` before calling it a pass)."""
        return not self.violations


# -- device facts ----------------------------------------------------------------------


def available_host_memory() -> int | None:
    """Bytes of RAM available to new allocations, or ``None`` when unknown.

    Reads ``MemAvailable`` from ``/proc/meminfo`` (Linux), else ``sysconf``.
    """
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, OSError, ValueError):
        return None


def _accelerator_module(device: torch.device) -> Any:
    return getattr(torch, device.type, None)


def _is_current_accelerator(device: torch.device) -> bool:
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is None or not accelerator.is_available():
        return False
    current = accelerator.current_accelerator()
    return current is not None and current.type == device.type


def free_device_memory(device: str | torch.device) -> int | None:
    """Free bytes on ``device`` as its runtime reports them, or ``None`` when unknown."""
    target = torch.device(device)
    if target.type == "cpu":
        return available_host_memory()
    if target.type == "meta":
        return None
    try:
        if target.type == "cuda":
            return int(torch.cuda.mem_get_info(target)[0]) if torch.cuda.is_available() else None
        if _is_current_accelerator(target):
            return int(torch.accelerator.get_memory_info(target.index)[0])
        module = _accelerator_module(target)
        mem_get_info = getattr(module, "mem_get_info", None)
        if callable(mem_get_info):
            return int(mem_get_info(target)[0])
    except (RuntimeError, AttributeError, TypeError):
        pass
    return None


def default_cap(device: str | torch.device) -> int:
    """Return the most one check allocates on ``device``: min(1 GiB, half its free memory).

    ``meta`` allocates nothing, so its cap is unbounded; an unknown free
    memory leaves the 1 GiB ceiling.
    """
    target = torch.device(device)
    if target.type == "meta":
        return sys.maxsize
    free = free_device_memory(target)
    return DEFAULT_CAP_BYTES if free is None else min(DEFAULT_CAP_BYTES, free // 2)


def device_memory_counter(device: str | torch.device) -> Counter | None:
    """Return a function giving the bytes the torch allocator holds for tensors on ``device``.

    ``None`` when the device has no such counter (``cpu``, ``meta``, or a
    runtime that exposes none): the counter check is then not measurable.
    """
    target = torch.device(device)
    counter: Counter | None = None
    if target.type == "cuda":
        if torch.cuda.is_available():
            counter = lambda: int(torch.cuda.memory_allocated(target))  # noqa: E731
    elif target.type == "mps":
        counter = lambda: int(torch.mps.current_allocated_memory())  # noqa: E731
    elif target.type not in ("cpu", "meta"):
        if _is_current_accelerator(target):
            index = target.index
            counter = lambda: int(torch.accelerator.memory_allocated(index))  # noqa: E731
        else:
            memory_allocated = getattr(_accelerator_module(target), "memory_allocated", None)
            if callable(memory_allocated):
                counter = lambda: int(memory_allocated(target))  # noqa: E731
    return counter


def release(device: str | torch.device) -> None:
    """Return freed memory to the device after a check (cached blocks included)."""
    target = torch.device(device)
    # The checks' objects hold no reference cycles, so dropping them freed the memory;
    # what is left is the caching allocator's reserve.
    if target.type == "cuda" and torch.cuda.is_available():
        torch.cuda.empty_cache()
    elif target.type not in ("cpu", "meta") and _is_current_accelerator(target):
        torch.accelerator.empty_cache()


def checkable_num_blocks(bytes_per_block: int, num_blocks: int, cap: int) -> int:
    """Return the largest block count ``<= num_blocks`` whose backing fits in ``cap`` bytes.

    Sizes are linear in the block count (contract.md#placement-backing), so a caller re-plans an
    over-cap config at this many blocks.  0 means not even one block fits:
    check that config on ``meta`` only.
    """
    if bytes_per_block <= 0:
        return num_blocks
    return max(0, min(num_blocks, cap // bytes_per_block))


# -- shared plumbing -------------------------------------------------------------------


@attrs.frozen
class _Budget:
    device_ok: bool
    host_ok: bool
    notes: tuple[str, ...]


def _budget(
    config: KVCacheConfig,
    device: torch.device,
    cap: int | None,
    host_cap: int | None,
    *,
    with_host: bool = True,
) -> _Budget:
    device_bytes = planned_device_bytes(config)
    host_bytes = planned_host_bytes(config) if with_host else 0
    device_cap = default_cap(device) if cap is None else cap
    cpu_cap = default_cap("cpu") if host_cap is None else host_cap
    notes: list[str] = []
    # On the CPU both backings come out of the same RAM.
    device_need = device_bytes + host_bytes if device.type == "cpu" else device_bytes
    device_ok = device.type == "meta" or device_need <= device_cap
    host_ok = host_bytes <= cpu_cap
    if not device_ok:
        bpb = device_bytes // config.num_blocks if config.num_blocks else device_bytes
        fit = checkable_num_blocks(bpb, config.num_blocks, device_cap)
        notes.append(
            f"the device backing ({device_need} B) exceeds the cap of {device_cap} B on "
            f"{device}: it was not allocated; re-plan at num_blocks={fit} to check it for real"
        )
    if not host_ok:
        notes.append(
            f"the host backings ({host_bytes} B) exceed the host cap of {cpu_cap} B: "
            "they were not allocated"
        )
    return _Budget(device_ok, host_ok, tuple(notes))


def _result(
    invariant: str,
    violations: list[Violation],
    notes: list[str] | tuple[str, ...],
    measured: bool,
) -> DeviceCheckResult:
    return DeviceCheckResult(
        invariant=invariant,
        violations=tuple(violations),
        notes=tuple(notes),
        measured=measured,
    )


def _same_device(actual: torch.device, wanted: torch.device) -> bool:
    return actual.type == wanted.type and (wanted.index is None or actual.index == wanted.index)


# -- KV-DEV-ALLOC ----------------------------------------------------------------------


def check_device_alloc(
    config: KVCacheConfig,
    device: str | torch.device,
    *,
    cap: int | None = None,
    counter: Counter | None = None,
    tolerance: int = DEFAULT_COUNTER_TOLERANCE,
    worker: int | None = None,
) -> DeviceCheckResult:
    """KV-DEV-ALLOC: the device backing allocates and the memory counter grows by its size.

    Allocates only the device backing (no views, no host pool), reading
    ``counter`` once before and once after.  The growth must lie in
    ``[planned, planned + tolerance]``.

    Args:
        config: the plan.
        device: the device to allocate on.
        cap: the most bytes to allocate (default :func:`default_cap`).
        counter: bytes currently allocated on the device; default
            :func:`device_memory_counter`.  Without one the result is ``measured=False``.
        tolerance: allocator rounding allowed above the planned bytes.
        worker: worker index to put on violations.

    """
    target = torch.device(device)
    planned = planned_device_bytes(config)
    budget = _budget(config, target, cap, None, with_host=False)
    notes = list(budget.notes)
    if not budget.device_ok:
        return _result(KV_DEV_ALLOC, [], notes, measured=False)
    read = counter if counter is not None else device_memory_counter(target)
    violations: list[Violation] = []
    measured = read is not None
    if read is None:
        notes.append(f"{target} has no memory counter: the growth by {planned} B was not measured")
    before = read() if read is not None else 0
    try:
        buffer, _, _ = allocate_backings(config, target, include_host=False)
    except (KVRefError, WorkerError) as error:
        violations.append(
            Violation(invariant=KV_DEV_ALLOC, worker=worker, message=f"no backing: {error}")
        )
        return _result(KV_DEV_ALLOC, violations, notes, measured=False)
    except torch.OutOfMemoryError as error:
        notes.append(f"the device ran out of memory allocating {planned} B: {error}")
        return _result(KV_DEV_ALLOC, violations, notes, measured=False)
    try:
        after = read() if read is not None else 0
        if buffer is not None:
            if not _same_device(buffer.device, target):
                violations.append(
                    Violation(
                        invariant=KV_DEV_ALLOC,
                        worker=worker,
                        message=f"the backing was allocated on {buffer.device}, not on {target}",
                    )
                )
            if buffer.numel() != planned:
                violations.append(
                    Violation(
                        invariant=KV_DEV_ALLOC,
                        worker=worker,
                        message=(
                            f"the backing holds {buffer.numel()} B, not the planned {planned} B"
                        ),
                    )
                )
        if read is not None:
            grown = after - before
            if not planned <= grown <= planned + tolerance:
                violations.append(
                    Violation(
                        invariant=KV_DEV_ALLOC,
                        worker=worker,
                        message=(
                            f"the memory counter of {target} grew by {grown} B allocating a "
                            f"backing of {planned} B (allowed: {planned} to "
                            f"{planned + tolerance} B)"
                        ),
                    )
                )
    finally:
        del buffer
        release(target)
    return _result(KV_DEV_ALLOC, violations, notes, measured)


# -- KV-DEV-VIEWS ----------------------------------------------------------------------


def _storage_violations(allocation: KVCacheAllocation, worker: int | None) -> Iterator[Violation]:
    # Ask torch itself where every view ends: this is the on-device half of the check.
    for name, view in allocation.views.items():
        if view.numel() == 0:
            continue
        itemsize = view.element_size()
        start = int(view.storage_offset()) * itemsize
        reach = sum(int(e - 1) * int(s) for e, s in zip(view.shape, view.stride(), strict=True))
        end = start + (reach + 1) * itemsize
        storage = view.untyped_storage().nbytes()
        if start < 0 or end > storage:
            yield Violation(
                invariant=KV_DEV_VIEWS,
                worker=worker,
                layer=name,
                byte_range=(start, end),
                message=f"the view addresses bytes [{start}, {end}) of a {storage} B storage",
            )


def check_device_views(
    config: KVCacheConfig,
    device: str | torch.device,
    *,
    layout: KVCacheLayout | str | None = None,
    cap: int | None = None,
    host_cap: int | None = None,
    max_report: int = 10,
    worker: int | None = None,
) -> DeviceCheckResult:
    """KV-DEV-VIEWS: every layer view is constructible within its storage.

    First checks every tensor's footprint and typed-view divisibility with
    exact integers (nothing is allocated for a config that fails); then
    builds all views on ``device`` (on ``meta`` above the cap) and checks
    each against its storage as torch reports it.

    Args:
        config: the plan.
        device: the device to build the views on.
        layout: layout of the device tensors (default: the config's, else LBNHC).
        cap: the most bytes to allocate on the device (default :func:`default_cap`).
        host_cap: the most bytes to allocate on the host.
        max_report: the most violations to report.
        worker: worker index to put on violations.

    """
    target = torch.device(device)
    violations: list[Violation] = []
    try:
        geometries = tensor_geometries(config, layout)
    except (KVRefError, WorkerError) as error:
        violations.append(Violation(invariant=KV_DEV_VIEWS, worker=worker, message=str(error)))
        return _result(KV_DEV_VIEWS, violations, [], measured=True)
    for geometry in geometries:
        for problem in view_problems(geometry, geometry.tensor.size):
            violations.append(
                Violation(
                    invariant=KV_DEV_VIEWS,
                    worker=worker,
                    layer=problem.layer,
                    byte_range=problem.byte_range,
                    message=problem.message,
                )
            )
    if violations:
        return _result(KV_DEV_VIEWS, violations[:max_report], [], measured=True)
    budget = _budget(config, target, cap, host_cap)
    notes = list(budget.notes)
    where = target if budget.device_ok else torch.device("meta")
    host_where = "cpu" if budget.host_ok else "meta"
    if not budget.device_ok or not budget.host_ok:
        notes.append("views were built on meta where the cap forbade a real allocation")
    try:
        allocation = allocate_kv_cache(
            config, where, layout=layout, pin_host=False, host_device=host_where
        )
    except (KVRefError, WorkerError) as error:
        # Size mismatches and repeated layers are other invariants' faults; say why we stopped.
        notes.append(f"the views could not be built: {error}")
        return _result(KV_DEV_VIEWS, [], notes, measured=False)
    except torch.OutOfMemoryError as error:
        notes.append(f"the device ran out of memory: {error}")
        return _result(KV_DEV_VIEWS, [], notes, measured=False)
    with allocation:
        for violation in _storage_violations(allocation, worker):
            violations.append(violation)
            if len(violations) >= max_report:
                break
    del allocation
    release(target)
    return _result(KV_DEV_VIEWS, violations, notes, measured=budget.device_ok and budget.host_ok)


# -- KV-DEV-TAGS -----------------------------------------------------------------------

_WIDTH_DTYPES: dict[int, tuple[torch.dtype, type[np.generic]]] = {
    8: (torch.int64, np.int64),
    4: (torch.int32, np.int32),
    2: (torch.int16, np.int16),
    1: (torch.uint8, np.uint8),
}


def _splitmix64(values: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    # A bijective 64-bit mixer: distinct (layer, block) ids get distinct, unrelated tags.
    z = values + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    mixed: npt.NDArray[np.uint64] = z ^ (z >> np.uint64(31))
    return mixed


def _tag_width(geometries: list[TensorGeometry]) -> int:
    # One element width per backing: every writer's elements then start on the same grid,
    # so a corrupted element always holds exactly one other page's whole tag.
    for width in (8, 4, 2):
        if all(
            g.offset % width == 0
            and g.shape[4] % width == 0
            and all(s % width == 0 for s in g.strides[:4])
            for g in geometries
            if not g.is_empty
        ):
            return width
    return 1


def _owner_of_layer(config: KVCacheConfig) -> dict[str, int]:
    # A layer listed by two groups (a broken plan) is viewed with its first group's spec.
    owner: dict[str, int] = {}
    for index, group in enumerate(config.kv_cache_groups):
        for name in group.layer_names:
            owner.setdefault(name, index)
    return owner


def _block_owners(config: KVCacheConfig, host: bool) -> dict[int, int]:
    # The block pool hands each block ID to one group at a time: give block b to the
    # ((b - 1) mod G)-th group holding tensors of this kind; block 0 is the null block.
    owner_of_layer = _owner_of_layer(config)
    order: dict[int, int] = {}
    for tensor in config.kv_cache_tensors:
        if tensor.host_resident == host and tensor.layers:
            owner = owner_of_layer.get(tensor.layers[0])
            if owner is not None:
                order.setdefault(owner, len(order))
    return order


@attrs.frozen(kw_only=True)
class _Writer:
    geometry: TensorGeometry
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
    owner_of_layer = _owner_of_layer(config)
    by_backing: dict[int, list[TensorGeometry]] = {}
    for geometry in allocation.geometries:
        by_backing.setdefault(allocation.backing_of[geometry.index], []).append(geometry)
    widths = {key: _tag_width(geoms) for key, geoms in by_backing.items()}
    id_space = max(config.num_blocks, config.host_num_blocks or 0) + 1
    seed_mix = np.uint64(seed & 0xFFFFFFFFFFFFFFFF)
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
        torch_dtype, np_dtype = _WIDTH_DTYPES[width]
        layers = np.arange(layer_base, layer_base + num_layers, dtype=np.uint64)
        ids = layers[:, None] * np.uint64(id_space) + blocks[None, :]
        tags = _splitmix64(ids ^ seed_mix).view(np.int64).astype(np_dtype)
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
    dest.copy_(source.expand(dest.shape))
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
    everything.  Not measured on ``meta`` (no data), above the cap, or when
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
        return _result(KV_DEV_TAGS, [], ["meta tensors hold no data: tags not written"], False)
    budget = _budget(config, target, cap, host_cap)
    if not (budget.device_ok and budget.host_ok):
        return _result(KV_DEV_TAGS, [], budget.notes, measured=False)
    try:
        allocation = allocate_kv_cache(config, target, layout=layout)
    except (KVRefError, WorkerError) as error:
        note = f"not checked: the config cannot be allocated ({error}); see KV-DEV-VIEWS"
        return _result(KV_DEV_TAGS, [], [note], measured=False)
    except torch.OutOfMemoryError as error:
        return _result(KV_DEV_TAGS, [], [f"the device ran out of memory: {error}"], False)
    try:
        readback = verify_tags(allocation, config, seed=seed, max_report=max_report, worker=worker)
    finally:
        allocation.close()
        del allocation
        release(target)
    notes = [f"{readback.pages} pages, {readback.bytes_written} B written and read back"]
    return _result(KV_DEV_TAGS, list(readback.violations), notes, measured=True)


# -- KV-DEV-HOST -----------------------------------------------------------------------


def _residency_violations(config: KVCacheConfig, worker: int | None) -> Iterator[Violation]:
    host_group_layers = {
        name for g in config.kv_cache_groups if g.host_resident for name in g.layer_names
    }
    device_group_layers = {
        name for g in config.kv_cache_groups if not g.host_resident for name in g.layer_names
    }
    for index, tensor in enumerate(config.kv_cache_tensors):
        for name in tensor.layers:
            if not tensor.host_resident and name in host_group_layers:
                yield Violation(
                    invariant=KV_DEV_HOST,
                    worker=worker,
                    layer=name,
                    message=(
                        f"layer {name!r} of a host-resident group is in device tensor "
                        f"kv_cache_tensors[{index}], so its bytes are allocated and counted "
                        "on the device"
                    ),
                )
            elif tensor.host_resident and name in device_group_layers - host_group_layers:
                yield Violation(
                    invariant=KV_DEV_HOST,
                    worker=worker,
                    layer=name,
                    message=(
                        f"layer {name!r} of a device group is in host-resident tensor "
                        f"kv_cache_tensors[{index}], so it would live on the CPU"
                    ),
                )


def check_device_host(
    config: KVCacheConfig,
    device: str | torch.device,
    *,
    cap: int | None = None,
    host_cap: int | None = None,
    counter: Counter | None = None,
    tolerance: int = DEFAULT_COUNTER_TOLERANCE,
    worker: int | None = None,
) -> DeviceCheckResult:
    """KV-DEV-HOST: host tensors live on the CPU and stay out of the device's counter.

    Checks that host-resident groups' layers sit only in host tensors (and
    device groups' only in device tensors), allocates the backings, checks
    that host buffers are on the CPU and pinned when ``device`` is CUDA, and
    that the device counter grew by no more than the device backing (plus
    ``tolerance``) although the host pool was allocated too.

    Args:
        config: the plan.
        device: the device.
        cap: the most bytes to allocate on the device (default :func:`default_cap`).
        host_cap: the most bytes to allocate on the host.
        counter: bytes currently allocated on the device (default
            :func:`device_memory_counter`); read once before and once after.
        tolerance: allocator rounding allowed above the device backing.
        worker: worker index to put on violations.

    """
    target = torch.device(device)
    violations = list(_residency_violations(config, worker))
    budget = _budget(config, target, cap, host_cap)
    notes = list(budget.notes)
    measured = budget.device_ok and budget.host_ok
    read = counter if counter is not None else device_memory_counter(target)
    if read is None:
        notes.append(f"{target} has no memory counter: host bytes on the device not measured")
        measured = False
    where = target if budget.device_ok else torch.device("meta")
    host_where = "cpu" if budget.host_ok else "meta"
    before = read() if read is not None and measured else 0
    try:
        device_buffer, host_buffers, _ = allocate_backings(config, where, host_device=host_where)
    except (KVRefError, WorkerError) as error:
        notes.append(f"the backings were not allocated: {error}")
        return _result(KV_DEV_HOST, violations, notes, measured=False)
    except torch.OutOfMemoryError as error:
        notes.append(f"the device ran out of memory: {error}")
        return _result(KV_DEV_HOST, violations, notes, measured=False)
    try:
        after = read() if read is not None and measured else 0
        wants_pinned = target.type == "cuda"
        for index, buffer in enumerate(host_buffers):
            if buffer.device.type == "meta":
                continue
            if buffer.device.type != "cpu":
                violations.append(
                    Violation(
                        invariant=KV_DEV_HOST,
                        worker=worker,
                        message=f"host backing {index} was allocated on {buffer.device}",
                    )
                )
            elif wants_pinned and not buffer.is_pinned():
                violations.append(
                    Violation(
                        invariant=KV_DEV_HOST,
                        worker=worker,
                        message=(
                            f"host backing {index} ({buffer.numel()} B) is not pinned next to "
                            f"{target}, so transfers to and from it cannot be asynchronous"
                        ),
                    )
                )
        if read is not None and measured and host_buffers:
            device_bytes = planned_device_bytes(config)
            grown = after - before
            if grown > device_bytes + tolerance:
                host_bytes = sum(b.numel() for b in host_buffers)
                violations.append(
                    Violation(
                        invariant=KV_DEV_HOST,
                        worker=worker,
                        message=(
                            f"the memory counter of {target} grew by {grown} B for a device "
                            f"backing of {device_bytes} B: the host pool ({host_bytes} B) is "
                            "counted on the device"
                        ),
                    )
                )
    finally:
        del device_buffer, host_buffers
        release(target)
    return _result(KV_DEV_HOST, violations, notes, measured)


# -- all of them -----------------------------------------------------------------------

#: Invariant id to (title, the contract.md anchor of the rule it measures, check function).
DEVICE_CHECKS: Mapping[str, tuple[str, str, Callable[..., DeviceCheckResult]]] = {
    KV_DEV_ALLOC: (
        "the planned backing allocates on the device and its memory counter grows by it",
        "placement-backing",
        check_device_alloc,
    ),
    KV_DEV_VIEWS: (
        "every layer view is constructible within its storage",
        "views-and-strides",
        check_device_views,
    ),
    KV_DEV_TAGS: (
        "a tag written to every (layer, block) page reads back intact after all writes",
        "memory-safety",
        check_device_tags,
    ),
    KV_DEV_HOST: (
        "host tensors are on the CPU (pinned next to CUDA) and not counted on the device",
        "host-residency",
        check_device_host,
    ),
}


def _refused(
    config: KVCacheConfig, select: tuple[str, ...] | None, worker: int | None
) -> tuple[DeviceCheckResult, ...] | None:
    """Results for a config whose byte counts no allocator takes (``None``: it can be tried).

    A size of 2**63 or more, a negative one or a non-int would reach torch as
    an overflow or a crash of the run; the config is refused instead.
    """
    problems = tensor_problems(config)
    if not problems:
        return None
    message = f"not allocated: {'; '.join(problems[:3])}"
    return tuple(
        _result(
            invariant, [Violation(invariant=invariant, worker=worker, message=message)], [], True
        )
        for invariant in DEVICE_CHECKS
        if select is None or invariant in select
    )


def check_device(
    config: KVCacheConfig,
    device: str | torch.device,
    *,
    layout: KVCacheLayout | str | None = None,
    cap: int | None = None,
    host_cap: int | None = None,
    counter: Counter | None = None,
    select: tuple[str, ...] | None = None,
    worker: int | None = None,
) -> tuple[DeviceCheckResult, ...]:
    """Run the device checks (all, or the ids in ``select``) on one config, in catalog order.

    ``layout`` defaults to the config's layout, else LBNHC; the ALLOC and
    HOST checks do not depend on it.
    """
    refused = _refused(config, select, worker)
    if refused is not None:
        return refused
    chosen = resolve_layout(config, layout)
    results: list[DeviceCheckResult] = []
    for invariant in DEVICE_CHECKS:
        if select is not None and invariant not in select:
            continue
        if invariant == KV_DEV_ALLOC:
            results.append(
                check_device_alloc(config, device, cap=cap, counter=counter, worker=worker)
            )
        elif invariant == KV_DEV_VIEWS:
            results.append(
                check_device_views(
                    config, device, layout=chosen, cap=cap, host_cap=host_cap, worker=worker
                )
            )
        elif invariant == KV_DEV_TAGS:
            results.append(
                check_device_tags(
                    config, device, layout=chosen, cap=cap, host_cap=host_cap, worker=worker
                )
            )
        else:
            results.append(
                check_device_host(
                    config, device, cap=cap, host_cap=host_cap, counter=counter, worker=worker
                )
            )
    return tuple(results)
