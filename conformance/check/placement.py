"""Placement invariants: what ``get_kv_cache_config_from_groups`` returns is the plan asked for.

The request (block count, groups echoed), the tensors (every device layer
once, one spec per tensor), the backing (one size, linear in the block
count, within bounds, matching ``_get_pool_bytes_per_block``), the empty
plan and the hook's purity.  The same configs' memory safety is
:mod:`conformance.check.placement_safety`'s, their views and strides
:mod:`conformance.check.placement_views`' (the helpers here serve both).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from conformance.check.bounds import (
    BLOCK_PADDING_ALLOWANCE,
    absurd_size,
    size_bound,
    tensor_problems,
)
from conformance.check.catalog import (
    Check,
    Unjudged,
    flag,
    invariant,
    invariant_on,
    judged_on,
)
from conformance.check.observations import HostObservation, PlacementObservation
from conformance.check.purity import changed_input, unstable
from conformance.check.violations import Violation
from kvref.records import KVCacheConfig, KVCacheGroupSpec
from kvref.specs import UniformTypeKVCacheSpecs


def placed_configs(obs: PlacementObservation) -> dict[int, KVCacheConfig] | None:
    """The configs returned, by block count, less those whose sizes no allocator takes."""
    # A config with sizes no allocator takes is KV-PLACE-SIZE-BOUND's alone to judge.
    out = {n: c for n, c in _returned(obs).items() if not tensor_problems(c)}
    return out or None


def _returned(obs: PlacementObservation) -> dict[int, KVCacheConfig]:
    # Raw: config_at hides configs whose byte counts no allocator takes.
    return {
        n: r.value for n, r in obs.results.items() if r.ok and isinstance(r.value, KVCacheConfig)
    }


def honest_configs(obs: PlacementObservation) -> dict[int, KVCacheConfig] | None:
    """Configs whose num_blocks is the one asked for (else KV-PLACE-NUM-BLOCKS reports)."""
    configs = placed_configs(obs)
    if configs is None:
        return None
    return {n: c for n, c in configs.items() if c.num_blocks == n} or None


#: The configs a placement returned, by the block count asked for.
Configs = dict[int, KVCacheConfig]


def placement_invariant(
    id: str,
    title: str,
    *,
    anchor: str,
    configs: Callable[[PlacementObservation], Configs | None] = placed_configs,
) -> Callable[[Callable[[PlacementObservation, Configs], Any]], Check]:
    """Declare a check of the configs a placement returned, judged in Core's flow too.

    ``configs``: which of them it judges (:func:`placed_configs` or
    :func:`honest_configs`); an example with none is not judged.
    """
    return invariant_on(configs, id, title, anchor=anchor, scenario="placement", in_core=True)


@placement_invariant(
    "KV-PLACE-NUM-BLOCKS",
    "the config has exactly the requested num_blocks",
    anchor="placement-request",
)
def _num_blocks(obs: PlacementObservation, configs: Configs) -> list[Violation]:
    if not obs.groups:
        return []  # no groups always give the null block: KV-PLACE-ATTENTION-FREE
    return [
        flag(f"asked for {n} blocks, the config has num_blocks={c.num_blocks}")
        for n, c in configs.items()
        if c.num_blocks != n
    ]


@placement_invariant(
    "KV-PLACE-GROUPS-ECHOED",
    "the config's groups are the groups passed in, unchanged, in order",
    anchor="placement-request",
)
def _groups_echoed(obs: PlacementObservation, configs: Configs) -> list[Violation]:
    out = []
    for n, c in configs.items():
        if list(c.kv_cache_groups) != list(obs.groups):
            out.append(
                flag(
                    f"at {n} blocks the config's kv_cache_groups differ from the groups passed in "
                    "(same groups, same order, unchanged)",
                )
            )
    return out[:1]


@placement_invariant(
    "KV-PLACE-RETENTION",
    "the config keeps the operator's prefix-cache retention interval",
    anchor="placement-request",
)
def _retention(obs: PlacementObservation, configs: Configs) -> list[Violation] | None:
    if not obs.groups:
        # An empty plan has no group whose checkpoints the interval would thin.
        return None
    want = obs.config.prefix_cache_retention_interval
    return [
        flag(
            f"at {n} blocks the config has prefix_cache_retention_interval="
            f"{c.prefix_cache_retention_interval!r}; the planning config says {want!r} "
            "(vLLM's KV cache manager reads it from the config: None keeps checkpoints "
            "densely, 0 only the semantic ones)",
        )
        for n, c in configs.items()
        if c.prefix_cache_retention_interval != want
    ][:1]


def first_findings(
    configs: Iterable[tuple[int, KVCacheConfig]],
    find: Callable[[int, KVCacheConfig], list[Violation]],
) -> list[Violation]:
    """What ``find(n, config)`` finds in the first of ``configs`` where it finds anything.

    ``configs``: (block count, config) pairs, in the order to look in.  One
    placement's findings read best; the other block counts mostly repeat them.
    """
    for n, c in configs:
        found = find(n, c)
        if found:
            return found
    return []


def group_index(groups: Sequence[KVCacheGroupSpec]) -> dict[str, int]:
    """The index of the group holding each layer name."""
    return {n: i for i, g in enumerate(groups) for n in g.layer_names}


def register_placement(id_: str, title: str, anchor: str, check: Check) -> None:
    """Declare a placement invariant Core's flow and the profiling path judge too.

    For checks a factory makes (one per kind), which no decorator can name:
    :func:`~conformance.check.catalog.invariant` with ``in_core``.  Both flows
    hand the builder groups it must place safely; the profiling path's
    placement is as real as Core's.
    """
    invariant(id_, title, anchor=anchor, scenario="placement", in_core=True)(check)


def _coverage(kind: str) -> Check:
    def check(obs: PlacementObservation, configs: Configs) -> list[Violation]:
        out: list[Violation] = []
        for n, c in configs.items():
            owner = group_index(obs.groups)
            device_layers = {
                name for g in obs.groups if not g.host_resident for name in g.layer_names
            }
            counts: Counter[str] = Counter()
            for t_index, t in enumerate(c.kv_cache_tensors):
                if t.host_resident:
                    continue
                counts.update(t.layers)
                if kind == "unknown":
                    out += [
                        flag(
                            f"tensor {t_index} holds a layer that no device group has",
                            layer=name,
                        )
                        for name in t.layers
                        if name not in device_layers
                    ]
                if kind == "one-spec":
                    known = [name for name in t.layers if name in owner]
                    groups_here = {owner[name] for name in known}
                    specs_here = {
                        obs.groups[owner[name]].layer_spec(name)
                        for name in known
                        if has_spec(obs.groups[owner[name]], name)
                    }
                    if len(groups_here) > 1 or len(specs_here) > 1:
                        out.append(
                            flag(
                                f"tensor {t_index} mixes layers of groups {sorted(groups_here)} "
                                f"with {len(specs_here)} different specs; a worker views every "
                                "layer with layers[0]'s spec",
                                layer=t.layers[0],
                            )
                        )
            if kind == "once":
                out += [
                    flag(f"at {n} blocks the layer is in {k} device tensors", layer=name)
                    for name, k in counts.items()
                    if k > 1
                ]
            if kind == "missing":
                out += [
                    flag(
                        f"at {n} blocks the layer of a device group is in no device tensor",
                        layer=name,
                    )
                    for name in sorted(device_layers)
                    if counts[name] == 0
                ]
        return out[:5]

    return judged_on(placed_configs, check)


register_placement(
    "KV-PLACE-LAYER-ONCE",
    "no device layer is in two device tensors",
    "placement-tensors",
    _coverage("once"),
)
register_placement(
    "KV-PLACE-LAYER-MISSING",
    "every device layer is in a device tensor",
    "placement-tensors",
    _coverage("missing"),
)
register_placement(
    "KV-PLACE-UNKNOWN-LAYER",
    "device tensors hold only layers of device groups",
    "placement-tensors",
    _coverage("unknown"),
)
register_placement(
    "KV-PLACE-TENSOR-ONE-SPEC",
    "a tensor's layers share one group and one per-layer spec",
    "placement-tensors",
    _coverage("one-spec"),
)


def has_spec(group: KVCacheGroupSpec, name: str) -> bool:
    """Whether ``group`` has a spec for layer ``name`` (a uniform-type group may lack one)."""
    spec = group.kv_cache_spec
    return not isinstance(spec, UniformTypeKVCacheSpecs) or name in spec.kv_cache_specs


@invariant(
    "KV-PLACE-SINGLE-BACKING",
    "device tensors share one backing size",
    anchor="placement-backing",
    scenario="placement",
    in_core=True,
)
def _single_backing(obs: PlacementObservation) -> list[Violation] | Unjudged | None:
    if obs.pool_bytes is not None and not obs.pool_bytes.ok:
        return Unjudged("_get_pool_bytes_per_block failed (KV-CALL-*)")
    if obs.declared_pool_bytes is not None:
        # A declared number allows several device allocations; KV-PLACE-POOL-BYTES judges it.
        return []
    configs = placed_configs(obs)
    if configs is None:
        return None
    out = []
    for n, c in configs.items():
        sizes = sorted({t.size for t in c.device_tensors})
        if len(sizes) > 1:
            out.append(
                flag(
                    f"at {n} blocks device tensors name {len(sizes)} backing sizes {sizes[:4]}; "
                    "the worker allocates one buffer",
                )
            )
    return out


def device_size(config: KVCacheConfig) -> int | None:
    """The one size of the device tensors, or ``None`` when they name several."""
    sizes = {t.size for t in config.device_tensors}
    return sizes.pop() if len(sizes) == 1 else None


def _absurd(obs: PlacementObservation, configs: dict[int, KVCacheConfig]) -> bool:
    bound = size_bound(obs.groups)
    return any(
        absurd_size(sum({t.size for t in c.device_tensors}), n, bound) for n, c in configs.items()
    )


@placement_invariant(
    "KV-PLACE-BACKING-SIZE",
    "the device backing is bytes_per_block x num_blocks",
    anchor="placement-backing",
)
def _backing_size(obs: PlacementObservation, configs: Configs) -> list[Violation] | None:
    if 1 not in configs or _absurd(obs, configs):
        # An absurd size is KV-PLACE-SIZE-BOUND's finding.
        return None
    bpb = device_size(configs[1])
    if bpb is None:
        return None
    out = []
    for n, c in configs.items():
        size = device_size(c)
        if size is not None and size != bpb * n:
            out.append(
                flag(
                    f"at {n} blocks the device backing is {size} bytes; one block takes {bpb} "
                    f"bytes, so it must be {bpb} x {n} = {bpb * n} (a constant part or an extra "
                    "block breaks Core's block arithmetic)",
                )
            )
    return out


def _pool_bytes_beside_host(obs: HostObservation) -> list[Violation] | Unjudged:
    found = obs.pool_verdicts.get("KV-PLACE-POOL-BYTES")
    return Unjudged("no placement with an answer to judge") if found is None else list(found)


@invariant(
    "KV-PLACE-POOL-BYTES",
    "_get_pool_bytes_per_block matches the device bytes placed",
    anchor="pool-bytes-hook",
    # The host scenario judges it next to host-resident groups (pool_verdicts).
    scenario=("placement", "host"),
    in_core=True,
)
def _pool_bytes(obs: PlacementObservation | HostObservation) -> list[Violation] | Unjudged | None:
    if isinstance(obs, HostObservation):
        return _pool_bytes_beside_host(obs)
    if obs.pool_bytes is None:
        return Unjudged("no groups: Core never asks _get_pool_bytes_per_block about none")
    if not obs.pool_bytes.ok:
        return None
    declared = obs.declared_pool_bytes
    if declared is None:
        # "None: Core probes" is always a legal answer; the probe needs one
        # backing size, which KV-PLACE-SINGLE-BACKING judges.
        return []
    return _declared_matches(obs, declared)


def _declared_matches(obs: PlacementObservation, declared: int) -> list[Violation] | None:
    if declared == 0 and any(not g.host_resident and g.layer_names for g in obs.groups):
        return [
            flag(
                "_get_pool_bytes_per_block says 0 bytes per block for groups with device layers; "
                "Core divides the memory by it",
            )
        ]
    configs = placed_configs(obs)
    if configs is None:
        return None
    out = []
    for n, c in configs.items():
        # Several allocations are allowed here, so add up each distinct backing once.
        actual = sum({t.size for t in c.device_tensors})
        if declared * n != actual:
            out.append(
                flag(
                    f"_get_pool_bytes_per_block says {declared} bytes per block, but {n} blocks "
                    f"take {actual} device bytes ({declared} x {n} = {declared * n})",
                )
            )
    return out


@placement_invariant(
    "KV-PLACE-SIZE-BOUND",
    "the backing never exceeds every layer's own aligned pages",
    anchor="placement-backing",
    configs=lambda obs: _returned(obs) or None,  # sizes no allocator takes included
)
def _size_bound(obs: PlacementObservation, configs: Configs) -> list[Violation]:
    bound = size_bound(obs.groups)
    out = []
    for n, c in configs.items():
        problems = tensor_problems(c)
        if problems:
            out.append(
                flag(
                    f"at {n} blocks {'; '.join(problems[:3])}: no allocator can take that, so "
                    "the kit will not allocate it",
                )
            )
            continue
        size = sum({t.size for t in c.device_tensors})
        if absurd_size(size, n, bound):
            out.append(
                flag(
                    f"at {n} blocks the device backing is {size} bytes, more than twice what "
                    "giving every layer its own aligned pages takes, a block tiling any HiSparse "
                    f"hot page ({bound} x {n} = {bound * n}) "
                    f"plus {BLOCK_PADDING_ALLOWANCE} bytes of padding per block and 1 MiB; the "
                    "kit will not allocate it",
                )
            )
    return out


@invariant(
    "KV-PLACE-ATTENTION-FREE",
    "no groups give one block and no tensors",
    anchor="placement-attention-free",
    scenario="placement",
)
def _attention_free(obs: PlacementObservation) -> list[Violation] | None:
    if not obs.empty.ok:
        return None
    c = obs.empty.value
    if c.num_blocks != 1 or c.kv_cache_tensors:
        return [
            flag(
                "with no groups the config must have num_blocks=1 (the null block) and no "
                f"tensors, got num_blocks={c.num_blocks} and {len(c.kv_cache_tensors)} tensors",
            )
        ]
    return []


@invariant(
    "KV-PLACE-INPUT-UNCHANGED",
    "placement does not mutate its input",
    anchor="hook-purity",
    scenario="placement",
    in_core=True,
)
def _placement_input(obs: PlacementObservation) -> list[Violation] | None:
    return changed_input(
        obs.mutations,
        "get_kv_cache_config_from_groups",
        "Placement (and the pool-bytes hook it answers) changes nothing it is given: not the "
        "group list, a group, its spec, nor the config",
    )


@invariant(
    "KV-PLACE-DETERMINISTIC",
    "placement is deterministic and stateless",
    anchor="hook-purity",
    scenario="placement",
)
def _placement_deterministic(obs: PlacementObservation) -> list[Violation] | None:
    return unstable(
        obs.results.get(obs.num_blocks),
        obs.repeat,
        obs.fresh,
        again=f"placing {obs.num_blocks} blocks twice on one instance gave different configs",
        anew=f"a fresh instance placed {obs.num_blocks} blocks differently",
    )
