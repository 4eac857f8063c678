"""kvref: a reference implementation of vLLM's KV cache planning (0.33.0 and 0.34.0).

The public API: spec kinds, records, :class:`KVCacheLayout`,
:class:`PlanningConfig` (whose ``vllm_version`` picks the release planned
as), the typed errors, the builder interface and the reference builder,
Core's planning flow (and 0.34.0's extensible KV cache sizing) and on-device
allocation.

Every name is imported on first use (PEP 562): ``import kvref`` costs
milliseconds and never imports torch, which only allocation needs (and a
spec built from a dtype *name*, which must resolve it to a torch dtype).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvref.allocation import (
        KVCacheAllocation,
        allocate_backings,
        allocate_kv_cache,
        resolve_layout,
    )
    from kvref.axes import DEFAULT_LAYOUT_PREFERENCE, HOST_LAYOUT, KVCacheLayout
    from kvref.builder import KVCacheConfigBuilder, ReferenceKVCacheConfigBuilder
    from kvref.config import HiSparseConfig, PlanningConfig, SupportsKVCacheGrouping
    from kvref.errors import (
        ConfigError,
        ConflictingWindowError,
        GroupingError,
        HiSparseError,
        IncompatibleSpecsError,
        InsufficientMemoryError,
        KVRefError,
        LayoutError,
        PageSizeUnificationError,
        PartitionError,
        PlacementError,
        PlanningError,
        SpecError,
        UnsupportedError,
        WorkerSpecMismatchError,
    )
    from kvref.extensible import (
        FinalizedKVCache,
        finalize_extensible_kv_cache,
        shrink_kv_cache_configs,
    )
    from kvref.extra_specs import HiddenStateCacheSpec, HiSparseHotSpec, HiSparseResidentSpec
    from kvref.hisparse import resolve_hisparse_specs
    from kvref.layout import compute_layer_kv_cache_shape_bytes, compute_layout_strides
    from kvref.placement import get_kv_cache_config_from_groups
    from kvref.planning import (
        KVCachePlan,
        WorkerPlan,
        get_global_kv_cache_groups,
        get_kv_cache_configs,
        plan_kv_cache,
        project_kv_cache_groups_to_worker,
    )
    from kvref.profiling import ProfilingPlan, plan_profiling_kv_cache, profiling_num_blocks
    from kvref.records import KVCacheConfig, KVCacheGroupSpec, KVCacheTensor
    from kvref.resolution import (
        BuilderResolutionError,
        get_kv_cache_config_builder,
        get_kv_cache_config_builder_cls,
    )
    from kvref.specs import (
        AttentionSpec,
        ChunkedLocalAttentionSpec,
        CircularBufferSpec,
        CrossAttentionSpec,
        EncoderOnlyAttentionSpec,
        FullAttentionSpec,
        KVCacheSpec,
        MambaSpec,
        MemoryInputs,
        MLAAttentionSpec,
        MultipleOf,
        RSWASpec,
        SinkFullAttentionSpec,
        SlidingWindowMLASpec,
        SlidingWindowSpec,
        UniformTypeKVCacheSpecs,
    )

__version__ = "0.1.0"

#: The public names, by home module.  tests/test_imports.py checks that this map,
#: ``__all__`` and the ``TYPE_CHECKING`` imports above name the same things.
_HOMES: dict[str, tuple[str, ...]] = {
    "kvref.allocation": (
        "KVCacheAllocation",
        "allocate_backings",
        "allocate_kv_cache",
        "resolve_layout",
    ),
    "kvref.axes": (
        "DEFAULT_LAYOUT_PREFERENCE",
        "HOST_LAYOUT",
        "KVCacheLayout",
    ),
    "kvref.builder": (
        "KVCacheConfigBuilder",
        "ReferenceKVCacheConfigBuilder",
    ),
    "kvref.config": ("HiSparseConfig", "PlanningConfig", "SupportsKVCacheGrouping"),
    "kvref.errors": (
        "ConfigError",
        "ConflictingWindowError",
        "GroupingError",
        "HiSparseError",
        "IncompatibleSpecsError",
        "InsufficientMemoryError",
        "KVRefError",
        "LayoutError",
        "PageSizeUnificationError",
        "PartitionError",
        "PlacementError",
        "PlanningError",
        "SpecError",
        "UnsupportedError",
        "WorkerSpecMismatchError",
    ),
    "kvref.extensible": (
        "FinalizedKVCache",
        "finalize_extensible_kv_cache",
        "shrink_kv_cache_configs",
    ),
    "kvref.extra_specs": (
        "HiSparseHotSpec",
        "HiSparseResidentSpec",
        "HiddenStateCacheSpec",
    ),
    "kvref.hisparse": ("resolve_hisparse_specs",),
    "kvref.layout": (
        "compute_layer_kv_cache_shape_bytes",
        "compute_layout_strides",
    ),
    "kvref.placement": ("get_kv_cache_config_from_groups",),
    "kvref.planning": (
        "KVCachePlan",
        "WorkerPlan",
        "get_global_kv_cache_groups",
        "get_kv_cache_configs",
        "plan_kv_cache",
        "project_kv_cache_groups_to_worker",
    ),
    "kvref.profiling": (
        "ProfilingPlan",
        "plan_profiling_kv_cache",
        "profiling_num_blocks",
    ),
    "kvref.records": (
        "KVCacheConfig",
        "KVCacheGroupSpec",
        "KVCacheTensor",
    ),
    "kvref.resolution": (
        "BuilderResolutionError",
        "get_kv_cache_config_builder",
        "get_kv_cache_config_builder_cls",
    ),
    "kvref.specs": (
        "AttentionSpec",
        "ChunkedLocalAttentionSpec",
        "CircularBufferSpec",
        "CrossAttentionSpec",
        "EncoderOnlyAttentionSpec",
        "FullAttentionSpec",
        "KVCacheSpec",
        "MambaSpec",
        "MemoryInputs",
        "MLAAttentionSpec",
        "MultipleOf",
        "RSWASpec",
        "SinkFullAttentionSpec",
        "SlidingWindowMLASpec",
        "SlidingWindowSpec",
        "UniformTypeKVCacheSpecs",
    ),
}
_HOME_OF = {name: module for module, names in _HOMES.items() for name in names}

__all__ = [
    "AttentionSpec",
    "BuilderResolutionError",
    "ChunkedLocalAttentionSpec",
    "CircularBufferSpec",
    "ConfigError",
    "ConflictingWindowError",
    "CrossAttentionSpec",
    "DEFAULT_LAYOUT_PREFERENCE",
    "EncoderOnlyAttentionSpec",
    "FinalizedKVCache",
    "FullAttentionSpec",
    "GroupingError",
    "HOST_LAYOUT",
    "HiSparseConfig",
    "HiSparseError",
    "HiSparseHotSpec",
    "HiSparseResidentSpec",
    "HiddenStateCacheSpec",
    "IncompatibleSpecsError",
    "InsufficientMemoryError",
    "KVCacheAllocation",
    "KVCacheConfig",
    "KVCacheConfigBuilder",
    "KVCacheGroupSpec",
    "KVCacheLayout",
    "KVCachePlan",
    "KVCacheSpec",
    "KVCacheTensor",
    "KVRefError",
    "LayoutError",
    "MLAAttentionSpec",
    "MambaSpec",
    "MemoryInputs",
    "MultipleOf",
    "PageSizeUnificationError",
    "PartitionError",
    "PlacementError",
    "PlanningConfig",
    "PlanningError",
    "ProfilingPlan",
    "RSWASpec",
    "ReferenceKVCacheConfigBuilder",
    "SinkFullAttentionSpec",
    "SlidingWindowMLASpec",
    "SlidingWindowSpec",
    "SpecError",
    "SupportsKVCacheGrouping",
    "UniformTypeKVCacheSpecs",
    "UnsupportedError",
    "WorkerPlan",
    "WorkerSpecMismatchError",
    "allocate_backings",
    "allocate_kv_cache",
    "compute_layer_kv_cache_shape_bytes",
    "compute_layout_strides",
    "finalize_extensible_kv_cache",
    "get_global_kv_cache_groups",
    "get_kv_cache_config_builder",
    "get_kv_cache_config_builder_cls",
    "get_kv_cache_config_from_groups",
    "get_kv_cache_configs",
    "plan_kv_cache",
    "plan_profiling_kv_cache",
    "profiling_num_blocks",
    "project_kv_cache_groups_to_worker",
    "resolve_hisparse_specs",
    "resolve_layout",
    "shrink_kv_cache_configs",
    "__version__",
]


def __getattr__(name: str) -> Any:
    home = _HOME_OF.get(name)
    if home is None:
        raise AttributeError(f"module 'kvref' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    # Later lookups find the name here and skip this hook.
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOME_OF})
