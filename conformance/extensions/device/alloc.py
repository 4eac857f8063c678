"""KV-DEV-ALLOC and KV-DEV-HOST: the backings allocate where they should, and the counter agrees.

Both allocate a config's backings only (no views) with
:func:`conformance.check.worker.allocate_backings` and read the device's memory
counter once before and once after:

- ``KV-DEV-ALLOC``: the device backing allocates on the device, holds the
  planned bytes, and the counter grows by them within the allocator's rounding;
- ``KV-DEV-HOST``: host-resident groups' layers sit only in host tensors,
  host buffers live on the CPU (pinned next to a CUDA device), and the device
  counter does not include host bytes.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

from conformance.check.violations import Violation
from conformance.check.worker import allocate_backings
from conformance.check.worker_model import WorkerError, planned_device_bytes
from conformance.extensions.device.memory import (
    DEFAULT_COUNTER_TOLERANCE,
    KV_DEV_ALLOC,
    KV_DEV_HOST,
    Counter,
    DeviceCheckResult,
    check_budget,
    device_memory_counter,
    device_result,
    release,
    same_device,
)
from kvref.errors import KVRefError
from kvref.records import KVCacheConfig

__all__ = ["check_device_alloc", "check_device_host"]


def _backing_violations(
    buffer: torch.Tensor | None,
    target: torch.device,
    planned: int,
    grown: int | None,
    tolerance: int,
    worker: int | None,
) -> Iterator[Violation]:
    """What is wrong with the device backing and the counter's growth (``None``: no counter)."""
    if buffer is not None:
        if not same_device(buffer.device, target):
            yield Violation(
                invariant=KV_DEV_ALLOC,
                worker=worker,
                message=f"the backing was allocated on {buffer.device}, not on {target}",
            )
        if buffer.numel() != planned:
            yield Violation(
                invariant=KV_DEV_ALLOC,
                worker=worker,
                message=f"the backing holds {buffer.numel()} B, not the planned {planned} B",
            )
    if grown is not None and not planned <= grown <= planned + tolerance:
        yield Violation(
            invariant=KV_DEV_ALLOC,
            worker=worker,
            message=(
                f"the memory counter of {target} grew by {grown} B allocating a "
                f"backing of {planned} B (allowed: {planned} to "
                f"{planned + tolerance} B)"
            ),
        )


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
    budget = check_budget(config, target, cap, None, with_host=False)
    notes = list(budget.notes)
    if not budget.device_ok:
        return device_result(KV_DEV_ALLOC, [], notes, measured=False)
    read = counter if counter is not None else device_memory_counter(target)
    if read is None:
        notes.append(f"{target} has no memory counter: the growth by {planned} B was not measured")
    before = read() if read is not None else 0
    try:
        buffer, _, _ = allocate_backings(config, target, include_host=False, zeroed=False)
    except (KVRefError, WorkerError) as error:
        no_backing = Violation(
            invariant=KV_DEV_ALLOC, worker=worker, message=f"no backing: {error}"
        )
        return device_result(KV_DEV_ALLOC, [no_backing], notes, measured=False)
    except torch.OutOfMemoryError as error:
        notes.append(f"the device ran out of memory allocating {planned} B: {error}")
        return device_result(KV_DEV_ALLOC, [], notes, measured=False)
    try:
        grown = read() - before if read is not None else None
        violations = list(_backing_violations(buffer, target, planned, grown, tolerance, worker))
    finally:
        del buffer
        release(target)
    return device_result(KV_DEV_ALLOC, violations, notes, read is not None)


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


def _host_buffer_violations(
    host_buffers: Sequence[torch.Tensor], target: torch.device, worker: int | None
) -> Iterator[Violation]:
    """Host backings off the CPU, or not pinned next to a CUDA device."""
    wants_pinned = target.type == "cuda"
    for index, buffer in enumerate(host_buffers):
        if buffer.device.type == "meta":
            continue
        if buffer.device.type != "cpu":
            yield Violation(
                invariant=KV_DEV_HOST,
                worker=worker,
                message=f"host backing {index} was allocated on {buffer.device}",
            )
        elif wants_pinned and not buffer.is_pinned():
            yield Violation(
                invariant=KV_DEV_HOST,
                worker=worker,
                message=(
                    f"host backing {index} ({buffer.numel()} B) is not pinned next to "
                    f"{target}, so transfers to and from it cannot be asynchronous"
                ),
            )


def _host_counted_on_device(
    config: KVCacheConfig,
    host_buffers: Sequence[torch.Tensor],
    grown: int,
    tolerance: int,
    target: torch.device,
    worker: int | None,
) -> Iterator[Violation]:
    """The device counter grew by more than the device backing while the host pool was made."""
    device_bytes = planned_device_bytes(config)
    if grown > device_bytes + tolerance:
        host_bytes = sum(b.numel() for b in host_buffers)
        yield Violation(
            invariant=KV_DEV_HOST,
            worker=worker,
            message=(
                f"the memory counter of {target} grew by {grown} B for a device "
                f"backing of {device_bytes} B: the host pool ({host_bytes} B) is "
                "counted on the device"
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
    budget = check_budget(config, target, cap, host_cap)
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
        device_buffer, host_buffers, _ = allocate_backings(
            config, where, host_device=host_where, zeroed=False
        )
    except (KVRefError, WorkerError) as error:
        notes.append(f"the backings were not allocated: {error}")
        return device_result(KV_DEV_HOST, violations, notes, measured=False)
    except torch.OutOfMemoryError as error:
        notes.append(f"the device ran out of memory: {error}")
        return device_result(KV_DEV_HOST, violations, notes, measured=False)
    try:
        after = read() if read is not None and measured else 0
        violations += _host_buffer_violations(host_buffers, target, worker)
        if read is not None and measured and host_buffers:
            grown = after - before
            violations += _host_counted_on_device(
                config, host_buffers, grown, tolerance, target, worker
            )
    finally:
        del device_buffer, host_buffers
        release(target)
    return device_result(KV_DEV_HOST, violations, notes, measured)
