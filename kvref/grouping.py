"""Default grouping: split layers into KV cache groups.

See contract.md#default-grouping (vLLM ``get_kv_cache_groups``).

The decision order is contract.md#default-grouping's.  Promotion and page-size unification live in
:mod:`kvref.unification`, packed grouping in :mod:`kvref.packing`.

Differences from vLLM (both releases), on purpose:
- the caller's mapping is never mutated (vLLM unifies specs in place);
- layers named in ``PlanningConfig.host_resident_layers`` form their own
  host-resident group, after the device groups (vLLM only does this for HiSparse);
- every failure is a typed :class:`~kvref.errors.KVRefError` (where vLLM
  would crash on hidden-state layers with nothing to align to, kvref raises
  :class:`~kvref.errors.GroupingError`).

With HiSparse on and MLA layers present, :mod:`kvref.hisparse` groups the
model (contract.md#hisparse).  Hidden-state layers
(:class:`~kvref.extra_specs.HiddenStateCacheSpec`) get
groups of their own after the others', aligned to the others' common page
(contract.md#hidden-state-alignment).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

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
from kvref.extra_specs import HiddenStateCacheSpec
from kvref.hisparse import get_hisparse_kv_cache_groups
from kvref.packing import get_packed_kv_cache_groups
from kvref.partition import check_layer_spec, check_spec_fields
from kvref.records import KVCacheGroupSpec
from kvref.specs import KVCacheSpec, UniformTypeKVCacheSpecs
from kvref.unification import (
    is_kv_cache_spec_uniform,
    try_get_full_allocation_fallback_groups,
    unify_hybrid_kv_cache_specs,
    unify_kv_cache_spec_page_size,
)
from kvref.versions import Rules

__all__ = ["create_kv_cache_group_specs", "get_kv_cache_groups"]


def get_kv_cache_groups(
    config: PlanningConfig, kv_cache_spec: Mapping[str, KVCacheSpec]
) -> list[KVCacheGroupSpec]:
    """Split layers into KV cache groups; ``kv_cache_spec`` is not mutated.

    See contract.md#default-grouping.

    Args:
        config: the planning config (hybrid manager flag, layout, host layers).
        kv_cache_spec: layer name to per-layer spec, in layer order.

    Returns:
        The device groups, then one host-resident group if any layer is host-resident.

    Raises:
        SpecError: a key is not a str or a value is not a per-layer spec, or a spec
            sets a field ``config.vllm_version`` does not have.
        ConfigError: ``config.host_resident_layers`` names a layer not in the input.
        ConflictingWindowError: full-attention layers with two different windows
            would share the single uniform group (vLLM's ``ValueError``).
        GroupingError: the layers cannot be grouped (promotion, page unification,
            packing or host-resident layers of several types); the message says why.

    """
    specs = _validated(kv_cache_spec)
    check_spec_fields(specs, config.rules)
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
        groups.append(_host_resident_group(host, config.rules))
    return groups


def _validated(kv_cache_spec: Mapping[str, KVCacheSpec]) -> dict[str, KVCacheSpec]:
    if not isinstance(kv_cache_spec, Mapping):
        raise SpecError(
            f"kv_cache_spec={kv_cache_spec!r} must be a mapping of layer name to KVCacheSpec"
        )
    specs: dict[str, KVCacheSpec] = {}
    for name, spec in kv_cache_spec.items():
        check_layer_spec("kv_cache_spec", name, spec)
        specs[name] = spec
    return specs


def _get_device_kv_cache_groups(
    config: PlanningConfig, specs: dict[str, KVCacheSpec]
) -> list[KVCacheGroupSpec]:
    rules = config.rules
    if config.disable_hybrid_kv_cache_manager:
        specs = unify_hybrid_kv_cache_specs(specs, rules)
    if not specs:
        # Attention-free: Core gives such models one null block and no tensors.
        return []
    hisparse = get_hisparse_kv_cache_groups(config, specs, _get_device_kv_cache_groups)
    if hisparse is not None:
        return hisparse

    values = list(specs.values())
    if is_kv_cache_spec_uniform(values, rules):
        return create_kv_cache_group_specs(specs, [list(specs)], rules)
    uniform_type = UniformTypeKVCacheSpecs.from_specs(specs)
    if uniform_type is not None:
        return [KVCacheGroupSpec(layer_names=tuple(specs), kv_cache_spec=uniform_type)]
    return _get_mixed_kv_cache_groups(config, specs)


def _get_mixed_kv_cache_groups(
    config: PlanningConfig, specs: dict[str, KVCacheSpec]
) -> list[KVCacheGroupSpec]:
    """Layers of several types: packed, or unified to one page (contract.md#default-grouping)."""
    # Hidden-state layers keep their own block tables: set them apart so no
    # compatible attention bucket absorbs them.
    hidden = {n: s for n, s in specs.items() if isinstance(s, HiddenStateCacheSpec)}
    rest = {n: s for n, s in specs.items() if n not in hidden}
    if not rest:
        raise GroupingError(
            f"hidden-state layers {list(hidden)[:6]} are not of one type with one block size, "
            "and there are no other KV cache layers to align their pages to"
        )

    packed = get_packed_kv_cache_groups(config, rest)
    if packed is not None:
        # Block-outermost blocks are strided by the widest group: no alignment needed.
        return packed + [
            KVCacheGroupSpec(layer_names=(name,), kv_cache_spec=spec)
            for name, spec in hidden.items()
        ]

    try:
        unified = unify_kv_cache_spec_page_size(rest)
    except PageSizeUnificationError:
        fallback = try_get_full_allocation_fallback_groups(specs, config.rules)
        if fallback is None:
            raise
        return fallback
    groups = _get_kv_cache_groups_uniform_page_size(unified, config.rules)
    if hidden:
        groups = _align_hidden_state_groups(groups, hidden)
    return groups


def _largest_divisor_at_most(value: int, limit: int) -> int:
    for candidate in range(min(value, limit), 0, -1):
        if value % candidate == 0:
            return candidate
    return 1


def _align_hidden_state_groups(
    groups: list[KVCacheGroupSpec], hidden: Mapping[str, HiddenStateCacheSpec]
) -> list[KVCacheGroupSpec]:
    """Append one group per hidden-state layer, its page padded to the common page.

    If a hidden-state token outgrows the common page (TP can shrink the
    others' pages), every group's block size (and padded page) is first
    scaled by ``s = cdiv(t_max, common)``.  Each hidden-state layer then
    takes the largest block size dividing the groups' gcd block size whose
    tokens fit the common page (contract.md#hidden-state-alignment).

    Raises:
        GroupingError: a hidden-state page cannot be padded to the common page.
    """
    common = groups[0].kv_cache_spec.page_size_bytes
    widest = max(spec.bytes_per_token for spec in hidden.values())
    if widest > common:
        scale = cdiv(widest, common)
        common *= scale
        groups = [_scale_group(g, scale) for g in groups]
    group_block_size = math.gcd(*(g.kv_cache_spec.block_size for g in groups))
    for name, spec in hidden.items():
        fits = max(common // spec.bytes_per_token, 1)
        block_size = _largest_divisor_at_most(group_block_size, fits)
        try:
            aligned = attrs.evolve(spec, block_size=block_size, page_size_padded=common)
        except SpecError as exc:
            raise GroupingError(
                f"hidden-state layer {name!r}: a block of {block_size} tokens does not fit "
                f"the common page of {common} bytes ({exc})"
            ) from exc
        groups.append(KVCacheGroupSpec(layer_names=(name,), kv_cache_spec=aligned))
    return groups


def _scale_group(group: KVCacheGroupSpec, scale: int) -> KVCacheGroupSpec:
    # Uniform-page groups carry merged per-layer specs, never wrappers.
    spec = group.kv_cache_spec
    assert isinstance(spec, KVCacheSpec)
    changes: dict[str, Any] = {"block_size": spec.block_size * scale}
    padded = spec.padded_page_size
    if padded is not None:
        changes["page_size_padded"] = padded * scale
    return attrs.evolve(group, kv_cache_spec=attrs.evolve(spec, **changes))


def _host_resident_group(host: dict[str, KVCacheSpec], rules: Rules) -> KVCacheGroupSpec:
    # Host layers share the host pool's block table, so they must form a
    # single group: only the uniform and uniform-type rules can give one.
    names = tuple(host)
    values = list(host.values())
    if is_kv_cache_spec_uniform(values, rules):
        spec = type(values[0]).merge(values, rules)
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
    specs: Mapping[str, KVCacheSpec],
    grouped_layer_names: Sequence[Sequence[str]],
    rules: Rules | None = None,
) -> list[KVCacheGroupSpec]:
    """One group per name list, with ``type(first).merge`` of its layers' specs as the spec.

    ``rules``: the release's merge rules (``None``: the newest).

    Raises:
        IncompatibleSpecsError: a group's specs do not merge.
        ConflictingWindowError: a group mixes two different windows or chunk sizes.

    """
    groups = []
    for names in grouped_layer_names:
        layer_specs = [specs[name] for name in names]
        merged = type(layer_specs[0]).merge(layer_specs, rules)
        groups.append(KVCacheGroupSpec(layer_names=tuple(names), kv_cache_spec=merged))
    return groups


def _get_kv_cache_groups_uniform_page_size(
    specs: Mapping[str, KVCacheSpec], rules: Rules
) -> list[KVCacheGroupSpec]:
    """Split layers into groups of equal layer counts when every page has one size.

    See contract.md#uniform-page-grouping.  Specs that do not merge (under
    ``rules``) stay in separate buckets, so form separate groups.
    """
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
                type(bucket_specs[0]).merge([*bucket_specs, spec], rules)
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
    return create_kv_cache_group_specs(specs, grouped, rules)
