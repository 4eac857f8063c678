"""The invariant catalog: stable ids, titles, SPEC references and pure checks.

Each check takes one observation (:mod:`conformance.observations`) and returns
``None`` when the example says nothing about the invariant (the call it needs
failed, which the ``KV-CALL-*`` invariants report), or the list of violations
it found (empty: the invariant held).  Ids are stable: vendors put them in
xfail files.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal

import attrs

from conformance import memory
from conformance.bounds import absurd_size, named_layer_specs, size_bound
from conformance.guard import CallResult
from conformance.observations import (
    CoreObservation,
    GroupingObservation,
    HostObservation,
    PlacementObservation,
)
from conformance.violations import Violation
from kvref.errors import InsufficientMemoryError
from kvref.layout import compute_layer_kv_cache_shape_bytes, compute_layout_strides
from kvref.planning import max_memory_usage_bytes_from_groups, project_kv_cache_groups_to_worker
from kvref.records import KVCacheConfig, KVCacheGroupSpec
from kvref.specs import MambaSpec, UniformTypeKVCacheSpecs, dtype_size

__all__ = ["CATALOG", "Invariant", "Scenario", "by_id"]

Scenario = Literal["grouping", "placement", "host", "core", "device"]
Check = Callable[[Any], "list[Violation] | None"]


@attrs.frozen(kw_only=True)
class Invariant:
    """One promise of the builder contract.

    Attributes:
        id: stable id, e.g. ``"KV-GROUP-PARTITION"``.
        title: one line.
        spec: the SPEC.md section it comes from.
        scenario: which observation it reads.
        check: the pure check.
        requires: capabilities the builder must declare for it to apply.
        why_unmeasured: says why the last inconclusive example was not judged.
    """

    id: str
    title: str
    spec: str
    scenario: Scenario
    check: Check
    requires: frozenset[str] = frozenset()
    #: Why the last inconclusive example could not be judged (device checks).
    why_unmeasured: Callable[[], str | None] | None = None


def _v(invariant: str, message: str, **where: Any) -> Violation:
    return Violation(invariant=invariant, message=message, **where)


def _groups(result: CallResult) -> list[KVCacheGroupSpec] | None:
    return list(result.value) if result.ok else None


# -- call guard ---------------------------------------------------------------


def _all_calls(obs: Any) -> Iterable[CallResult]:
    for field in attrs.fields(type(obs)):
        value = getattr(obs, field.name)
        if isinstance(value, CallResult):
            yield value
        elif isinstance(value, dict):
            yield from (v for v in value.values() if isinstance(v, CallResult))


def _call_check(kind: str, invariant: str) -> Check:
    def check(obs: Any) -> list[Violation]:
        out = []
        for call in _all_calls(obs):
            if kind == "raises":
                # Core may refuse a problem with its own typed error; that is not the builder's.
                failed = call.error is not None and call.hook not in ("core", "core-builder")
            elif kind == "type":
                failed = call.wrong_type is not None
            else:
                failed = call.timed_out
            if failed:
                out.append(
                    _v(
                        invariant,
                        call.describe()
                        + (f"\n{call.traceback}" if call.traceback and kind == "raises" else ""),
                    )
                )
        return out[:1]

    return check


# -- grouping -----------------------------------------------------------------


def _partition(obs: GroupingObservation) -> list[Violation] | None:
    groups = _groups(obs.first)
    if groups is None:
        return None
    where: dict[str, int] = {}
    out = []
    for index, group in enumerate(groups):
        for name in dict.fromkeys(group.layer_names):
            if name in where and name in obs.specs:
                out.append(
                    _v(
                        "KV-GROUP-PARTITION",
                        f"layer is in group {where[name]} and group {index}",
                        layer=name,
                    )
                )
            where.setdefault(name, index)
    for name in obs.specs:
        if name not in where:
            out.append(_v("KV-GROUP-PARTITION", "layer is in no group", layer=name))
    return out


def _unknown_layer(obs: GroupingObservation) -> list[Violation] | None:
    groups = _groups(obs.first)
    if groups is None:
        return None
    return [
        _v("KV-GROUP-UNKNOWN-LAYER", f"group {i} names a layer the input does not have", layer=n)
        for i, g in enumerate(groups)
        for n in g.layer_names
        if n not in obs.specs
    ]


def _repeated_layer(obs: GroupingObservation) -> list[Violation] | None:
    groups = _groups(obs.first)
    if groups is None:
        return None
    return [
        _v("KV-GROUP-REPEATED-LAYER", f"group {i} lists the layer {count} times", layer=name)
        for i, g in enumerate(groups)
        for name, count in Counter(g.layer_names).items()
        if count > 1
    ]


def _nonempty(obs: GroupingObservation) -> list[Violation] | None:
    groups = _groups(obs.first)
    if groups is None:
        return None
    return [
        _v("KV-GROUP-NONEMPTY", f"group {i} has no layer; global groups must hold layers")
        for i, g in enumerate(groups)
        if not g.layer_names
    ]


def _wrapper(obs: GroupingObservation) -> list[Violation] | None:
    groups = _groups(obs.first)
    if groups is None:
        return None
    out = []
    for i, g in enumerate(groups):
        spec = g.kv_cache_spec
        if isinstance(spec, UniformTypeKVCacheSpecs) and g.layer_names:  # empty: KV-GROUP-NONEMPTY
            extra = [n for n in spec.kv_cache_specs if n not in g.layer_names]
            missing = [n for n in g.layer_names if n not in spec.kv_cache_specs]
            if extra or missing:
                out.append(
                    _v(
                        "KV-GROUP-WRAPPER",
                        f"group {i}'s UniformTypeKVCacheSpecs covers "
                        f"{sorted(spec.kv_cache_specs)[:4]}"
                        f" but the group names {list(g.layer_names)[:4]} (extra {extra[:3]}, "
                        f"missing {missing[:3]})",
                    )
                )
    return out


def _one_block_size(obs: GroupingObservation) -> list[Violation] | None:
    groups = _groups(obs.first)
    if groups is None:
        return None
    out = []
    for i, g in enumerate(groups):
        sizes = sorted({s.block_size for _, s in named_layer_specs(g)})
        if len(sizes) > 1:
            out.append(
                _v(
                    "KV-GROUP-ONE-BLOCK-SIZE",
                    f"group {i} mixes block sizes {sizes}; one block table has one block size",
                )
            )
    return out


def _layer_spec_kept(obs: GroupingObservation) -> list[Violation] | None:
    groups = _groups(obs.first)
    if groups is None:
        return None
    out = []
    for i, g in enumerate(groups):
        for name, spec in named_layer_specs(g):
            given = obs.specs.get(name)
            if given is None:
                continue
            problems = []
            if isinstance(given, MambaSpec):
                # One state per request: the block size says nothing about its bytes.
                if spec.page_size_bytes < given.page_size_bytes:
                    problems.append(
                        f"page {spec.page_size_bytes} B is smaller than the layer's state page "
                        f"of {given.page_size_bytes} B"
                    )
            elif spec.page_size_bytes * given.block_size < given.page_size_bytes * spec.block_size:
                # Block sizes may change (unification scales them, promotion takes the
                # full layers'), but never the bytes each token keeps.
                problems.append(
                    f"page {spec.page_size_bytes} B for {spec.block_size} tokens keeps fewer "
                    f"bytes per token than the layer's {given.page_size_bytes} B for "
                    f"{given.block_size} tokens"
                )
            if spec.state_content_size_bytes != given.state_content_size_bytes or (
                spec.num_page_heads != given.num_page_heads
            ):
                problems.append(
                    f"stores (H={spec.num_page_heads}, C={spec.state_content_size_bytes}) per "
                    "state "
                    f"where the layer stores (H={given.num_page_heads}, "
                    f"C={given.state_content_size_bytes})"
                )
            if problems:
                out.append(
                    _v(
                        "KV-GROUP-LAYER-SPEC",
                        f"group {i}'s spec for the layer shrinks or changes it: "
                        + "; ".join(problems),
                        layer=name,
                    )
                )
    return out


def _grouping_input(obs: GroupingObservation) -> list[Violation] | None:
    if obs.mutated:
        return [
            _v(
                "KV-GROUP-INPUT-UNCHANGED",
                "get_kv_cache_groups added, removed or reordered layers of the dict it was "
                "given (rewriting specs in place is allowed)",
            )
        ]
    return []


def _grouping_deterministic(obs: GroupingObservation) -> list[Violation] | None:
    if not (obs.first.ok and obs.second.ok and obs.fresh.ok):
        return None
    out = []
    if list(obs.first.value) != list(obs.second.value):
        out.append(
            _v(
                "KV-GROUP-DETERMINISTIC",
                "a second call on the same instance returned different groups",
            )
        )
    if list(obs.first.value) != list(obs.fresh.value):
        out.append(
            _v(
                "KV-GROUP-DETERMINISTIC",
                "a fresh instance returned different groups for the same input",
            )
        )
    return out


# -- placement ----------------------------------------------------------------


def _configs(obs: PlacementObservation) -> dict[int, KVCacheConfig] | None:
    out = {n: c for n in obs.results if (c := obs.config_at(n)) is not None}
    return out or None


def _honest_configs(obs: PlacementObservation) -> dict[int, KVCacheConfig] | None:
    """Configs whose num_blocks is the one asked for (else KV-PLACE-NUM-BLOCKS reports)."""
    configs = _configs(obs)
    if configs is None:
        return None
    return {n: c for n, c in configs.items() if c.num_blocks == n} or None


def _num_blocks(obs: PlacementObservation) -> list[Violation] | None:
    configs = _configs(obs)
    if configs is None:
        return None
    if not obs.groups:
        return []  # no groups always give the null block: KV-PLACE-ATTENTION-FREE
    return [
        _v("KV-PLACE-NUM-BLOCKS", f"asked for {n} blocks, the config has num_blocks={c.num_blocks}")
        for n, c in configs.items()
        if c.num_blocks != n
    ]


def _groups_echoed(obs: PlacementObservation) -> list[Violation] | None:
    configs = _configs(obs)
    if configs is None:
        return None
    out = []
    for n, c in configs.items():
        if list(c.kv_cache_groups) != list(obs.groups):
            out.append(
                _v(
                    "KV-PLACE-GROUPS-ECHOED",
                    f"at {n} blocks the config's kv_cache_groups differ from the groups passed in "
                    "(same groups, same order, unchanged)",
                )
            )
    return out[:1]


def _group_of(groups: Sequence[KVCacheGroupSpec]) -> dict[str, int]:
    return {n: i for i, g in enumerate(groups) for n in g.layer_names}


def _coverage(kind: str) -> Check:
    invariant = {
        "once": "KV-PLACE-LAYER-ONCE",
        "missing": "KV-PLACE-LAYER-MISSING",
        "unknown": "KV-PLACE-UNKNOWN-LAYER",
        "one-spec": "KV-PLACE-TENSOR-ONE-SPEC",
    }[kind]

    def check(obs: PlacementObservation) -> list[Violation] | None:
        configs = _configs(obs)
        if configs is None:
            return None
        out: list[Violation] = []
        for n, c in configs.items():
            owner = _group_of(obs.groups)
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
                        _v(
                            invariant,
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
                        if _has_spec(obs.groups[owner[name]], name)
                    }
                    if len(groups_here) > 1 or len(specs_here) > 1:
                        out.append(
                            _v(
                                invariant,
                                f"tensor {t_index} mixes layers of groups {sorted(groups_here)} "
                                f"with {len(specs_here)} different specs; a worker views every "
                                "layer with layers[0]'s spec",
                                layer=t.layers[0],
                            )
                        )
            if kind == "once":
                out += [
                    _v(invariant, f"at {n} blocks the layer is in {k} device tensors", layer=name)
                    for name, k in counts.items()
                    if k > 1
                ]
            if kind == "missing":
                out += [
                    _v(
                        invariant,
                        f"at {n} blocks the layer of a device group is in no device tensor",
                        layer=name,
                    )
                    for name in sorted(device_layers)
                    if counts[name] == 0
                ]
        return out[:5]

    return check


def _has_spec(group: KVCacheGroupSpec, name: str) -> bool:
    spec = group.kv_cache_spec
    return not isinstance(spec, UniformTypeKVCacheSpecs) or name in spec.kv_cache_specs


def _single_backing(obs: PlacementObservation) -> list[Violation] | None:
    if obs.pool_bytes is not None:
        return []
    configs = _configs(obs)
    if configs is None:
        return None
    out = []
    for n, c in configs.items():
        sizes = sorted({t.size for t in c.device_tensors})
        if len(sizes) > 1:
            out.append(
                _v(
                    "KV-PLACE-SINGLE-BACKING",
                    f"at {n} blocks device tensors name {len(sizes)} backing sizes {sizes[:4]}; "
                    "the worker allocates one buffer",
                )
            )
    return out


def _device_size(config: KVCacheConfig) -> int | None:
    sizes = {t.size for t in config.device_tensors}
    return sizes.pop() if len(sizes) == 1 else None


def _absurd(obs: PlacementObservation, configs: dict[int, KVCacheConfig]) -> bool:
    bound = size_bound(obs.groups)
    return any(
        absurd_size(sum({t.size for t in c.device_tensors}), n, bound) for n, c in configs.items()
    )


def _backing_size(obs: PlacementObservation) -> list[Violation] | None:
    configs = _configs(obs)
    if configs is None or 1 not in configs or _absurd(obs, configs):
        # An absurd size is KV-PLACE-SIZE-BOUND's finding.
        return None
    bpb = _device_size(configs[1])
    if bpb is None:
        return None
    out = []
    for n, c in configs.items():
        size = _device_size(c)
        if size is not None and size != bpb * n:
            out.append(
                _v(
                    "KV-PLACE-BACKING-SIZE",
                    f"at {n} blocks the device backing is {size} bytes; one block takes {bpb} "
                    f"bytes, so it must be {bpb} x {n} = {bpb * n} (a constant part or an extra "
                    "block breaks Core's block arithmetic)",
                )
            )
    return out


def _pool_bytes(obs: PlacementObservation) -> list[Violation] | None:
    if obs.pool_bytes is None:
        return []
    if not obs.pool_bytes.ok:
        return None
    declared = obs.pool_bytes.value
    configs = _configs(obs)
    if configs is None:
        return None
    out = []
    for n, c in configs.items():
        # Several allocations are allowed here, so add up each distinct backing once.
        actual = sum({t.size for t in c.device_tensors})
        if declared * n != actual:
            out.append(
                _v(
                    "KV-PLACE-POOL-BYTES",
                    f"_get_pool_bytes_per_block says {declared} bytes per block, but {n} blocks "
                    f"take {actual} device bytes ({declared} x {n} = {declared * n})",
                )
            )
    return out


def _size_bound(obs: PlacementObservation) -> list[Violation] | None:
    configs = _configs(obs)
    if configs is None:
        return None
    bound = size_bound(obs.groups)
    out = []
    for n, c in configs.items():
        size = sum({t.size for t in c.device_tensors})
        if absurd_size(size, n, bound):
            out.append(
                _v(
                    "KV-PLACE-SIZE-BOUND",
                    f"at {n} blocks the device backing is {size} bytes, more than twice what "
                    f"giving every layer its own aligned pages takes ({bound} x {n} = {bound * n}) "
                    "plus 1 MiB; the kit will not allocate it",
                )
            )
    return out


def _attention_free(obs: PlacementObservation) -> list[Violation] | None:
    if not obs.empty.ok:
        return None
    c = obs.empty.value
    if c.num_blocks != 1 or c.kv_cache_tensors:
        return [
            _v(
                "KV-PLACE-ATTENTION-FREE",
                "with no groups the config must have num_blocks=1 (the null block) and no "
                f"tensors, got num_blocks={c.num_blocks} and {len(c.kv_cache_tensors)} tensors",
            )
        ]
    return []


def _memory_check(kind: str) -> Check:
    invariant = {
        "bounds": "KV-PLACE-IN-BOUNDS",
        "blocks": "KV-PLACE-NO-BLOCK-ALIAS",
        "layers": "KV-PLACE-NO-LAYER-OVERLAP",
    }[kind]

    def check(obs: PlacementObservation) -> list[Violation] | None:
        configs = _honest_configs(obs)
        if configs is None:
            return None
        out: list[Violation] = []
        for n, c in sorted(configs.items()):
            if kind == "bounds":
                out += [
                    _v(
                        invariant,
                        f"at {n} blocks tensor {o.page.tensor_index}'s page ends past the backing "
                        f"of {o.size} bytes",
                        layer=o.page.layer,
                        block=o.page.block,
                        byte_range=o.byte_range,
                    )
                    for o in memory.find_out_of_bounds(c, obs.layout, limit=3)
                ]
            else:
                finder = (
                    memory.find_block_overlaps if kind == "blocks" else memory.find_layer_overlaps
                )
                # A layer placed twice overlapping itself is KV-PLACE-LAYER-ONCE's finding.
                found = [
                    ov
                    for ov in finder(c, obs.layout, limit=64)
                    if ov.a.layer != ov.b.layer or ov.a.block != ov.b.block
                ]
                out += [
                    _v(
                        invariant,
                        f"at {n} blocks {ov.a.layer!r} block {ov.a.block} (tensor "
                        f"{ov.a.tensor_index}) overlaps {ov.b.layer!r} block {ov.b.block} (tensor "
                        f"{ov.b.tensor_index})",
                        layer=ov.a.layer,
                        block=ov.a.block,
                        byte_range=ov.byte_range,
                    )
                    for ov in found[:3]
                ]
            if out:
                break
        return out

    return check


def _typed_views(obs: PlacementObservation) -> list[Violation] | None:
    configs = _configs(obs)
    if configs is None:
        return None
    out = []
    for n, c in configs.items():
        owner = _group_of(c.kv_cache_groups)
        for t in c.device_tensors:
            name = t.layers[0] if t.layers else None
            if (
                name is None
                or name not in owner
                or not _has_spec(c.kv_cache_groups[owner[name]], name)
            ):
                continue
            spec = c.kv_cache_groups[owner[name]].layer_spec(name)
            dtype = spec.view_dtype
            if dtype is None:
                continue
            size = dtype_size(dtype)
            try:
                strides = compute_layout_strides(
                    spec,
                    n,
                    len(t.layers),
                    obs.layout,
                    fixed=(t.layer_stride, t.block_stride, None, None, None),
                )
            except ValueError:
                continue
            content = compute_layer_kv_cache_shape_bytes(spec, 1)[3]
            values = {
                "offset": t.offset,
                "layer_stride": strides[0],
                "block_stride": strides[1],
                "head_stride": strides[2],
                "state_stride": strides[3],
                "content bytes": content,
            }
            bad = {k: v for k, v in values.items() if v % size}
            if bad:
                out.append(
                    _v(
                        "KV-PLACE-TYPED-VIEWS",
                        f"at {n} blocks {bad} are not multiples of sizeof({dtype}) = {size}, so "
                        f"the worker cannot view the tensor as {dtype}",
                        layer=name,
                    )
                )
        if out:
            break
    return out[:3]


def _block_stride(obs: PlacementObservation) -> list[Violation] | None:
    if not obs.layout.is_block_outermost or obs.pool_bytes is not None:
        return []
    configs = _configs(obs)
    if configs is None:
        return None
    sizes = {n: _device_size(c) for n, c in configs.items()}
    counts = sorted(sizes)
    if len(counts) < 2 or any(v is None for v in sizes.values()):
        return None
    low, high = counts[0], counts[-1]
    bpb = ((sizes[high] or 0) - (sizes[low] or 0)) // (high - low)
    if any(sizes[n] != bpb * n for n in counts):
        return None  # sizes that are not linear are KV-PLACE-BACKING-SIZE's finding
    out = []
    for n, c in configs.items():
        out += [
            _v(
                "KV-PLACE-BLOCK-STRIDE",
                f"in block-outermost {obs.layout.name} every tensor must step {bpb} bytes per "
                f"block (the backing divided by {n} blocks); tensor {i} steps {t.block_stride}",
                layer=t.layers[0] if t.layers else None,
            )
            for i, t in enumerate(c.device_tensors)
            if t.block_stride != bpb
        ]
    return out[:3]


def _alignment(obs: PlacementObservation) -> list[Violation] | None:
    configs = _honest_configs(obs)
    if configs is None:
        return None
    out: list[Violation] = []
    for n, c in sorted(configs.items()):
        owner = _group_of(c.kv_cache_groups)
        for i, t in enumerate(c.device_tensors):
            for name in t.layers:
                group = owner.get(name)
                if group is None or not _has_spec(c.kv_cache_groups[group], name):
                    continue
                spec = c.kv_cache_groups[group].layer_spec(name)
                alignment = spec.get_block_stride_alignment()
                # Backends ask for block strides in multiples of this (SPEC 1.1,
                # 4.1, 6 P8/P9); in block-outermost layouts only the block is aligned.
                if alignment > 1 and t.block_stride % alignment:
                    out.append(
                        _v(
                            "KV-PLACE-ALIGNMENT",
                            f"at {n} blocks tensor {i} steps {t.block_stride} bytes per block, "
                            f"not a multiple of the layer's block_stride_alignment of "
                            f"{alignment} bytes",
                            layer=name,
                        )
                    )
                    break
        if out:
            break
    return out[:3]


def _placement_input(obs: PlacementObservation) -> list[Violation] | None:
    if obs.mutated:
        return [
            _v(
                "KV-PLACE-INPUT-UNCHANGED",
                "get_kv_cache_config_from_groups changed the group list it was given",
            )
        ]
    return []


def _placement_deterministic(obs: PlacementObservation) -> list[Violation] | None:
    base = obs.results.get(obs.num_blocks)
    if base is None or not (base.ok and obs.repeat.ok and obs.fresh.ok):
        return None
    out = []
    if base.value != obs.repeat.value:
        out.append(
            _v(
                "KV-PLACE-DETERMINISTIC",
                f"placing {obs.num_blocks} blocks twice on one instance gave different configs",
            )
        )
    if base.value != obs.fresh.value:
        out.append(
            _v(
                "KV-PLACE-DETERMINISTIC",
                f"a fresh instance placed {obs.num_blocks} blocks differently",
            )
        )
    return out


# -- host residency -------------------------------------------------------------


def _host_config(obs: HostObservation) -> tuple[list[KVCacheGroupSpec], KVCacheConfig] | None:
    groups = _groups(obs.groups)
    if groups is None or obs.placed is None or not obs.placed.ok:
        return None
    names = [n for g in groups for n in g.layer_names]
    if len(names) != len(set(names)) or set(names) != set(obs.specs):
        return None  # a grouping bug, reported by KV-GROUP-*
    return groups, obs.placed.value


def _host_tensors(obs: HostObservation) -> list[Violation] | None:
    got = _host_config(obs)
    if got is None:
        return None
    groups, config = got
    host_layers = set(obs.config.host_resident_layers)
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


def _host_excluded(obs: HostObservation) -> list[Violation] | None:
    got = _host_config(obs)
    if got is None or obs.device_only is None or not obs.device_only.ok:
        return None
    _, config = got
    host_layers = set(obs.config.host_resident_layers)
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
    """The host pool's layout (always LBNHC, SPEC 1.10)."""
    from kvref.placement import HOST_LAYOUT

    return HOST_LAYOUT


