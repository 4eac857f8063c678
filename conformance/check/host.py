"""Host-residency invariants: host-resident groups live in their own host pool."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from conformance.check import memory
from conformance.check.bounds import tensor_problems
from conformance.check.catalog import Check, Unjudged, flag, invariant, invariant_on
from conformance.check.grouping import returned_groups as _groups
from conformance.check.observations import HostObservation
from conformance.check.placement_safety import distinct, page_flag
from conformance.check.residency import host_layers as host_layers_of
from conformance.check.violations import Violation
from kvref.records import KVCacheConfig, KVCacheGroupSpec

#: The groups of a host example and the config placed for them.
HostConfig = tuple[list[KVCacheGroupSpec], KVCacheConfig]


def _host_config(obs: HostObservation) -> HostConfig | None:
    groups = _groups(obs.groups)
    if groups is None or obs.placed is None or not obs.placed.ok:
        return None
    names = [n for g in groups for n in g.layer_names]
    if len(names) != len(set(names)) or set(names) != set(obs.specs):
        return None  # a grouping bug, reported by KV-GROUP-*
    if tensor_problems(obs.placed.value):
        return None  # sizes no allocator takes: KV-PLACE-SIZE-BOUND's finding
    return groups, obs.placed.value


def host_invariant(
    id: str, title: str, *, gate: Callable[[HostObservation], Unjudged | None] | None = None
) -> Callable[[Callable[[HostObservation, HostConfig], Any]], Check]:
    """Declare a check of a host example's sound grouping and placement (host-resident builders).

    An example whose grouping or placement failed or broke the grouping
    invariants is not judged; ``gate`` is :func:`~conformance.check.catalog.judged_on`'s.
    """
    return invariant_on(
        _host_config,
        id,
        title,
        anchor="host-residency",
        scenario="host",
        requires=("host_resident",),
        gate=gate,
    )


@host_invariant(
    "KV-HOST-TENSORS",
    "host-resident layers live in host tensors only",
)
def _host_tensors(obs: HostObservation, got: HostConfig) -> list[Violation]:
    groups, config = got
    host_layers = host_layers_of(obs.config, obs.specs)
    out = []
    for i, t in enumerate(config.kv_cache_tensors):
        wrong = [n for n in t.layers if (n in host_layers) != t.host_resident]
        if wrong:
            where = "device" if not t.host_resident else "host"
            out.append(
                flag(
                    f"tensor {i} is a {where} tensor but holds {wrong[:3]}; layers kept on the "
                    "host belong in host tensors only, the others on the device",
                    layer=wrong[0],
                )
            )
    grouped_host = {n for g in groups if g.host_resident for n in g.layer_names}
    if grouped_host != host_layers & set(obs.specs):
        out.append(
            flag(
                f"host-resident groups hold {sorted(grouped_host)[:4]} but the config keeps "
                f"{sorted(host_layers)[:4]} on the host",
            )
        )
    return out[:3]


def _hisparse(obs: HostObservation) -> Unjudged | None:
    if obs.config.hisparse is not None:
        # HiSparse's placement sizes its host pool from the source group: no
        # placement without it exists to compare the device backing with.
        return Unjudged(
            "under HiSparse there is no device-only placement to compare with "
            "(the host pool is sized from its source group)",
            applicable=False,
        )
    return None


@host_invariant(
    "KV-HOST-EXCLUDED",
    "host tensors take no device memory",
    gate=_hisparse,
)
def _host_excluded(obs: HostObservation, got: HostConfig) -> list[Violation] | None:
    if obs.device_only is None or not obs.device_only.ok:
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
            flag(
                f"the device backing is {with_host} bytes with host-resident groups and {without} "
                "without them; host pages must not take device memory",
            )
        ]
    return []


@host_invariant(
    "KV-HOST-SIZED",
    "host tensors are sized by their own block count",
)
def _host_sized(obs: HostObservation, got: HostConfig) -> list[Violation]:
    _groups, config = got
    host = [t for t in config.kv_cache_tensors if t.host_resident]
    if not host:
        return []
    blocks = config.host_num_blocks
    if blocks is None or blocks < 1:
        return [flag(f"host tensors exist but host_num_blocks={blocks}")]
    out = []
    sizes = {t.size for t in host}
    pool = obs.config.host_pool_bytes or 0
    for size in sizes:
        if size % blocks or size > pool:
            out.append(
                flag(
                    f"a host backing of {size} bytes is not a whole number of {blocks} host blocks "
                    f"within the host pool of {pool} bytes",
                )
            )
    out += [
        page_flag(
            f"host tensor {o.page.tensor_index}'s page ends past its backing of {o.size} bytes at "
            f"{blocks} host blocks",
            o.page,
            o.byte_range,
        )
        for o in memory.find_host_out_of_bounds(config, memory_host_layout(), limit=3)
    ]
    return out[:3]


def memory_host_layout() -> Any:
    """The host pool's layout (always LBNHC, contract.md#host-residency)."""
    from kvref import HOST_LAYOUT

    return HOST_LAYOUT


