"""Hidden-state specs (``HiddenStateCacheSpec``) and their alignment in grouping.

The worked numbers follow contract.md#hidden-state-alignment and were
checked against vLLM 0.33.0's ``get_kv_cache_groups`` (see
``tests/vllm/test_new_interfaces.py`` and the golden file ``hidden_state.json``).
"""

from __future__ import annotations

import pytest
from specs import MODEL_A_FULL as FULL
from specs import full, mla, model_a, sw

from kvref import (
    FullAttentionSpec,
    MLAAttentionSpec,
    PlanningConfig,
    ReferenceKVCacheConfigBuilder,
    SlidingWindowSpec,
    UniformTypeKVCacheSpecs,
    plan_kv_cache,
)
from kvref.errors import GroupingError, PageSizeUnificationError
from kvref.extra_specs import HiddenStateCacheSpec
from kvref.grouping import get_kv_cache_groups
from kvref.specs import KVCacheSpec

#: One token of a 4096-wide bf16 hidden state: 8,192 bytes.
HIDDEN = HiddenStateCacheSpec(block_size=16, num_kv_heads=1, head_size=4096, dtype="bfloat16")


def _hybrid(hidden: KVCacheSpec = HIDDEN) -> dict[str, KVCacheSpec]:
    layers = model_a(6)
    layers["h0"] = hidden
    return layers


class TestSpec:
    """The spec kind: an MLA marker with MLA's page."""

    def test_page_and_token(self) -> None:
        """Page ``1 * 16 * 4096 * 2 = 131,072``; a token is 8,192 bytes; MLA type base."""
        assert HIDDEN.page_size_bytes == 131_072
        assert HIDDEN.bytes_per_token == 8_192
        assert isinstance(HIDDEN, MLAAttentionSpec)
        assert HIDDEN.uniform_type_base() is FullAttentionSpec

    def test_merge_keeps_the_kind(self) -> None:
        """Two equal hidden-state specs merge into a hidden-state spec."""
        merged = HiddenStateCacheSpec.merge([HIDDEN, HIDDEN])
        assert type(merged) is HiddenStateCacheSpec


class TestAlignment:
    """The uniform-page path sets hidden-state layers apart and aligns them."""

    def test_block_size_fits_the_common_page(self) -> None:
        """F/S pages are 65,536: 65,536 // 8,192 = 8 tokens, the largest divisor of 16 <= 8."""
        groups = get_kv_cache_groups(PlanningConfig(), _hybrid())
        assert [list(g.layer_names) for g in groups] == [
            ["l0", "l3"],
            ["l1", "l4"],
            ["l2", "l5"],
            ["h0"],
        ]
        hidden = groups[-1].kv_cache_spec
        assert isinstance(hidden, HiddenStateCacheSpec)
        assert (hidden.block_size, hidden.page_size_padded, hidden.page_size_bytes) == (
            8,
            65_536,
            65_536,
        )
        assert {g.kv_cache_spec.page_size_bytes for g in groups} == {65_536}

    def test_small_pages_are_scaled_first(self) -> None:
        """F/S pages of 4,096 (1 head x 64, fp16) < 8,192: s = 2, blocks 32, common 8,192.

        The hidden layer then takes 8,192 // 8,192 = 1 token per block.
        """
        small_f = full(heads=1, head_size=64, dtype="float16")
        small_s = sw(256, heads=1, head_size=64, dtype="float16")
        layers: dict[str, KVCacheSpec] = {"f": small_f, "s": small_s, "h": HIDDEN}
        groups = get_kv_cache_groups(PlanningConfig(), layers)
        assert [g.kv_cache_spec.block_size for g in groups] == [32, 32, 1]
        assert [g.kv_cache_spec.page_size_bytes for g in groups] == [8_192, 8_192, 8_192]

    def test_padded_groups_scale_their_padding(self) -> None:
        """A padded page scales with the block size.

        F (4 heads, 32,768 B) scales to block 32 to reach S's padded 65,536 B
        page.  A 131,072-byte hidden token then forces s = 2: F block 64, S
        block 32 with padding 131,072, and the hidden layer 1 token per block.
        """
        f4 = full(heads=4)
        s6 = sw(heads=6, page_size_padded=65_536)
        wide = HiddenStateCacheSpec(
            block_size=16, num_kv_heads=2, head_size=32_768, dtype="bfloat16"
        )
        assert wide.bytes_per_token == 131_072
        groups = get_kv_cache_groups(PlanningConfig(), {"f": f4, "s": s6, "h": wide})
        f_spec, s_spec, h_spec = (g.kv_cache_spec for g in groups)
        assert (f_spec.block_size, f_spec.page_size_bytes) == (64, 131_072)
        assert (s_spec.block_size, s_spec.page_size_bytes) == (32, 131_072)
        assert isinstance(s_spec, SlidingWindowSpec) and s_spec.page_size_padded == 131_072
        # gcd(64, 32) = 32; 131,072 // 131,072 = 1 token per block.
        assert (h_spec.block_size, h_spec.page_size_bytes) == (1, 131_072)

    def test_plan_places_the_hidden_group(self) -> None:
        """Core plans the aligned group like any other: bpb stays 2 x 65,536."""
        plan = plan_kv_cache(
            ReferenceKVCacheConfigBuilder, PlanningConfig(max_model_len=4096), [_hybrid()], 1 << 30
        )
        assert plan.workers[0].pool_bytes_per_block == 131_072
        (tensor,) = [t for t in plan.configs[0].kv_cache_tensors if t.layers == ("h0",)]
        assert (tensor.block_stride, tensor.offset) == (65_536, 0)