# -- Core flow ----------------------------------------------------------------------


def _worker_layers(obs: CoreObservation) -> list[Violation] | None:
    plan = obs.plan
    if plan is None:
        return None
    out = []
    for w, (config, specs) in enumerate(zip(plan.configs, obs.workers, strict=False)):
        grouped = {n for g in config.kv_cache_groups for n in g.layer_names}
        placed = {n for t in config.kv_cache_tensors for n in t.layers}
        expected = set(specs)
        if grouped != expected or placed != expected:
            missing = sorted(expected - (grouped & placed))[:3]
            foreign = sorted((grouped | placed) - expected)[:3]
            out.append(
                _v(
                    "KV-CORE-WORKER-LAYERS",
                    f"the config covers {len(grouped & placed)} of the worker's {len(expected)} "
                    f"layers (missing {missing}, foreign {foreign})",
                    worker=w,
                )
            )
    if len(plan.configs) != len(obs.workers):
        out.append(
            _v(
                "KV-CORE-WORKER-LAYERS",
                f"{len(plan.configs)} configs for {len(obs.workers)} workers",
            )
        )
    return out


def _same_blocks(obs: CoreObservation) -> list[Violation] | None:
    plan = obs.plan
    if plan is None:
        return None
    counts = [c.num_blocks for c in plan.configs]
    if len(set(counts)) > 1:
        return [
            _v(
                "KV-CORE-SAME-BLOCKS",
                f"workers end with different num_blocks {counts}; the scheduler needs one block "
                "count",
            )
        ]
    return []