def _beside_host(obs: Any) -> list[KVCacheConfig] | Unjudged | None:
    """The configs with host tensors an observation placed at the block count asked for."""
    if isinstance(obs, HostObservation):
        got = _host_config(obs)
        if got is None:
            return None
        candidates = {obs.num_blocks: got[1]}
    else:
        candidates = {n: c for n in obs.results if (c := obs.config_at(n)) is not None}
    configs = [
        c
        for n, c in candidates.items()
        if c.num_blocks == n and any(t.host_resident for t in c.kv_cache_tensors)
    ]
    return configs or Unjudged("no placement with host-resident tensors")


@invariant(
    "KV-HOST-DEVICE-SAFE",
    "device pages placed beside host-resident groups stay in bounds and apart",
    anchor="host-residency",
    scenario=("placement", "host"),
    requires=("host_resident",),
    in_core=True,
)
def _host_device_safe(obs: Any) -> list[Violation] | Unjudged | None:
    # The KV-PLACE memory checks judge placements without host tensors; this
    # one judges those with them, wherever they are made (host scenario, Core).
    configs = _beside_host(obs)
    if not isinstance(configs, list):
        return configs
    out: list[Violation] = []
    for config in configs:
        out += _device_findings(config, obs.config.kv_cache_layout)
    return out[:3]


def _device_findings(config: KVCacheConfig, layout: Any) -> list[Violation]:
    # One memory check gives all three properties from one analysis of the
    # tensors (three separate finders analysed the same config three times).
    report = memory.check_memory(config, layout, limit=16)
    out = [
        page_flag(
            f"with host-resident groups, device tensor {o.page.tensor_index}'s page ends past "
            f"its backing of {o.size} bytes",
            o.page,
            o.byte_range,
        )
        for o in report.out_of_bounds[:2]
    ]
    for kind, found in (("block", report.block_overlaps), ("layer", report.layer_overlaps)):
        out += [
            page_flag(
                f"with host-resident groups, device page {ov.a.layer!r} block {ov.a.block} "
                f"overlaps {ov.b.layer!r} block {ov.b.block} ({kind} overlap)",
                ov.a,
                ov.byte_range,
            )
            for ov in distinct(found)[:2]
        ]
    return out


@host_invariant(
    "KV-HOST-NO-ALIAS",
    "host pages of different host blocks, or of one group's layers in a block, never overlap",
)
def _host_no_alias(obs: HostObservation, got: HostConfig) -> list[Violation]:
    _, config = got
    if not any(t.host_resident for t in config.kv_cache_tensors):
        return []
    out = []
    for kind, finder in (
        ("block", memory.find_host_block_overlaps),
        ("layer", memory.find_host_layer_overlaps),
    ):
        out += [
            page_flag(
                f"host page {ov.a.layer!r} block {ov.a.block} (tensor {ov.a.tensor_index}) "
                f"overlaps {ov.b.layer!r} block {ov.b.block} (tensor {ov.b.tensor_index}) "
                f"in the host pool ({kind} overlap)",
                ov.a,
                ov.byte_range,
            )
            for ov in distinct(finder(config, memory_host_layout(), limit=16))[:2]
        ]
    return out[:3]
