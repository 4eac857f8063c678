"""vLLM-native builders whose own code the default run never enters: what ``--explore`` is for.

The vLLM form of ``tests/explore_builders.py``: a GLM-5-style platform that
specialises the variant whose indexer keeps no tail ring (Mamba state
layers, MLA latents and an indexer key cache present, the indexer's tail
ring absent), each condition tested strictly and on its own line, vLLM's
default builder for everything else.  No built-in family draws that variant,
so only exploration (a dropped cache role) opens the gate.
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

__all__ = ["NoTailReorderedNative", "NoTailShortBackingNative"]


class _NoTailGate(DefaultKVCacheConfigBuilder):
    """vLLM's default everywhere except the no-tail GLM-5 variant."""

    def _is_no_tail_glm(self, groups: list[KVCacheGroupSpec]) -> bool:
        specs = [spec for group in groups for _, spec in layer_specs(group)]
        if not any(type(s) is MambaSpec for s in specs):
            return False
        mla = [s for s in specs if type(s) is MLAAttentionSpec]
        if not any(s.cache_role is SparseCacheRole.SPARSE for s in mla):
            return False
        if not any(s.cache_role is SparseCacheRole.INDEXER for s in mla):
            return False
        return not any(type(s) is CircularBufferSpec for s in specs)

    def get_kv_cache_config_from_groups(
        self, vllm_config: VllmConfig, kv_cache_groups: list[KVCacheGroupSpec], num_blocks: int
    ) -> KVCacheConfig:
        result = super().get_kv_cache_config_from_groups(vllm_config, kv_cache_groups, num_blocks)
        if not self._is_no_tail_glm(kv_cache_groups):
            return result
        return self._specialise(result, num_blocks)

    def _specialise(self, result: KVCacheConfig, num_blocks: int) -> KVCacheConfig:
        raise NotImplementedError


class NoTailShortBackingNative(_NoTailGate):
    """Broken: the no-tail variant's tensors are one block short (``KV-PLACE-BACKING-SIZE``)."""

    def _specialise(self, result: KVCacheConfig, num_blocks: int) -> KVCacheConfig:
        tensors = [
            dataclasses.replace(t, size=t.size - t.size // num_blocks)
            for t in result.kv_cache_tensors
        ]
        return dataclasses.replace(result, kv_cache_tensors=tensors)


class NoTailReorderedNative(_NoTailGate):
    """Legal: the no-tail variant's tensors in reverse order (the same bytes, another list)."""

    def _specialise(self, result: KVCacheConfig, num_blocks: int) -> KVCacheConfig:
        return dataclasses.replace(result, kv_cache_tensors=list(result.kv_cache_tensors)[::-1])
