"""Builders whose own code the default run never enters: what ``--explore`` is for.

A GLM-5-style platform specialises the IndexCache-style variant, where some
indexed layers keep no indexer of their own and reuse another layer's
top-k: Mamba state layers, the indexers' tail rings and MLA latents present,
fewer indexer key caches than latents; "a role present and another absent",
tested strictly, each condition on its own line as vendors write them.  No
built-in family draws that variant (GLM-5 gives every latent its indexer;
DeepSeek-V3.2 skips indexers but has no Mamba layers nor rings), so the
default run reaches the first conditions and never the specialised
placement.  Exploration keeps the examples that reach further into the gate
(a GLM-5 model passes more of its conditions than any other) and mutates
them; a dropped indexer (``explored: drop-layer``) opens it.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from kvref import KVCacheConfig, KVCacheGroupSpec, PlanningConfig, ReferenceKVCacheConfigBuilder
from kvref.specs import CircularBufferSpec, KVCacheSpec, MambaSpec, MLAAttentionSpec

__all__ = ["IndexCacheShortBacking", "IndexCacheSplitTensors"]


def _layer_specs(groups: Sequence[KVCacheGroupSpec]) -> list[KVCacheSpec]:
    return [g.layer_spec(name) for g in groups for name in g.layer_names]


class _IndexCacheGate(ReferenceKVCacheConfigBuilder):
    """The reference everywhere except the IndexCache-style GLM-5 variant (module docstring)."""

    def _is_index_cached_glm(self, groups: Sequence[KVCacheGroupSpec]) -> bool:
        specs = _layer_specs(groups)
        kinds = {type(s) for s in specs}
        if MambaSpec not in kinds:
            return False
        if CircularBufferSpec not in kinds:
            return False
        mla = [s for s in specs if type(s) is MLAAttentionSpec]
        latents = sum(1 for s in mla if s.cache_role == "SPARSE")
        indexers = sum(1 for s in mla if s.cache_role == "INDEXER")
        if not indexers:
            return False
        return indexers < latents

    def get_kv_cache_config_from_groups(
        self, config: PlanningConfig, kv_cache_groups: Sequence[KVCacheGroupSpec], num_blocks: int
    ) -> KVCacheConfig:
        result = super().get_kv_cache_config_from_groups(config, kv_cache_groups, num_blocks)
        if not self._is_index_cached_glm(kv_cache_groups):
            return result
        return self._specialise(result, num_blocks)

    def _specialise(self, result: KVCacheConfig, num_blocks: int) -> KVCacheConfig:
        raise NotImplementedError


class IndexCacheShortBacking(_IndexCacheGate):
    """Broken: the IndexCache variant's tensors are one block short (``KV-PLACE-BACKING-SIZE``)."""

    def _specialise(self, result: KVCacheConfig, num_blocks: int) -> KVCacheConfig:
        tensors = [
            t if t.host_resident else attrs.evolve(t, size=t.size - t.size // num_blocks)
            for t in result.kv_cache_tensors
        ]
        return attrs.evolve(result, kv_cache_tensors=tensors)


class IndexCacheSplitTensors(_IndexCacheGate):
    """Legal: the IndexCache variant's tensors in reverse order (the same bytes, another list)."""

    def _specialise(self, result: KVCacheConfig, num_blocks: int) -> KVCacheConfig:
        return attrs.evolve(result, kv_cache_tensors=list(result.kv_cache_tensors)[::-1])