def _bpb(config: KVCacheConfig) -> int:
    size = max((t.size for t in config.device_tensors), default=0)
    return size // config.num_blocks if config.num_blocks else 0


def _core_memory(obs: CoreObservation) -> list[Violation] | None:
    plan = obs.plan
    if plan is None or obs.config.num_gpu_blocks_override is not None:
        return None if plan is None else []
    out = []
    for w, (config, available) in enumerate(zip(plan.configs, obs.available_memory, strict=False)):
        used = sum({t.size for t in config.device_tensors})
        if used > available:
            out.append(
                _v(
                    "KV-CORE-MEMORY",
                    f"the device backing is {used} bytes but only {available} are available",
                    worker=w,
                )
            )
    return out


def _core_slack(obs: CoreObservation) -> list[Violation] | None:
    plan = obs.plan
    if plan is None or obs.config.num_gpu_blocks_override is not None:
        return None if plan is None else []
    bpbs = [_bpb(c) for c in plan.configs]
    active = [(w, b) for w, b in enumerate(bpbs) if b > 0]
    if not active:
        return []
    n = plan.configs[0].num_blocks
    if any((n + 1) * b > obs.available_memory[w] for w, b in active):
        return []
    slack = min(obs.available_memory[w] // b - n for w, b in active)
    return [
        _v(
            "KV-CORE-SLACK",
            f"every worker could hold at least {slack} more blocks than the {n} planned; the "
            "limiting worker must be left with less than one block",
        )
    ]


def _core_override(obs: CoreObservation) -> list[Violation] | None:
    override = obs.config.num_gpu_blocks_override
    plan = obs.plan
    if override is None:
        return []
    if plan is None:
        return None
    bad = [c.num_blocks for c in plan.configs if c.num_blocks != override]
    if bad:
        return [
            _v(
                "KV-CORE-OVERRIDE",
                f"num_gpu_blocks_override={override} but the configs have num_blocks {bad[:4]}",
            )
        ]
    return []


def _core_admission(obs: CoreObservation) -> list[Violation] | None:
    plan = obs.plan
    if plan is None:
        return None
    if not plan.global_groups:
        return []
    out = []
    length = plan.max_model_len
    if not obs.config.auto_fit_max_model_len and length != obs.config.max_model_len:
        out.append(
            _v(
                "KV-CORE-ADMISSION",
                f"the plan is for max_model_len={length} but the config asks for "
                f"{obs.config.max_model_len} and does not auto-fit",
            )
        )
        length = obs.config.max_model_len
    elif length > obs.config.max_model_len:
        out.append(
            _v(
                "KV-CORE-ADMISSION",
                f"auto-fit raised max_model_len to {length}, above the config's "
                f"{obs.config.max_model_len}",
            )
        )
    config = obs.config.with_max_model_len(length)
    for w, (cfg, specs) in enumerate(zip(plan.configs, obs.workers, strict=False)):
        groups = project_kv_cache_groups_to_worker(plan.global_groups, specs)
        bpb = _bpb(cfg)
        if bpb == 0:
            continue
        available = obs.available_memory[w]
        if obs.config.num_gpu_blocks_override is not None:
            available = obs.config.num_gpu_blocks_override * bpb
        needed = max_memory_usage_bytes_from_groups(config, groups, bpb)
        if needed > available - bpb:
            out.append(
                _v(
                    "KV-CORE-ADMISSION",
                    f"a config was returned although one request at max_model_len={length} needs "
                    f"{needed} bytes and only {available - bpb} are left after the null block; "
                    "this must be an error",
                    worker=w,
                )
            )
    return out


def _core_error_clear(obs: CoreObservation) -> list[Violation] | None:
    if obs.result.ok or obs.result.error_type is None or obs.result.hook != "core":
        return None
    if issubclass(obs.result.error_type, InsufficientMemoryError):
        return []
    if not issubclass(obs.result.error_type, ValueError):
        return [
            _v(
                "KV-CORE-ERROR-TYPED",
                f"Core's flow failed with {obs.result.error}; failures must be typed ValueErrors "
                "with the numbers in the message",
            )
        ]
    return []


# -- catalog -------------------------------------------------------------------


def _inv(
    id: str, title: str, spec: str, scenario: Scenario, check: Check, *requires: str
) -> Invariant:
    return Invariant(
        id=id, title=title, spec=spec, scenario=scenario, check=check, requires=frozenset(requires)
    )


CATALOG: tuple[Invariant, ...] = (
    _inv(
        "KV-CALL-RAISES",
        "hooks return on every valid input instead of raising",
        "2",
        "grouping",
        _call_check("raises", "KV-CALL-RAISES"),
    ),
    _inv(
        "KV-CALL-RETURN-TYPE",
        "hooks return the documented types",
        "2",
        "grouping",
        _call_check("type", "KV-CALL-RETURN-TYPE"),
    ),
    _inv(
        "KV-CALL-TIMEOUT",
        "every hook returns within the per-call deadline",
        "2",
        "grouping",
        _call_check("timeout", "KV-CALL-TIMEOUT"),
    ),
    _inv(
        "KV-GROUP-PARTITION",
        "every input layer is in exactly one group",
        "2 #1, 3",
        "grouping",
        _partition,
    ),
    _inv(
        "KV-GROUP-UNKNOWN-LAYER",
        "groups name only layers of the input",
        "2 #1",
        "grouping",
        _unknown_layer,
    ),
    _inv(
        "KV-GROUP-REPEATED-LAYER",
        "no group lists a layer twice",
        "2 #1",
        "grouping",
        _repeated_layer,
    ),
    _inv("KV-GROUP-NONEMPTY", "no global group is empty", "3.3", "grouping", _nonempty),
    _inv(
        "KV-GROUP-WRAPPER",
        "a uniform-type group's wrapper covers exactly its layers",
        "1.6",
        "grouping",
        _wrapper,
    ),
    _inv(
        "KV-GROUP-ONE-BLOCK-SIZE",
        "the layers of a group share one block size",
        "1.6, 3.3",
        "grouping",
        _one_block_size,
    ),
    _inv(
        "KV-GROUP-LAYER-SPEC",
        "a layer's group spec stores what the layer stores and never shrinks its page",
        "3.2, 3.4",
        "grouping",
        _layer_spec_kept,
    ),
    _inv(
        "KV-GROUP-INPUT-UNCHANGED",
        "grouping keeps the layer names it was given",
        "2",
        "grouping",
        _grouping_input,
    ),
    _inv(
        "KV-GROUP-DETERMINISTIC",
        "grouping is deterministic and stateless",
        "2 #7",
        "grouping",
        _grouping_deterministic,
    ),
    _inv(
        "KV-PLACE-NUM-BLOCKS",
        "the config has exactly the requested num_blocks",
        "2 #6",
        "placement",
        _num_blocks,
    ),
    _inv(
        "KV-PLACE-GROUPS-ECHOED",
        "the config's groups are the groups passed in, unchanged, in order",
        "2 #9",
        "placement",
        _groups_echoed,
    ),
    _inv(
        "KV-PLACE-LAYER-ONCE",
        "no device layer is in two device tensors",
        "2 #10, 6 P6",
        "placement",
        _coverage("once"),
    ),
    _inv(
        "KV-PLACE-LAYER-MISSING",
        "every device layer is in a device tensor",
        "2 #10, 6 P6",
        "placement",
        _coverage("missing"),
    ),
    _inv(
        "KV-PLACE-UNKNOWN-LAYER",
        "device tensors hold only layers of device groups",
        "6 P6",
        "placement",
        _coverage("unknown"),
    ),
    _inv(
        "KV-PLACE-TENSOR-ONE-SPEC",
        "a tensor's layers share one group and one per-layer spec",
        "2 #10, 6 P6",
        "placement",
        _coverage("one-spec"),
    ),
    _inv(
        "KV-PLACE-SINGLE-BACKING",
        "device tensors share one backing size",
        "2 #2, 6 P1",
        "placement",
        _single_backing,
    ),
    _inv(
        "KV-PLACE-BACKING-SIZE",
        "the device backing is bytes_per_block x num_blocks",
        "2 #3-4, 6 P7",
        "placement",
        _backing_size,
    ),
    _inv(
        "KV-PLACE-POOL-BYTES",
        "_get_pool_bytes_per_block matches the device bytes placed",
        "2, 5.2",
        "placement",
        _pool_bytes,
    ),
    _inv(
        "KV-PLACE-SIZE-BOUND",
        "the backing never exceeds every layer's own aligned pages",
        "4.1",
        "placement",
        _size_bound,
    ),
    _inv(
        "KV-PLACE-ATTENTION-FREE",
        "no groups give one block and no tensors",
        "2 #8, 6 P11",
        "placement",
        _attention_free,
    ),
    _inv(
        "KV-PLACE-IN-BOUNDS",
        "every page lies inside its backing",
        "6 P2",
        "placement",
        _memory_check("bounds"),
    ),
    _inv(
        "KV-PLACE-NO-BLOCK-ALIAS",
        "pages of different block IDs never overlap",
        "4.4, 6 P3",
        "placement",
        _memory_check("blocks"),
    ),
    _inv(
        "KV-PLACE-NO-LAYER-OVERLAP",
        "layers of one group never overlap within a block",
        "4.4, 6 P4",
        "placement",
        _memory_check("layers"),
    ),
    _inv(
        "KV-PLACE-TYPED-VIEWS",
        "offsets and strides allow views in the spec's dtype",
        "1.9, 6 P10",
        "placement",
        _typed_views,
    ),
    _inv(
        "KV-PLACE-BLOCK-STRIDE",
        "block-outermost tensors step one whole block per block",
        "1.9, 6 P8",
        "placement",
        _block_stride,
    ),
    _inv(
        "KV-PLACE-ALIGNMENT",
        "block strides honour every layer's block_stride_alignment",
        "1.1, 4.1, 6 P8-P9",
        "placement",
        _alignment,
    ),
    _inv(
        "KV-PLACE-INPUT-UNCHANGED",
        "placement does not mutate its input",
        "2",
        "placement",
        _placement_input,
    ),
    _inv(
        "KV-PLACE-DETERMINISTIC",
        "placement is deterministic and stateless",
        "2 #7",
        "placement",
        _placement_deterministic,
    ),
    _inv(
        "KV-HOST-TENSORS",
        "host-resident layers live in host tensors only",
        "1.10",
        "host",
        _host_tensors,
        "host_resident",
    ),
    _inv(
        "KV-HOST-EXCLUDED",
        "host tensors take no device memory",
        "1.10, 2 #5",
        "host",
        _host_excluded,
        "host_resident",
    ),
    _inv(
        "KV-HOST-SIZED",
        "host tensors are sized by their own block count",
        "1.10",
        "host",
        _host_sized,
        "host_resident",
    ),
    _inv(
        "KV-CORE-WORKER-LAYERS",
        "each worker's config covers exactly its layers",
        "5.2",
        "core",
        _worker_layers,
    ),
    _inv(
        "KV-CORE-SAME-BLOCKS",
        "all workers end with the same num_blocks",
        "5.2 step 8",
        "core",
        _same_blocks,
    ),
    _inv(
        "KV-CORE-MEMORY",
        "device bytes never exceed the available memory",
        "5.2",
        "core",
        _core_memory,
    ),
    _inv(
        "KV-CORE-SLACK",
        "the limiting worker has less than one block of slack",
        "5.2 step 7-8",
        "core",
        _core_slack,
    ),
    _inv(
        "KV-CORE-OVERRIDE",
        "num_gpu_blocks_override is honoured",
        "5.2 step 3",
        "core",
        _core_override,
    ),
    _inv(
        "KV-CORE-ADMISSION",
        "insufficient memory is an error, never a config",
        "5.2 step 6",
        "core",
        _core_admission,
    ),
    _inv(
        "KV-CORE-ERROR-TYPED",
        "Core's failures are typed errors with numbers",
        "7",
        "core",
        _core_error_clear,
    ),
)


def by_id() -> dict[str, Invariant]:
    """The catalog keyed by id."""
    return {inv.id: inv for inv in CATALOG}
