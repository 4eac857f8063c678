"""vLLM-native builders whose own code the default run never enters: what ``--explore`` is for.

The vLLM form of ``tests/explore_builders.py``: a GLM-5-style platform that
specialises the IndexCache-style variant (Mamba state layers, the indexers'
tail rings and MLA latents present, fewer indexer key caches than latents),
each condition tested strictly and on its own line, vLLM's default builder
for everything else.  No built-in family draws that variant, so only
exploration (a dropped indexer) opens the gate.
"""

from __future__ import annotations

import dataclasses

from vllm.config import VllmConfig
from vllm.v1.core.kv_cache_planning import DefaultKVCacheConfigBuilder
from vllm.v1.kv_cache_interface import (
    CircularBufferSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
    MLAAttentionSpec,
    SparseCacheRole,
)

from tests.vllm.native_builders._common import layer_specs

__all__ = ["IndexCacheReorderedNative", "IndexCacheShortBackingNative"]


class _IndexCacheGate(DefaultKVCacheConfigBuilder):
    """vLLM's default everywhere except the IndexCache-style GLM-5 variant."""

    def _is_index_cached_glm(self, groups: list[KVCacheGroupSpec]) -> bool:
        specs = [spec for group in groups for _, spec in layer_specs(group)]
        if not any(type(s) is MambaSpec for s in specs):
            return False
        if not any(type(s) is CircularBufferSpec for s in specs):
            return False
        mla = [s for s in specs if type(s) is MLAAttentionSpec]
        latents = sum(1 for s in mla if s.cache_role is SparseCacheRole.SPARSE)
        indexers = sum(1 for s in mla if s.cache_role is SparseCacheRole.INDEXER)
        if not indexers:
            return False
        return indexers < latents

    def get_kv_cache_config_from_groups(
        self, vllm_config: VllmConfig, kv_cache_groups: list[KVCacheGroupSpec], num_blocks: int
    ) -> KVCacheConfig:
        result = super().get_kv_cache_config_from_groups(vllm_config, kv_cache_groups, num_blocks)
        if not self._is_index_cached_glm(kv_cache_groups):
            return result
        return self._specialise(result, num_blocks)

    def _specialise(self, result: KVCacheConfig, num_blocks: int) -> KVCacheConfig:
        raise NotImplementedError


class IndexCacheShortBackingNative(_IndexCacheGate):
    """Broken: the IndexCache variant's tensors are one block short (``KV-PLACE-BACKING-SIZE``)."""

    def _specialise(self, result: KVCacheConfig, num_blocks: int) -> KVCacheConfig:
        tensors = [
            dataclasses.replace(t, size=t.size - t.size // num_blocks)
            for t in result.kv_cache_tensors
        ]
        return dataclasses.replace(result, kv_cache_tensors=tensors)


class IndexCacheReorderedNative(_IndexCacheGate):
    """Legal: the IndexCache variant's tensors in reverse order (the same bytes, another list)."""

    def _specialise(self, result: KVCacheConfig, num_blocks: int) -> KVCacheConfig:
        return dataclasses.replace(result, kv_cache_tensors=list(result.kv_cache_tensors)[::-1])
