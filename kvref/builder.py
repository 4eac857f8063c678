"""The builder interface (SPEC 2) and the reference builder.

``KVCacheConfigBuilder`` mirrors vLLM 0.33.0's experimental interface with
:class:`~kvref.config.PlanningConfig` in place of ``VllmConfig``.  Core (see
:mod:`kvref.planning`) creates a fresh builder for every phase, so builders
must be stateless and deterministic.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence

from kvref.config import PlanningConfig
from kvref.grouping import get_kv_cache_groups
from kvref.placement import get_kv_cache_config_from_groups
from kvref.records import KVCacheConfig, KVCacheGroupSpec
from kvref.specs import KVCacheSpec

__all__ = ["KVCacheConfigBuilder", "ReferenceKVCacheConfigBuilder"]


class KVCacheConfigBuilder(ABC):
    """Splits layers into KV cache groups and places them for an exact block count.

    Contract (SPEC 2): groups partition the input layers; placement returns
    exactly ``num_blocks`` blocks with one device backing of
    ``bytes_per_block * num_blocks`` bytes, memory-safe pages, and the groups
    echoed unchanged; both hooks are pure functions of their arguments.
    """

    @abstractmethod
    def get_kv_cache_groups(
        self, config: PlanningConfig, kv_cache_spec: Mapping[str, KVCacheSpec]
    ) -> list[KVCacheGroupSpec]:
        """Split ``kv_cache_spec`` (layer name to spec) into groups."""

    @abstractmethod
    def get_kv_cache_config_from_groups(
        self,
        config: PlanningConfig,
        kv_cache_groups: Sequence[KVCacheGroupSpec],
        num_blocks: int,
    ) -> KVCacheConfig:
        """Place ``kv_cache_groups`` into tensors for exactly ``num_blocks`` blocks."""

    def _get_pool_bytes_per_block(
        self, config: PlanningConfig, kv_cache_groups: Sequence[KVCacheGroupSpec]
    ) -> int | None:
        """Device bytes one block ID takes across all allocations; ``None``: Core probes."""
        return None


class ReferenceKVCacheConfigBuilder(KVCacheConfigBuilder):
    """vLLM 0.33.0's default grouping and placement, with DESIGN.md's deliberate fixes.

    Usable as a platform's fallback builder.  It never reads
    ``num_gpu_blocks_override``: placement returns exactly the blocks asked for.
    """

    def get_kv_cache_groups(
        self, config: PlanningConfig, kv_cache_spec: Mapping[str, KVCacheSpec]
    ) -> list[KVCacheGroupSpec]:
        """Default grouping (SPEC 3); the caller's mapping is not mutated."""
        return get_kv_cache_groups(config, kv_cache_spec)

    def get_kv_cache_config_from_groups(
        self,
        config: PlanningConfig,
        kv_cache_groups: Sequence[KVCacheGroupSpec],
        num_blocks: int,
    ) -> KVCacheConfig:
        """Default placement (SPEC 4) for exactly ``num_blocks`` blocks."""
        return get_kv_cache_config_from_groups(config, kv_cache_groups, num_blocks)
