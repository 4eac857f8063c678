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
    # For type checkers only: the same names as _HOMES below, each re-exported
    # (``X as X``) since __all__ is built at run time.
    from kvref.allocation import KVCacheAllocation as KVCacheAllocation
    from kvref.allocation import allocate_backings as allocate_backings
    from kvref.allocation import allocate_kv_cache as allocate_kv_cache
    from kvref.allocation import resolve_layout as resolve_layout
    from kvref.axes import DEFAULT_LAYOUT_PREFERENCE as DEFAULT_LAYOUT_PREFERENCE
    from kvref.axes import HOST_LAYOUT as HOST_LAYOUT
    from kvref.axes import KVCacheLayout as KVCacheLayout
    from kvref.builder import KVCacheConfigBuilder as KVCacheConfigBuilder
    from kvref.builder import ReferenceKVCacheConfigBuilder as ReferenceKVCacheConfigBuilder
    from kvref.config import HiSparseConfig as HiSparseConfig
    from kvref.config import PlanningConfig as PlanningConfig
    from kvref.config import SupportsKVCacheGrouping as SupportsKVCacheGrouping
    from kvref.errors import ConfigError as ConfigError
    from kvref.errors import ConflictingWindowError as ConflictingWindowError
    from kvref.errors import GroupingError as GroupingError
    from kvref.errors import HiSparseError as HiSparseError
    from kvref.errors import IncompatibleSpecsError as IncompatibleSpecsError
    from kvref.errors import InsufficientMemoryError as InsufficientMemoryError
    from kvref.errors import KVRefError as KVRefError
    from kvref.errors import LayoutError as LayoutError
    from kvref.errors import PageSizeUnificationError as PageSizeUnificationError
    from kvref.errors import PartitionError as PartitionError
    from kvref.errors import PlacementError as PlacementError
    from kvref.errors import PlanningError as PlanningError
    from kvref.errors import SpecError as SpecError
    from kvref.errors import UnsupportedError as UnsupportedError
    from kvref.errors import WorkerSpecMismatchError as WorkerSpecMismatchError
    from kvref.extensible import FinalizedKVCache as FinalizedKVCache
    from kvref.extensible import finalize_extensible_kv_cache as finalize_extensible_kv_cache
    from kvref.extensible import shrink_kv_cache_configs as shrink_kv_cache_configs
    from kvref.extra_specs import HiddenStateCacheSpec as HiddenStateCacheSpec
    from kvref.extra_specs import HiSparseHotSpec as HiSparseHotSpec
    from kvref.extra_specs import HiSparseResidentSpec as HiSparseResidentSpec
    from kvref.hisparse import resolve_hisparse_specs as resolve_hisparse_specs
    from kvref.layout import (
        compute_layer_kv_cache_shape_bytes as compute_layer_kv_cache_shape_bytes,
    )
    from kvref.layout import compute_layout_strides as compute_layout_strides
    from kvref.placement import get_kv_cache_config_from_groups as get_kv_cache_config_from_groups
    from kvref.planning import KVCachePlan as KVCachePlan
    from kvref.planning import WorkerPlan as WorkerPlan
    from kvref.planning import get_global_kv_cache_groups as get_global_kv_cache_groups
    from kvref.planning import get_kv_cache_configs as get_kv_cache_configs
    from kvref.planning import plan_kv_cache as plan_kv_cache
    from kvref.planning import (
        project_kv_cache_groups_to_worker as project_kv_cache_groups_to_worker,
    )
    from kvref.profiling import ProfilingPlan as ProfilingPlan
    from kvref.profiling import plan_profiling_kv_cache as plan_profiling_kv_cache
    from kvref.profiling import profiling_num_blocks as profiling_num_blocks
    from kvref.records import KVCacheConfig as KVCacheConfig
    from kvref.records import KVCacheGroupSpec as KVCacheGroupSpec
    from kvref.records import KVCacheTensor as KVCacheTensor
    from kvref.resolution import BuilderResolutionError as BuilderResolutionError
    from kvref.resolution import get_kv_cache_config_builder as get_kv_cache_config_builder
    from kvref.resolution import get_kv_cache_config_builder_cls as get_kv_cache_config_builder_cls
    from kvref.specs import AttentionSpec as AttentionSpec
    from kvref.specs import ChunkedLocalAttentionSpec as ChunkedLocalAttentionSpec
    from kvref.specs import CircularBufferSpec as CircularBufferSpec
    from kvref.specs import CrossAttentionSpec as CrossAttentionSpec
    from kvref.specs import EncoderOnlyAttentionSpec as EncoderOnlyAttentionSpec
    from kvref.specs import FullAttentionSpec as FullAttentionSpec
    from kvref.specs import KVCacheSpec as KVCacheSpec
    from kvref.specs import MambaSpec as MambaSpec
    from kvref.specs import MemoryInputs as MemoryInputs
    from kvref.specs import MLAAttentionSpec as MLAAttentionSpec
    from kvref.specs import MultipleOf as MultipleOf
    from kvref.specs import RSWASpec as RSWASpec
    from kvref.specs import SinkFullAttentionSpec as SinkFullAttentionSpec
    from kvref.specs import SlidingWindowMLASpec as SlidingWindowMLASpec
    from kvref.specs import SlidingWindowSpec as SlidingWindowSpec
    from kvref.specs import UniformTypeKVCacheSpecs as UniformTypeKVCacheSpecs

__version__ = "0.1.0"

#: The public names, by home module: the one list that ``__all__`` and the lazy
#: ``__getattr__`` are made from.  tests/test_imports.py checks that the
#: ``TYPE_CHECKING`` imports above name the same things.
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

if len(_HOME_OF) != sum(len(names) for names in _HOMES.values()):
    # Cheap enough for every import; whether each home defines its names is
    # tests/test_imports.py's to check (importing them all would load torch).
    raise ImportError("kvref: a public name is listed under two modules in _HOMES")

__all__ = [*_HOME_OF, "__version__"]  # noqa: PLE0604 - _HOMES holds only strings


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
