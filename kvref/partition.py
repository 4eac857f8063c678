"""Core's checks on a builder's groups and on the specs it groups (contract.md#core-checks).

Core runs these around every call to ``get_kv_cache_groups``: in planning
(all workers' specs), in profiling (one worker's specs) and, in the
reference builder, on a model-declared grouping.  They live apart from
:mod:`kvref.planning` so that the builder can use them too.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

import attrs

import kvref.specs as _specs
from kvref.errors import KVRefError, PartitionError, SpecError
from kvref.records import KVCacheGroupSpec
from kvref.specs import KVCacheSpec, UniformTypeKVCacheSpecs
from kvref.versions import SUPPORTED, Rules, VllmVersion, rules

__all__ = [
    "check_exact_partition",
    "check_group_spec_fields",
    "check_spec_fields",
    "check_spec_registry",
    "check_wrapped_layers",
]


def disjoint_group_layers(
    groups: Iterable[object], not_a_group: Callable[[int, object], KVRefError]
) -> Iterator[tuple[int, str]]:
    """Each ``(group index, layer name)`` of ``groups``, in order, checking the groups as it goes.

    Raises:
        KVRefError: ``not_a_group(index, group)`` for a group that is not a
            ``KVCacheGroupSpec`` (each caller words and types its own).
        PartitionError: a layer is in two groups.
    """
    seen: dict[str, int] = {}
    for index, group in enumerate(groups):
        if not isinstance(group, KVCacheGroupSpec):
            raise not_a_group(index, group)
        for name in group.layer_names:
            if name in seen:
                raise PartitionError(
                    f"layer {name!r} is in group {seen[name]} and group {index}; "
                    "each layer belongs to exactly one group"
                )
            seen[name] = index
            yield index, name


def check_exact_partition(
    groups: Sequence[KVCacheGroupSpec], layer_names: Sequence[str] | set[str]
) -> None:
    """Check that ``groups`` hold every name of ``layer_names`` exactly once, and nothing else.

    vLLM checks overlap and missing layers only (``_check_exact_partition``);
    the reference also refuses names that are not among the input layers.

    Raises:
        PartitionError: a group is not a ``KVCacheGroupSpec``, or a layer is
            missing, repeated, or unknown.
    """
    expected = set(layer_names)
    seen: dict[str, int] = {}
    for index, name in disjoint_group_layers(
        groups, lambda i, group: PartitionError(f"group {i} is {group!r}, not a KVCacheGroupSpec")
    ):
        if name not in expected:
            raise PartitionError(f"group {index} names layer {name!r}, which no worker has")
        seen[name] = index
    missing = [n for n in layer_names if n not in seen]
    if missing:
        raise PartitionError(f"groups miss layers {missing[:8]} ({len(missing)} in all)")


def check_layer_spec(where: str, name: object, spec: object) -> None:
    """Check one ``layer name -> spec`` entry of the mapping ``where`` names.

    Raises:
        SpecError: the name is not a str, or the spec is not a per-layer
            ``KVCacheSpec``; the message names ``where``, the name and the spec.
    """
    if not isinstance(name, str):
        raise SpecError(f"{where}: layer name {name!r} (spec {spec!r}) must be a str")
    # A UniformTypeKVCacheSpecs is a group spec, never a layer's own.
    if not isinstance(spec, KVCacheSpec):
        raise SpecError(
            f"{where}: layer {name!r}: {spec!r} is not a per-layer KVCacheSpec "
            f"(got {type(spec).__name__})"
        )


def check_wrapped_layers(groups: Sequence[KVCacheGroupSpec]) -> None:
    """Check that every uniform-type group's wrapper has a spec for each layer it names.

    Raises:
        PartitionError: a group names a layer its ``UniformTypeKVCacheSpecs`` lacks.
    """
    for index, group in enumerate(groups):
        wrapper = group.kv_cache_spec
        if isinstance(wrapper, UniformTypeKVCacheSpecs):
            lacking = [n for n in group.layer_names if n not in wrapper.kv_cache_specs]
            if lacking:
                raise PartitionError(
                    f"group {index}'s UniformTypeKVCacheSpecs has no spec for layers {lacking[:4]}"
                )


def check_spec_registry(specs: Mapping[str, KVCacheSpec]) -> None:
    """Refuse spec classes Core does not plan (vLLM ``check_kv_cache_spec_registry``).

    Raises:
        SpecError: a layer's spec class is not registered for planning.
    """
    for name, spec in specs.items():
        if not type(spec).registered:
            raise SpecError(
                f"unsupported KV cache spec type for layer {name!r}: {type(spec).__name__} is "
                "not registered for planning (vLLM adds such layers after planning)"
            )


@functools.lru_cache(maxsize=len(SUPPORTED))
def _absent_fields(version: VllmVersion) -> tuple[tuple[type[KVCacheSpec], str, VllmVersion], ...]:
    """``(declaring class, field, release that added it)`` for fields ``version`` lacks."""
    have = rules(version).spec_fields
    absent: dict[str, VllmVersion] = {}
    for release in SUPPORTED:
        for name in rules(release).spec_fields - have:
            absent.setdefault(name, release)
    out = []
    for name, release in sorted(absent.items()):
        cls_name, field = name.split(".")
        out.append((getattr(_specs, cls_name), field, release))
    return tuple(out)


def check_spec_fields(specs: Mapping[str, KVCacheSpec], planning_rules: Rules) -> None:
    """Refuse a spec field the release planned as does not have (:attr:`Rules.spec_fields`).

    A field another supported release added may keep its default (the spec
    is then what the older release's would be); any other value has no
    meaning there.  Core runs this on every worker's specs, and the reference
    builder on what it is given.

    Raises:
        SpecError: a layer's spec sets such a field; the message names the
            layer, the field, its value and both releases.
    """
    absent = _absent_fields(planning_rules.version)
    if not absent:
        return
    for name, spec in specs.items():
        for cls, field, release in absent:
            if not isinstance(spec, cls):
                continue
            value = getattr(spec, field)
            default = attrs.fields_dict(type(spec))[field].default
            if value != default:
                raise SpecError(
                    f"layer {name!r}: {type(spec).__name__}.{field}={value!r} is a field of "
                    f"vLLM {release}; vLLM {planning_rules.version} "
                    f"(PlanningConfig.vllm_version) has no such field (leave it at {default!r} "
                    f"or plan as vLLM {release})"
                )


def check_group_spec_fields(groups: Iterable[KVCacheGroupSpec], planning_rules: Rules) -> None:
    """:func:`check_spec_fields` on every layer spec of ``groups`` (and each group's own spec).

    Raises:
        SpecError: as :func:`check_spec_fields`.
    """
    if not _absent_fields(planning_rules.version):
        return
    for group in groups:
        spec = group.kv_cache_spec
        if isinstance(spec, UniformTypeKVCacheSpecs):
            check_spec_fields(spec.kv_cache_specs, planning_rules)
        else:
            names = group.layer_names or ("<group>",)
            check_spec_fields(dict.fromkeys(names, spec), planning_rules)
