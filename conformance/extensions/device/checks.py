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

This module runs them (:func:`check_device`) and is where their public names
are imported from; each is written in its own module:
:mod:`~conformance.extensions.device.alloc` (ALLOC and HOST),
:mod:`~conformance.extensions.device.views`, :mod:`~conformance.extensions.device.tags`,
and :mod:`~conformance.extensions.device.memory` (the device's memory, the caps,
the result type).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from conformance.check.bounds import tensor_problems
from conformance.check.violations import Violation
from conformance.check.worker_model import resolve_layout
from conformance.extensions.device.alloc import check_device_alloc, check_device_host
from conformance.extensions.device.memory import (
    DEFAULT_CAP_BYTES,
    DEFAULT_COUNTER_TOLERANCE,
    KV_DEV_ALLOC,
    KV_DEV_HOST,
    KV_DEV_TAGS,
    KV_DEV_VIEWS,
    Counter,
    DeviceCheckResult,
    available_host_memory,
    checkable_num_blocks,
    default_cap,
    device_memory_counter,
    device_result,
    free_device_memory,
    release,
)
from conformance.extensions.device.tags import TagReadback, check_device_tags, verify_tags
from conformance.extensions.device.views import check_device_views
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
        device_result(
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
