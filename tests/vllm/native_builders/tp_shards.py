"""vLLM-native builders at the TP-shards clause (KV-GROUP-TP-SHARDS).

vLLM's Core derives ``kv_tp_replicas`` (consecutive TP ranks holding
identical KV, which KV connectors trust) from the group specs' ``max_tp_shards``.

- :class:`ClaimsReplicatedKVBuilder` (broken, meant ``KV-GROUP-TP-SHARDS``):
  a platform that copies MLA's spec fields onto its own attention groups
  records ``max_tp_shards=1`` for every attention layer, so Core would call
  TP ranks holding different heads identical.
- :class:`DropsTPShardsBuilder` (legal): a platform whose spec constructors
  predate the field drops it; Core then claims no replication, which costs a
  connector memory and stays correct.

Both act only where the platform's layouts apply (:func:`plain_engine`) and
keep vLLM's groups and placement otherwise.
"""

from __future__ import annotations

import dataclasses

from vllm.config import VllmConfig
from vllm.v1.core.kv_cache_planning import DefaultKVCacheConfigBuilder
from vllm.v1.kv_cache_interface import (
    AttentionSpec,
    KVCacheGroupSpec,
    KVCacheSpec,
    UniformTypeKVCacheSpecs,
)

from tests.vllm.native_builders._common import plain_engine

__all__ = ["ClaimsReplicatedKVBuilder", "DropsTPShardsBuilder"]


def _with_shards(group: KVCacheGroupSpec, shards: int | None) -> KVCacheGroupSpec:
    def change(spec: KVCacheSpec) -> KVCacheSpec:
        if not isinstance(spec, AttentionSpec) or spec.max_tp_shards == shards:
            return spec
        return dataclasses.replace(spec, max_tp_shards=shards)

    spec = group.kv_cache_spec
    if isinstance(spec, UniformTypeKVCacheSpecs):
        inner = {name: change(s) for name, s in spec.kv_cache_specs.items()}
        wrapper = dataclasses.replace(spec, kv_cache_specs=inner)
        return dataclasses.replace(group, kv_cache_spec=wrapper)
    return dataclasses.replace(group, kv_cache_spec=change(spec))


class ClaimsReplicatedKVBuilder(DefaultKVCacheConfigBuilder):
    """vLLM's groups, every attention group spec recording one TP shard."""

    def get_kv_cache_groups(
        self, vllm_config: VllmConfig, kv_cache_spec: dict[str, KVCacheSpec]
    ) -> list[KVCacheGroupSpec]:
        """vLLM's grouping; on the platform's layouts, MLA's shard count on every spec."""
        groups = super().get_kv_cache_groups(vllm_config, kv_cache_spec)
        if not plain_engine(vllm_config):
            return groups
        return [_with_shards(g, 1) for g in groups]


class DropsTPShardsBuilder(DefaultKVCacheConfigBuilder):
    """vLLM's groups, every attention group spec without a shard count."""

    def get_kv_cache_groups(
        self, vllm_config: VllmConfig, kv_cache_spec: dict[str, KVCacheSpec]
    ) -> list[KVCacheGroupSpec]:
        """vLLM's grouping; on the platform's layouts, the shard count dropped."""
        groups = super().get_kv_cache_groups(vllm_config, kv_cache_spec)
        if not plain_engine(vllm_config):
            return groups
        return [_with_shards(g, None) for g in groups]
