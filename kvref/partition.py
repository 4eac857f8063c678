"""Core's checks on a builder's groups and on the specs it groups (contract.md#core-checks).

Core runs these around every call to ``get_kv_cache_groups``: in planning
(all workers' specs), in profiling (one worker's specs) and, in the
reference builder, on a model-declared grouping.  They live apart from
:mod:`kvref.planning` so that the builder can use them too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kvref.errors import PartitionError, SpecError
from kvref.records import KVCacheGroupSpec
from kvref.specs import KVCacheSpec, UniformTypeKVCacheSpecs

__all__ = ["check_exact_partition", "check_spec_registry", "check_wrapped_layers"]


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
    for index, group in enumerate(groups):
        if not isinstance(group, KVCacheGroupSpec):
            raise PartitionError(f"group {index} is {group!r}, not a KVCacheGroupSpec")
        for name in group.layer_names:
            if name in seen:
                raise PartitionError(f"layer {name!r} is in group {seen[name]} and group {index}")
            if name not in expected:
                raise PartitionError(f"group {index} names layer {name!r}, which no worker has")
            seen[name] = index
    missing = [n for n in layer_names if n not in seen]
    if missing:
        raise PartitionError(f"groups miss layers {missing[:8]} ({len(missing)} in all)")


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
