"""Host-residency invariants: host-resident groups live in their own host pool."""

from __future__ import annotations

from typing import Any

from conformance.check import memory
from conformance.check.bounds import tensor_problems
from conformance.check.catalog import invariant
from conformance.check.catalog import violation as _v
from conformance.check.grouping import returned_groups as _groups
from conformance.check.residency import host_layers as host_layers_of
from conformance.check.violations import Violation
from conformance.run.observations import HostObservation
from kvref.records import KVCacheConfig, KVCacheGroupSpec


def _host_config(obs: HostObservation) -> tuple[list[KVCacheGroupSpec], KVCacheConfig] | None:
    groups = _groups(obs.groups)
    if groups is None or obs.placed is None or not obs.placed.ok:
        return None
    names = [n for g in groups for n in g.layer_names]
    if len(names) != len(set(names)) or set(names) != set(obs.specs):
        return None  # a grouping bug, reported by KV-GROUP-*
    if tensor_problems(obs.placed.value):
        return None  # sizes no allocator takes: KV-PLACE-SIZE-BOUND's finding
    return groups, obs.placed.value


@invariant(
    "KV-HOST-TENSORS",
    "host-resident layers live in host tensors only",
    anchor="host-residency",
    scenario="host",
    requires=("host_resident",),
)
def _host_tensors(obs: HostObservation) -> list[Violation] | None:
    got = _host_config(obs)
    if got is None:
        return None
    groups, config = got
    host_layers = host_layers_of(obs.config, obs.specs)
    out = []
    for i, t in enumerate(config.kv_cache_tensors):
        wrong = [n for n in t.layers if (n in host_layers) != t.host_resident]
        if wrong:
            where = "device" if not t.host_resident else "host"
            out.append(
                _v(
                    "KV-HOST-TENSORS",
                    f"tensor {i} is a {where} tensor but holds {wrong[:3]}; layers kept on the "
                    "host belong in host tensors only, the others on the device",
                    layer=wrong[0],
                )
            )
    grouped_host = {n for g in groups if g.host_resident for n in g.layer_names}
    if grouped_host != host_layers & set(obs.specs):
        out.append(
            _v(
                "KV-HOST-TENSORS",
                f"host-resident groups hold {sorted(grouped_host)[:4]} but the config keeps "
                f"{sorted(host_layers)[:4]} on the host",
            )
        )
    return out[:3]


@invariant(
    "KV-HOST-EXCLUDED",
    "host tensors take no device memory",
    anchor="host-residency",
    scenario="host",
    requires=("host_resident",),
)
def _host_excluded(obs: HostObservation) -> list[Violation] | None:
    got = _host_config(obs)
    if got is None or obs.device_only is None or not obs.device_only.ok:
        return None
    if tensor_problems(obs.device_only.value):
        return None
    _, config = got
    host_layers = host_layers_of(obs.config, obs.specs)
    if any(n in host_layers for t in config.device_tensors for n in t.layers):
        return None  # host layers on the device are KV-HOST-TENSORS's finding
    alone: KVCacheConfig = obs.device_only.value
    with_host = sorted({t.size for t in config.device_tensors})
    without = sorted({t.size for t in alone.device_tensors})
    if with_host != without:
        return [
            _v(
                "KV-HOST-EXCLUDED",
                f"the device backing is {with_host} bytes with host-resident groups and {without} "
                "without them; host pages must not take device memory",
            )
        ]
    return []


@invariant(
    "KV-HOST-SIZED",
    "host tensors are sized by their own block count",
    anchor="host-residency",
    scenario="host",
    requires=("host_resident",),
)
def _host_sized(obs: HostObservation) -> list[Violation] | None:
    got = _host_config(obs)
    if got is None:
        return None
    _groups, config = got
    host = [t for t in config.kv_cache_tensors if t.host_resident]
    if not host:
        return []
    blocks = config.host_num_blocks
    if blocks is None or blocks < 1:
        return [_v("KV-HOST-SIZED", f"host tensors exist but host_num_blocks={blocks}")]
    out = []
    sizes = {t.size for t in host}
    pool = obs.config.host_pool_bytes or 0
    for size in sizes:
        if size % blocks or size > pool:
            out.append(
                _v(
                    "KV-HOST-SIZED",
                    f"a host backing of {size} bytes is not a whole number of {blocks} host blocks "
                    f"within the host pool of {pool} bytes",
                )
            )
    out += [
        _v(
            "KV-HOST-SIZED",
            f"host tensor {o.page.tensor_index}'s page ends past its backing of {o.size} bytes at "
            f"{blocks} host blocks",
            layer=o.page.layer,
            block=o.page.block,
            byte_range=o.byte_range,
        )
        for o in memory.find_host_out_of_bounds(config, memory_host_layout(), limit=3)
    ]
    return out[:3]


def memory_host_layout() -> Any:
    """The host pool's layout (always LBNHC, contract.md#host-residency)."""
    from kvref.placement import HOST_LAYOUT

    return HOST_LAYOUT
