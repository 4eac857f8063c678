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
from vllm.v1.kv_cache_interface import (
    AttentionSpec,
    KVCacheSpec,
)

from tests.vllm.native_builders._common import Groups, PlainEngineGroups, Specs, with_layer_specs

__all__ = ["ClaimsReplicatedKVBuilder", "DropsTPShardsBuilder"]


class _ShardsBuilder(PlainEngineGroups):
    """vLLM's groups; on the platform's layouts, every attention spec records ``SHARDS``."""

    SHARDS: int | None

    def regroup(self, vllm_config: VllmConfig, kv_cache_spec: Specs, groups: Groups) -> Groups:
        """vLLM's groups, with the shard count rewritten."""
        return [with_layer_specs(g, self._with_shards) for g in groups]

    def _with_shards(self, spec: KVCacheSpec) -> KVCacheSpec:
        if not isinstance(spec, AttentionSpec) or spec.max_tp_shards == self.SHARDS:
            return spec
        return dataclasses.replace(spec, max_tp_shards=self.SHARDS)


class ClaimsReplicatedKVBuilder(_ShardsBuilder):
    """vLLM's groups, every attention group spec recording one TP shard (MLA's count)."""

    SHARDS = 1


class DropsTPShardsBuilder(_ShardsBuilder):
    """vLLM's groups, every attention group spec without a shard count."""

    SHARDS = None
