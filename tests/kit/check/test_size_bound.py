"""KV-PLACE-SIZE-BOUND's sanity bound admits vLLM's own HiSparse block rounding.

In block-outermost layouts vLLM rounds a block up to tile every HiSparse hot
page and every layer's alignment.  A legal builder that raises alignments
(``legal_builders.AlignsStrides4KiB``: 4 KiB) makes that lcm many pages wide
(10,496-byte hot pages: 167,936 bytes per block), and the reference placing
its groups does exactly what vLLM does; the bound must not call that absurd.
Found by the power sweep at seed 4 (contract.md#placement-backing).
"""

from __future__ import annotations

from typing import Any

import legal_builders
import torch

from conformance.check.bounds import absurd_size, size_bound
from kvref import ReferenceKVCacheConfigBuilder
from kvref.axes import KVCacheLayout
from kvref.config import HiSparseConfig, PlanningConfig
from kvref.extra_specs import HiSparseHotSpec, HiSparseResidentSpec
from kvref.specs import KVCacheSpec, MLAAttentionSpec

_HF = (
    ("architectures", ("DeepseekV32ForCausalLM",)),
    ("index_head_dim", 128),
    ("index_n_heads", 64),
    ("index_topk", 2048),
    ("kv_lora_rank", 512),
    ("model_type", "deepseek_v32"),
    ("qk_rope_head_dim", 64),
)
_CONFIG = PlanningConfig(
    kv_cache_layout=KVCacheLayout.BLNHC,
    host_pool_bytes=5394944,
    hisparse=HiSparseConfig(index_topk=2048),
    num_hidden_layers=1,
    hf_config=_HF,
    cache_dtype="fp8_ds_mla",
)


def _mla(head_size: int, **kw: Any) -> MLAAttentionSpec:
    """A byte-packed MLA spec of the layer's: one head, blocks of 16, never sharded."""
    return MLAAttentionSpec(
        block_size=16,
        num_kv_heads=1,
        head_size=head_size,
        dtype=torch.uint8,
        head_size_v=0,
        max_tp_shards=1,
        **kw,
    )


_SPECS: dict[str, KVCacheSpec] = {
    "model.layers.0.self_attn.attn": _mla(
        576, state_content_bytes=656, cache_dtype_str="fp8_ds_mla"
    ),
    "model.layers.0.self_attn.indexer.k_cache": _mla(132, cache_role="INDEXER"),
    "model.layers.0.self_attn.attn.hisparse_resident": HiSparseResidentSpec(
        block_size=16, page_size=10496
    ),
    "model.layers.0.self_attn.attn.hisparse_hot": HiSparseHotSpec(
        block_size=16, page_size=10496, blocks_per_request=256
    ),
}


def _backing(builder: ReferenceKVCacheConfigBuilder, num_blocks: int) -> tuple[int, int]:
    groups = builder.get_kv_cache_groups(_CONFIG, dict(_SPECS))
    plan = ReferenceKVCacheConfigBuilder().get_kv_cache_config_from_groups(
        _CONFIG, groups, num_blocks
    )
    return sum({t.size for t in plan.device_tensors}), size_bound(groups)


def test_raised_alignment_with_hot_pages_is_in_bound() -> None:
    """4 KiB strides next to 10,496-byte hot pages: vLLM's lcm rounding is within the bound."""
    size, bound = _backing(legal_builders.AlignsStrides4KiB(), 26)
    assert size == 26 * 167_936  # lcm(10496, 4096): the block tiles the hot page
    assert not absurd_size(size, 26, bound)


def test_the_bound_still_catches_what_no_rule_explains() -> None:
    """Past twice the tiled block plus the padding allowance, the size is still absurd."""
    _, bound = _backing(legal_builders.AlignsStrides4KiB(), 26)
    assert bound >= 167_936
    assert absurd_size(26 * (2 * bound + 64 * 1024) + 2**20 + 1, 26, bound)
    _, plain = _backing(ReferenceKVCacheConfigBuilder(), 26)
    assert plain < bound  # the reference's own groups: a narrower tile, a tighter bound