class TestOtherPaths:
    """Where hidden-state layers are not set apart, or are not aligned."""

    def test_uniform_type_keeps_them_together(self) -> None:
        """Full attention plus a hidden layer of the same block size: one uniform-type group."""
        groups = get_kv_cache_groups(PlanningConfig(), {"f0": FULL, "f1": FULL, "h0": HIDDEN})
        assert len(groups) == 1
        assert isinstance(groups[0].kv_cache_spec, UniformTypeKVCacheSpecs)

    def test_packed_grouping_appends_raw_specs(self) -> None:
        """Under BLHNC with mixed pages the hidden layer keeps its raw spec and block size."""
        s4 = sw(heads=4)
        layers: dict[str, KVCacheSpec] = {"f0": FULL, "s0": s4, "s1": s4, "h0": HIDDEN}
        groups = get_kv_cache_groups(PlanningConfig(kv_cache_layout="BLHNC"), layers)
        assert [list(g.layer_names) for g in groups][-1] == ["h0"]
        assert groups[-1].kv_cache_spec == HIDDEN

    def test_no_fallback_with_hidden_layers(self) -> None:
        """MLA + SWA draft falls back to full allocation, but not with a hidden layer present."""
        draft = sw(block_size=64)
        layers: dict[str, KVCacheSpec] = {f"m{i}": mla() for i in range(4)} | {"d": draft}
        assert len(get_kv_cache_groups(PlanningConfig(), layers)) == 1
        hidden = HiddenStateCacheSpec(
            block_size=32, num_kv_heads=1, head_size=4096, dtype="bfloat16"
        )
        with pytest.raises(PageSizeUnificationError):
            get_kv_cache_groups(PlanningConfig(), layers | {"h": hidden})

    def test_only_hidden_layers_of_two_block_sizes(self) -> None:
        """Nothing to align to: a typed ``GroupingError`` (vLLM crashes on ``min([])``)."""
        other = HiddenStateCacheSpec(block_size=32, num_kv_heads=1, head_size=4096, dtype="bf16")
        with pytest.raises(GroupingError, match="no other KV cache layers"):
            get_kv_cache_groups(PlanningConfig(), {"h0": HIDDEN, "h1": other})
