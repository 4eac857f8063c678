"""Default grouping: split layers into KV cache groups (SPEC 3, vLLM ``get_kv_cache_groups``).

The decision order is SPEC 3.1.  Promotion and page-size unification live in
:mod:`kvref.unification`, packed grouping in :mod:`kvref.packing`.

Differences from vLLM 0.33.0, on purpose:
- the caller's mapping is never mutated (vLLM unifies specs in place);
- layers named in ``PlanningConfig.host_resident_layers`` form their own
  host-resident group, after the device groups (vLLM only does this for HiSparse);
- HiSparse (3.1 step 3) is out of scope, and so are hidden-state specs
  (3.1 steps 6 and 10, SPEC 3.6): kvref has no ``HiddenStateCacheSpec``;
- every failure is a typed :class:`~kvref.errors.KVRefError`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kvref._math import cdiv
from kvref.config import PlanningConfig
from kvref.errors import (
    ConfigError,
    ConflictingWindowError,
    GroupingError,
    IncompatibleSpecsError,
    PageSizeUnificationError,
    SpecError,
)
from kvref.packing import get_packed_kv_cache_groups
from kvref.records import KVCacheGroupSpec
from kvref.specs import KVCacheSpec, UniformTypeKVCacheSpecs
from kvref.unification import (
    is_kv_cache_spec_uniform,
    try_get_full_allocation_fallback_groups,
    unify_hybrid_kv_cache_specs,
    unify_kv_cache_spec_page_size,
)

__all__ = ["create_kv_cache_group_specs", "get_kv_cache_groups"]


def get_kv_cache_groups(
    config: PlanningConfig, kv_cache_spec: Mapping[str, KVCacheSpec]
) -> list[KVCacheGroupSpec]:
    """Split layers into KV cache groups (SPEC 3.1); ``kv_cache_spec`` is not mutated.

    Args:
        config: the planning config (hybrid manager flag, layout, host layers).
        kv_cache_spec: layer name to per-layer spec, in layer order.

    Returns:
        The device groups, then one host-resident group if any layer is host-resident.

    Raises:
        SpecError: a key is not a str or a value is not a per-layer spec.
        ConfigError: ``config.host_resident_layers`` names a layer not in the input.
        ConflictingWindowError: full-attention layers with two different windows
            would share the single uniform group (vLLM's ``ValueError``).
        GroupingError: the layers cannot be grouped (promotion, page unification,
            packing or host-resident layers of several types); the message says why.

    """
    specs = _validated(kv_cache_spec)
    host_names = config.host_resident_layers
    unknown = sorted(host_names - specs.keys())
    if unknown:
        raise ConfigError(
            f"PlanningConfig.host_resident_layers names {unknown}, which are not KV cache "
            "layers of this model"
        )
    device = {n: s for n, s in specs.items() if n not in host_names}
    host = {n: s for n, s in specs.items() if n in host_names}
    groups = _get_device_kv_cache_groups(config, device)
    if host:
        groups.append(_host_resident_group(host))
    return groups


def _validated(kv_cache_spec: Mapping[str, KVCacheSpec]) -> dict[str, KVCacheSpec]:
    if not isinstance(kv_cache_spec, Mapping):
        raise SpecError(
            f"kv_cache_spec={kv_cache_spec!r} must be a mapping of layer name to KVCacheSpec"
        )
    specs: dict[str, KVCacheSpec] = {}
    for name, spec in kv_cache_spec.items():
        if not isinstance(name, str):
            raise SpecError(f"layer name {name!r} (spec {spec!r}) must be a str")
        # A UniformTypeKVCacheSpecs is a group spec, never a layer's own.
        if not isinstance(spec, KVCacheSpec):
            raise SpecError(
                f"layer {name!r}: {spec!r} is not a per-layer KVCacheSpec "
                f"(got {type(spec).__name__})"
            )
        specs[name] = spec
    return specs


def _get_device_kv_cache_groups(
    config: PlanningConfig, specs: dict[str, KVCacheSpec]
) -> list[KVCacheGroupSpec]:
    if config.disable_hybrid_kv_cache_manager:
        specs = unify_hybrid_kv_cache_specs(specs)
    if not specs:
        # Attention-free: Core gives such models one null block and no tensors.
        return []

    values = list(specs.values())
    if is_kv_cache_spec_uniform(values):
        return create_kv_cache_group_specs(specs, [list(specs)])
    uniform_type = UniformTypeKVCacheSpecs.from_specs(specs)
    if uniform_type is not None:
        return [KVCacheGroupSpec(layer_names=tuple(specs), kv_cache_spec=uniform_type)]

    packed = get_packed_kv_cache_groups(config, specs)
    if packed is not None:
        return packed

    try:
        unified = unify_kv_cache_spec_page_size(specs)
    except PageSizeUnificationError:
        fallback = try_get_full_allocation_fallback_groups(specs)
        if fallback is None:
            raise
        return fallback
    return _get_kv_cache_groups_uniform_page_size(unified)


def _host_resident_group(host: dict[str, KVCacheSpec]) -> KVCacheGroupSpec:
    # Host layers share the host pool's block table, so they must form a
    # single group: only the uniform and uniform-type rules can give one.
    names = tuple(host)
    values = list(host.values())
    if is_kv_cache_spec_uniform(values):
        spec = type(values[0]).merge(values)
        return KVCacheGroupSpec(layer_names=names, kv_cache_spec=spec, host_resident=True)
    uniform_type = UniformTypeKVCacheSpecs.from_specs(host)
    if uniform_type is None:
        kinds = sorted({type(s).__name__ for s in values})
        block_sizes = sorted({s.block_size for s in values})
        raise GroupingError(
            f"host-resident layers {list(names)} must be of one type with one block size "
            f"to share the host block table, but have kinds {kinds} and block sizes "
            f"{block_sizes}"
        )
    return KVCacheGroupSpec(layer_names=names, kv_cache_spec=uniform_type, host_resident=True)


def create_kv_cache_group_specs(
    specs: Mapping[str, KVCacheSpec], grouped_layer_names: Sequence[Sequence[str]]
) -> list[KVCacheGroupSpec]:
    """One group per name list, with ``type(first).merge`` of its layers' specs as the spec.

    Raises:
        IncompatibleSpecsError: a group's specs do not merge.
        ConflictingWindowError: a group mixes two different windows or chunk sizes.

    """
    groups = []
    for names in grouped_layer_names:
        layer_specs = [specs[name] for name in names]
        merged = type(layer_specs[0]).merge(layer_specs)
        groups.append(KVCacheGroupSpec(layer_names=tuple(names), kv_cache_spec=merged))
    return groups


def _get_kv_cache_groups_uniform_page_size(
    specs: Mapping[str, KVCacheSpec],
) -> list[KVCacheGroupSpec]:
    """Split layers into groups of equal layer counts when every page has one size (SPEC 3.3)."""
    # Bucket by spec equality first: a model repeats a handful of specs, so
    # coalescing then compares distinct specs only, never layers.
    same_spec: dict[KVCacheSpec, list[str]] = {}
    for name, spec in specs.items():
        same_spec.setdefault(spec, []).append(name)

    layer_buckets: list[list[str]] = []
    spec_buckets: list[list[KVCacheSpec]] = []
    for spec, names in same_spec.items():
        for bucket_names, bucket_specs in zip(layer_buckets, spec_buckets, strict=True):
            try:
                type(bucket_specs[0]).merge([*bucket_specs, spec])
            except (IncompatibleSpecsError, ConflictingWindowError):
                continue
            bucket_names.extend(names)
            bucket_specs.append(spec)
            break
        else:
            layer_buckets.append(list(names))
            spec_buckets.append([spec])

    smallest = min(len(b) for b in layer_buckets)
    largest = max(len(b) for b in layer_buckets)
    # M < 1.5 * m in exact integers: a few extra layers (an EAGLE draft next
    # to its target) pad the smaller buckets instead of splitting the larger.
    group_size = largest if 2 * largest < 3 * smallest else smallest

    grouped: list[list[str]] = []
    for names in layer_buckets:
        num_groups = cdiv(len(names), group_size)
        # Strided, not contiguous: each pipeline stage then holds an equal
        # share of every group instead of whole groups and empty ones.
        grouped.extend(names[i::num_groups] for i in range(num_groups))
    return create_kv_cache_group_specs(specs, grouped)
