"""What a device offers one device check, and what a check reports.

The device's free memory and memory counter as its runtime reports them, the
most one check may allocate (:func:`default_cap`: the smaller of 1 GiB and
half the free memory; the kit runs untrusted builders), the budget of one
config against those caps (:func:`check_budget`), and the result every
check returns (:class:`DeviceCheckResult`) (contract.md#device-checks).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

import attrs
import torch

from conformance.check.violations import Violation
from conformance.check.worker_model import planned_device_bytes, planned_host_bytes
from conformance.harness.worker_side import proc_bytes
from kvref.records import KVCacheConfig

__all__ = [
    "DEFAULT_CAP_BYTES",
    "DEFAULT_COUNTER_TOLERANCE",
    "KV_DEV_ALLOC",
    "KV_DEV_HOST",
    "KV_DEV_TAGS",
    "KV_DEV_VIEWS",
    "Budget",
    "Counter",
    "DeviceCheckResult",
    "available_host_memory",
    "check_budget",
    "checkable_num_blocks",
    "default_cap",
    "device_memory_counter",
    "device_result",
    "free_device_memory",
    "ordered_copy",
    "release",
    "same_device",
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

#: Bytes the torch allocator currently holds on a device (see :func:`device_memory_counter`).
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
    available = proc_bytes("/proc/meminfo", "MemAvailable")
    if available is not None:
        return available
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


def ordered_copy(dest: torch.Tensor, source: torch.Tensor) -> None:
    """``dest.copy_(source)``, with the same bytes left on every run.

    A builder's views may overlap themselves (two pages sharing bytes): the
    bytes shared then hold what the last write left.  torch splits a CPU copy
    over its intra-op threads, which makes "last" a race, and the value a
    check reports read back (and the message of its violation) differ from
    run to run and between a run and its shards.  One thread writes in the
    copy's own order, which never varies.
    """
    threads = torch.get_num_threads()
    if dest.device.type != "cpu" or threads == 1:
        dest.copy_(source)
        return
    torch.set_num_threads(1)
    try:
        dest.copy_(source)
    finally:
        torch.set_num_threads(threads)


def checkable_num_blocks(bytes_per_block: int, num_blocks: int, cap: int) -> int:
    """Return the largest block count ``<= num_blocks`` whose backing fits in ``cap`` bytes.

    Sizes are linear in the block count (contract.md#placement-backing), so a caller re-plans an
    over-cap config at this many blocks.  0 means not even one block fits:
    check that config on ``meta`` only.
    """
    if bytes_per_block <= 0:
        return num_blocks
    return max(0, min(num_blocks, cap // bytes_per_block))


# -- one check's budget and result -------------------------------------------------------


@attrs.frozen
class Budget:
    """Whether a config's backings fit under the caps, and notes on what does not.

    Attributes:
        device_ok: the device backing may be allocated (always on ``meta``).
        host_ok: the host backings may be allocated.
        notes: what was not allocated and why, for the check's result.
    """

    device_ok: bool
    host_ok: bool
    notes: tuple[str, ...]


def check_budget(
    config: KVCacheConfig,
    device: torch.device,
    cap: int | None,
    host_cap: int | None,
    *,
    with_host: bool = True,
) -> Budget:
    """Whether ``config``'s backings fit under ``cap`` on ``device`` and ``host_cap`` on the CPU.

    ``None`` caps default to :func:`default_cap`; ``with_host=False`` leaves the
    host backings out (a check that allocates the device backing only).
    """
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
    return Budget(device_ok, host_ok, tuple(notes))


def device_result(
    invariant: str,
    violations: list[Violation],
    notes: list[str] | tuple[str, ...],
    measured: bool,
) -> DeviceCheckResult:
    """A :class:`DeviceCheckResult` from lists."""
    return DeviceCheckResult(
        invariant=invariant,
        violations=tuple(violations),
        notes=tuple(notes),
        measured=measured,
    )


def same_device(actual: torch.device, wanted: torch.device) -> bool:
    """Whether ``actual`` is ``wanted`` (any index when ``wanted`` names none)."""
    return actual.type == wanted.type and (wanted.index is None or actual.index == wanted.index)
