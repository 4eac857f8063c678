"""kvref: a reference implementation of vLLM 0.33.0's KV cache planning.

The public API: spec kinds, records, :class:`KVCacheLayout`,
:class:`PlanningConfig`, the builder interface and the reference builder,
Core's planning flow and on-device allocation.
"""

from kvref.allocation import KVCacheAllocation, allocate_kv_cache
from kvref.builder import KVCacheConfigBuilder, ReferenceKVCacheConfigBuilder
from kvref.config import PlanningConfig
from kvref.errors import (
    ConfigError,
    ConflictingWindowError,
    GroupingError,
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
from kvref.layout import KVCacheLayout, compute_layer_kv_cache_shape_bytes, compute_layout_strides
from kvref.planning import (
    KVCachePlan,
    WorkerPlan,
    get_global_kv_cache_groups,
    get_kv_cache_configs,
    plan_kv_cache,
)
from kvref.records import KVCacheConfig, KVCacheGroupSpec, KVCacheTensor
from kvref.specs import (
    AttentionSpec,
    ChunkedLocalAttentionSpec,
    CircularBufferSpec,
    CrossAttentionSpec,
    EncoderOnlyAttentionSpec,
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    MultipleOf,
    RSWASpec,
    SinkFullAttentionSpec,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
    UniformTypeKVCacheSpecs,
)

__version__ = "0.1.0"

__all__ = [
    "AttentionSpec",
    "ChunkedLocalAttentionSpec",
    "CircularBufferSpec",
    "ConfigError",
    "ConflictingWindowError",
    "CrossAttentionSpec",
    "EncoderOnlyAttentionSpec",
    "FullAttentionSpec",
    "GroupingError",
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
    "MultipleOf",
    "PageSizeUnificationError",
    "PartitionError",
    "PlacementError",
    "PlanningConfig",
    "PlanningError",
    "RSWASpec",
    "ReferenceKVCacheConfigBuilder",
    "SinkFullAttentionSpec",
    "SlidingWindowMLASpec",
    "SlidingWindowSpec",
    "SpecError",
    "UniformTypeKVCacheSpecs",
    "UnsupportedError",
    "WorkerPlan",
    "WorkerSpecMismatchError",
    "allocate_kv_cache",
    "compute_layer_kv_cache_shape_bytes",
    "compute_layout_strides",
    "get_global_kv_cache_groups",
    "get_kv_cache_configs",
    "plan_kv_cache",
    "__version__",
]
