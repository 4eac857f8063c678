"""KV-DEV-VIEWS: every layer view of a config is constructible within its storage.

First every tensor's footprint and typed-view divisibility are checked with
exact integers (:func:`conformance.check.worker.view_problems`); then the
views are built on the device (on ``meta`` above the cap) and each is checked
against its storage as torch reports it (contract.md#views-and-strides).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from conformance.check.violations import Violation
from conformance.check.worker import WorkerAllocation as KVCacheAllocation
from conformance.check.worker import allocate_kv_cache
from conformance.check.worker_model import WorkerError, view_problems, worker_tensors
from conformance.extensions.device.memory import (
    KV_DEV_VIEWS,
    DeviceCheckResult,
    check_budget,
    device_result,
    release,
)
from kvref.errors import KVRefError
from kvref.layout import KVCacheLayout
from kvref.records import KVCacheConfig

__all__ = ["check_device_views"]


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
        geometries = worker_tensors(config, layout)
    except (KVRefError, WorkerError) as error:
        violations.append(Violation(invariant=KV_DEV_VIEWS, worker=worker, message=str(error)))
        return device_result(KV_DEV_VIEWS, violations, [], measured=True)
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
        return device_result(KV_DEV_VIEWS, violations[:max_report], [], measured=True)
    budget = check_budget(config, target, cap, host_cap)
    notes = list(budget.notes)
    where = target if budget.device_ok else torch.device("meta")
    host_where = "cpu" if budget.host_ok else "meta"
    if not budget.device_ok or not budget.host_ok:
        notes.append("views were built on meta where the cap forbade a real allocation")
    try:
        allocation = allocate_kv_cache(
            config, where, layout=layout, pin_host=False, host_device=host_where, zeroed=False
        )
    except (KVRefError, WorkerError) as error:
        # Size mismatches and repeated layers are other invariants' faults; say why we stopped.
        notes.append(f"the views could not be built: {error}")
        return device_result(KV_DEV_VIEWS, [], notes, measured=False)
    except torch.OutOfMemoryError as error:
        notes.append(f"the device ran out of memory: {error}")
        return device_result(KV_DEV_VIEWS, [], notes, measured=False)
    with allocation:
        for violation in _storage_violations(allocation, worker):
            violations.append(violation)
            if len(violations) >= max_report:
                break
    del allocation
    release(target)
    return device_result(
        KV_DEV_VIEWS, violations, notes, measured=budget.device_ok and budget.host_ok
    )
