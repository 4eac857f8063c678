"""KV-GROUP-TP-SHARDS: a group spec keeps each layer's TP shard count or drops it.

Core derives ``kv_tp_replicas`` from the group specs; a claimed count the
layer does not record names TP ranks identical that hold different KV.
Judged on hand-made groupings: the reference and a builder that drops the
count pass, one that records MLA's single shard on GQA layers, or another
count on MLA layers, is caught; models without attention are not judged.
"""

from __future__ import annotations

import attrs
import legal_builders
import torch
from broken_builders import ClaimsReplicatedKV
from broken_builders._base import _with_layer_specs

from conformance.check.catalog import Unjudged, by_id
from conformance.check.observations import CallResult, GroupingObservation
from kvref import (
    FullAttentionSpec,
    KVCacheGroupSpec,
    MLAAttentionSpec,
    PlanningConfig,
    ReferenceKVCacheConfigBuilder,
)
from kvref.specs import KVCacheSpec, MambaSpec

ID = "KV-GROUP-TP-SHARDS"
CONFIG = PlanningConfig(max_model_len=1024, tensor_parallel_size=4)
GQA = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=64, dtype=torch.bfloat16)
MLA = MLAAttentionSpec(
    block_size=64, num_kv_heads=1, head_size=576, dtype=torch.bfloat16, max_tp_shards=1
)


def _judge(builder: ReferenceKVCacheConfigBuilder, specs: dict[str, KVCacheSpec]) -> object:
    groups = builder.get_kv_cache_groups(CONFIG, dict(specs))
    ok = CallResult(hook="get_kv_cache_groups", value=groups)
    obs = GroupingObservation(config=CONFIG, specs=specs, first=ok, second=ok, fresh=ok)
    return by_id()[ID].check(obs)


def _model(spec: KVCacheSpec) -> dict[str, KVCacheSpec]:
    return {f"model.layers.{i}.self_attn.attn": spec for i in range(3)}


class _SplitsMLAShards(ReferenceKVCacheConfigBuilder):
    """Records two shards where MLA's latent is one (fewer replicas, yet another count)."""

    def get_kv_cache_groups(
        self, config: PlanningConfig, kv_cache_spec: dict[str, KVCacheSpec]
    ) -> list[KVCacheGroupSpec]:
        groups = super().get_kv_cache_groups(config, kv_cache_spec)
        return [_with_layer_specs(g, lambda s: attrs.evolve(s, max_tp_shards=2)) for g in groups]


def test_kept_and_dropped_counts_pass() -> None:
    """The reference keeps each count; DropsTPShards claims no replication: both hold."""
    for builder in (ReferenceKVCacheConfigBuilder(), legal_builders.DropsTPShards()):
        assert _judge(builder, _model(GQA)) == []
        assert _judge(builder, _model(MLA)) == []


def test_a_claimed_count_the_layer_lacks_is_caught() -> None:
    """MLA's one shard recorded on GQA layers: each layer named, with both counts."""
    found = _judge(ClaimsReplicatedKV(), _model(GQA))
    assert isinstance(found, list) and len(found) == 3
    assert all(v.invariant == ID for v in found)
    assert "max_tp_shards=1 where the layer records None" in found[0].message
    assert _judge(ClaimsReplicatedKV(), _model(MLA)) == []  # MLA's own count: kept


def test_another_count_is_caught() -> None:
    """Any count other than the layer's own is a claim the model does not make."""
    found = _judge(_SplitsMLAShards(), _model(MLA))
    assert isinstance(found, list) and found
    assert "max_tp_shards=2 where the layer records 1" in found[0].message


def test_no_attention_is_not_judged() -> None:
    """A model without attention layers cannot be judged by this clause: N/A, never a pass."""
    mamba = MambaSpec(
        block_size=1024, shapes=((16, 64),), dtypes=(torch.bfloat16,), mamba_type="mamba2"
    )
    outcome = _judge(ReferenceKVCacheConfigBuilder(), {"model.layers.0.mixer": mamba})
    assert isinstance(outcome, Unjudged) and not outcome.applicable
