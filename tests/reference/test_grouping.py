"""Default grouping against contract.md#default-grouping and its worked examples."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from specs import compressed_mla, full, mamba, mla, mla_beside_chunked, sw

from kvref._math import cdiv
from kvref.config import PlanningConfig
from kvref.errors import (
    ConfigError,
    ConflictingWindowError,
    GroupingError,
    KVRefError,
    PageSizeUnificationError,
    SpecError,
)
from kvref.grouping import create_kv_cache_group_specs, get_kv_cache_groups
from kvref.packing import approximate_gcd
from kvref.records import KVCacheGroupSpec
from kvref.specs import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
    UniformTypeKVCacheSpecs,
)
from kvref.unification import (
    promote_local_kv_cache_specs,
    try_get_full_allocation_fallback_groups,
    unify_hybrid_kv_cache_specs,
    unify_kv_cache_spec_page_size,
)
from kvref.versions import V0_33, rules

LAYER_OUTER = PlanningConfig(kv_cache_layout="LBNHC")
BLHNC = PlanningConfig(kv_cache_layout="BLHNC")
NO_HYBRID = PlanningConfig(disable_hybrid_kv_cache_manager=True)


def names(groups: list[KVCacheGroupSpec]) -> list[list[str]]:
    return [list(g.layer_names) for g in groups]


def layer_pages(group: KVCacheGroupSpec) -> list[int]:
    return [spec.page_size_bytes for _, spec in group.layer_specs()]


def model_c(s_heads: int) -> dict[str, KVCacheSpec]:
    """contract.md#grouping-examples, model (c): (F, S, S) x 4 with ``s_heads``-head S layers."""
    specs: dict[str, KVCacheSpec] = {}
    for i in range(4):
        specs.update({f"f{i}": full(), f"s{i}a": sw(heads=s_heads), f"s{i}b": sw(heads=s_heads)})
    return specs


def pattern_fss(n: int, f: KVCacheSpec, s: KVCacheSpec) -> dict[str, KVCacheSpec]:
    """(F, S, S) x n as l0, l1, ... ."""
    return {f"l{i}": (f if i % 3 == 0 else s) for i in range(3 * n)}


class TestDecisionOrder:
    def test_attention_free(self) -> None:
        """No layers give no groups (contract.md#default-grouping)."""
        assert get_kv_cache_groups(LAYER_OUTER, {}) == []

    def test_uniform(self) -> None:
        """Identical specs form one group of all layers, in input order (step 4)."""
        specs = {f"l{i}": full() for i in range(4)}
        groups = get_kv_cache_groups(LAYER_OUTER, specs)
        assert names(groups) == [["l0", "l1", "l2", "l3"]]
        assert groups[0].kv_cache_spec == full()

    def test_uniform_merges_windows(self) -> None:
        """Full attention with and without a window is uniform and merges to the window."""
        groups = get_kv_cache_groups(LAYER_OUTER, {"a": full(), "b": full(sliding_window=1024)})
        spec = groups[0].kv_cache_spec
        assert isinstance(spec, FullAttentionSpec)
        assert spec.sliding_window == 1024

    def test_conflicting_windows_propagate(self) -> None:
        """Two different windows on full attention raise instead of counting as not uniform."""
        specs = {"a": full(sliding_window=512), "b": full(sliding_window=1024)}
        with pytest.raises(ConflictingWindowError):
            get_kv_cache_groups(LAYER_OUTER, specs)

    def test_uniform_type(self) -> None:
        """Full attention with differing heads forms one uniform-type group (step 5)."""
        specs = {"a": full(), "b": full(heads=4), "c": full()}
        groups = get_kv_cache_groups(LAYER_OUTER, specs)
        assert names(groups) == [["a", "b", "c"]]
        assert isinstance(groups[0].kv_cache_spec, UniformTypeKVCacheSpecs)

    def test_mla_and_full_uniform_type(self) -> None:
        """MLA mixed with full attention of one block size is one uniform-type group."""
        groups = get_kv_cache_groups(LAYER_OUTER, {"m": mla(), "f": full(block_size=64)})
        assert isinstance(groups[0].kv_cache_spec, UniformTypeKVCacheSpecs)

    def test_mla_3_8e_uniform(self) -> None:
        """4 identical MLA layers form one group (contract.md#grouping-examples, model (e))."""
        groups = get_kv_cache_groups(LAYER_OUTER, {f"m{i}": mla() for i in range(4)})
        assert len(groups) == 1
        assert isinstance(groups[0].kv_cache_spec, MLAAttentionSpec)
        assert groups[0].kv_cache_spec.page_size_bytes == 73_728


class TestValidation:
    def test_non_str_key(self) -> None:
        """A non-str layer name raises SpecError naming it."""
        with pytest.raises(SpecError, match="layer name 3"):
            get_kv_cache_groups(LAYER_OUTER, {3: full()})  # type: ignore[dict-item]

    def test_wrapper_value(self) -> None:
        """A UniformTypeKVCacheSpecs value raises SpecError naming the layer."""
        wrapper = UniformTypeKVCacheSpecs(kv_cache_specs={"x": full()})
        with pytest.raises(SpecError, match=r"layer 'a'.*UniformTypeKVCacheSpecs"):
            get_kv_cache_groups(LAYER_OUTER, {"a": wrapper})  # type: ignore[dict-item]

    def test_non_spec_value(self) -> None:
        """A value that is not a spec raises SpecError naming the layer and value."""
        with pytest.raises(SpecError, match="layer 'a': 42"):
            get_kv_cache_groups(LAYER_OUTER, {"a": 42})  # type: ignore[dict-item]

    def test_non_mapping(self) -> None:
        """A non-mapping input raises SpecError."""
        with pytest.raises(SpecError, match="mapping"):
            get_kv_cache_groups(LAYER_OUTER, [full()])  # type: ignore[arg-type]


class TestUniformPageGrouping:
    def test_3_8a(self) -> None:
        """10 full + 20 SW as (F,S,S)x10 give F, S[0::2], S[1::2].

        See contract.md#grouping-examples, model (a).
        """
        groups = get_kv_cache_groups(LAYER_OUTER, pattern_fss(10, full(), sw()))
        assert names(groups) == [
            [f"l{i}" for i in range(0, 30, 3)],
            [f"l{i}" for i in range(1, 30, 3)],
            [f"l{i}" for i in range(2, 30, 3)],
        ]
        assert max(sum(layer_pages(g)) for g in groups) == 655_360

    def test_3_8b_gpt_oss_with_draft(self) -> None:
        """12 SW + 13 F: M=13 < 18 so group size 13, [S x 12] and [F x 13].

        See contract.md#grouping-examples, model (b).
        """
        f, s = full(head_size=64), sw(window=128, head_size=64)
        specs: dict[str, KVCacheSpec] = {f"l{i}": (s if i % 2 == 0 else f) for i in range(24)}
        specs["d0"] = full(head_size=64, is_draft=True)
        groups = get_kv_cache_groups(LAYER_OUTER, specs)
        assert names(groups) == [
            [f"l{i}" for i in range(0, 24, 2)],
            [*(f"l{i}" for i in range(1, 24, 2)), "d0"],
        ]
        assert max(sum(layer_pages(g)) for g in groups) == 425_984
        cfg = PlanningConfig(max_model_len=8192, max_num_batched_tokens=1024)
        blocks = [
            cdiv(g.kv_cache_spec.max_memory_usage_bytes(cfg), g.kv_cache_spec.page_size_bytes)
            for g in groups
        ]
        assert blocks == [137, 512]
        assert sum(blocks) * 425_984 == 276_463_616

    def test_3_8b_five_full_thirteen_sw(self) -> None:
        """5 F + 13 S: group size 5, S split into 3 strided groups of 5, 4, 4."""
        specs: dict[str, KVCacheSpec] = {f"f{i}": full() for i in range(5)}
        specs.update({f"s{i}": sw() for i in range(13)})
        assert names(get_kv_cache_groups(LAYER_OUTER, specs)) == [
            [f"f{i}" for i in range(5)],
            ["s0", "s3", "s6", "s9", "s12"],
            ["s1", "s4", "s7", "s10"],
            ["s2", "s5", "s8", "s11"],
        ]

    def test_3_8b_eight_full_nine_sw(self) -> None:
        """8 F + 9 S: group size 9, one group each."""
        specs: dict[str, KVCacheSpec] = {f"f{i}": full() for i in range(8)}
        specs.update({f"s{i}": sw() for i in range(9)})
        assert [len(n) for n in names(get_kv_cache_groups(LAYER_OUTER, specs))] == [8, 9]

    @pytest.mark.parametrize(("largest", "groups"), [(14, 2), (15, 3)])
    def test_one_and_a_half_boundary(self, largest: int, groups: int) -> None:
        """M < 1.5 m is strict: M = 14 keeps group size 14, M = 15 falls back to m = 10."""
        specs: dict[str, KVCacheSpec] = {f"f{i}": full() for i in range(10)}
        specs.update({f"s{i}": sw() for i in range(largest)})
        assert len(get_kv_cache_groups(LAYER_OUTER, specs)) == groups

    def test_coalescing(self) -> None:
        """Full attention with and without a recorded window coalesce into one bucket."""
        specs: dict[str, KVCacheSpec] = {
            "a": full(),
            "b": full(sliding_window=1024),
            "c": sw(),
            "d": sw(),
        }
        groups = get_kv_cache_groups(LAYER_OUTER, specs)
        assert names(groups) == [["a", "b"], ["c", "d"]]
        spec = groups[0].kv_cache_spec
        assert isinstance(spec, FullAttentionSpec)
        assert spec.sliding_window == 1024

    def test_no_coalescing_across_conflicting_windows(self) -> None:
        """Full specs with two windows stay apart in 3.3 rather than raising."""
        specs: dict[str, KVCacheSpec] = {
            "a": full(sliding_window=512),
            "s": sw(),
            "b": full(sliding_window=1024),
        }
        assert names(get_kv_cache_groups(LAYER_OUTER, specs)) == [["a"], ["s"], ["b"]]

    def test_chunked_local_llama4(self) -> None:
        """3 chunked-local per full layer give 3 chunked groups and 1 full group of 12."""
        chunk = ChunkedLocalAttentionSpec(
            block_size=16, num_kv_heads=8, head_size=128, dtype="bf16", attention_chunk_size=8192
        )
        specs: dict[str, KVCacheSpec] = {
            f"l{i}": (full() if i % 4 == 3 else chunk) for i in range(48)
        }
        groups = get_kv_cache_groups(LAYER_OUTER, specs)
        assert [len(n) for n in names(groups)] == [12, 12, 12, 12]
        assert names(groups)[0][:3] == ["l0", "l4", "l8"]
        assert isinstance(groups[3].kv_cache_spec, FullAttentionSpec)

    def test_create_kv_cache_group_specs(self) -> None:
        """Each group's spec is the merge of its layers' specs."""
        specs: dict[str, KVCacheSpec] = {"a": full(), "b": full(sliding_window=64)}
        [group] = create_kv_cache_group_specs(specs, [["a", "b"]])
        assert group.kv_cache_spec == full(sliding_window=64)


class TestMixedPages:
    def test_3_8c_layer_outer_scaling(self) -> None:
        """S with 4 heads doubles its block size to reach the 65,536 page.

        See contract.md#grouping-examples, model (c).
        """
        groups = get_kv_cache_groups(LAYER_OUTER, model_c(4))
        assert names(groups) == [
            ["f0", "f1", "f2", "f3"],
            ["s0a", "s1a", "s2a", "s3a"],
            ["s0b", "s1b", "s2b", "s3b"],
        ]
        assert groups[1].kv_cache_spec.block_size == 32
        assert max(sum(layer_pages(g)) for g in groups) == 262_144

    def test_3_8c_blhnc_packed(self) -> None:
        """Under BLHNC the same model packs [f0..f3] and all 8 S layers.

        See contract.md#grouping-examples, model (c).
        """
        groups = get_kv_cache_groups(BLHNC, model_c(4))
        assert [len(n) for n in names(groups)] == [4, 8]
        assert [sum(layer_pages(g)) for g in groups] == [262_144, 262_144]
        assert all(isinstance(g.kv_cache_spec, UniformTypeKVCacheSpecs) for g in groups)

    def test_3_8c_layer_outer_padding(self) -> None:
        """S with 6 heads (49,152) is padded to 65,536 and keeps block 16.

        See contract.md#grouping-examples, model (c).
        """
        groups = get_kv_cache_groups(LAYER_OUTER, model_c(6))
        spec = groups[1].kv_cache_spec
        assert isinstance(spec, SlidingWindowSpec)
        assert (spec.block_size, spec.page_size_padded, spec.real_page_size_bytes) == (
            16,
            65_536,
            49_152,
        )

    def test_3_8c_blhnc_state_split(self) -> None:
        """Under BLHNC the 6-head S bucket is a state bucket split into 2 groups of 4."""
        groups = get_kv_cache_groups(BLHNC, model_c(6))
        assert names(groups) == [
            ["f0", "f1", "f2", "f3"],
            ["s0a", "s1a", "s2a", "s3a"],
            ["s0b", "s1b", "s2b", "s3b"],
        ]
        assert [sum(layer_pages(g)) for g in groups] == [262_144, 196_608, 196_608]

    def test_3_8d_mamba_hybrid(self) -> None:
        """36 padded Mamba + 12 attention: 3 Mamba groups and 1 attention group.

        See contract.md#grouping-examples, model (d).
        """
        attention = full(heads=2, head_size=256, block_size=80)
        state = mamba(page_size_padded=163_840)
        assert attention.page_size_bytes == 163_840
        specs: dict[str, KVCacheSpec] = {
            f"l{i}": (attention if i % 4 == 3 else state) for i in range(48)
        }
        for cfg in (LAYER_OUTER, BLHNC):
            groups = get_kv_cache_groups(cfg, specs)
            assert names(groups)[0] == [f"l{i}" for i in range(0, 48, 4)]
            assert names(groups)[3] == [f"l{i}" for i in range(3, 48, 4)]
            assert max(sum(layer_pages(g)) for g in groups) == 1_966_080
        cfg = PlanningConfig(max_model_len=32_768)
        blocks = sum(
            cdiv(g.kv_cache_spec.max_memory_usage_bytes(cfg), g.kv_cache_spec.page_size_bytes)
            for g in get_kv_cache_groups(LAYER_OUTER, specs)
        )
        assert blocks == 413

    def test_3_8d_unpadded_mamba_blhnc(self) -> None:
        """Unpadded Mamba under BLHNC packs 14 states per block: 3 groups of 12.

        See contract.md#grouping-examples, model (d).
        """
        attention = full(heads=2, head_size=256, block_size=80)
        specs: dict[str, KVCacheSpec] = {
            f"l{i}": (attention if i % 4 == 3 else mamba()) for i in range(48)
        }
        groups = get_kv_cache_groups(BLHNC, specs)
        assert [len(n) for n in names(groups)] == [12, 12, 12, 12]
        assert names(groups)[0][:3] == ["l0", "l4", "l8"]
        assert max(sum(layer_pages(g)) for g in groups) == 1_966_080

    def test_mamba_padded_in_layer_outer(self) -> None:
        """An unpadded Mamba state is padded to the attention page (layer-outer)."""
        attention = full(heads=2, head_size=256, block_size=80)
        specs: dict[str, KVCacheSpec] = {"m": mamba(), "a": attention}
        groups = get_kv_cache_groups(LAYER_OUTER, specs)
        spec = groups[0].kv_cache_spec
        assert isinstance(spec, MambaSpec)
        assert spec.page_size_padded == 163_840

    def test_3_8e_fallback(self) -> None:
        """MLA + SWA draft under a layer-outer layout fall back to one uniform-type group."""
        specs: dict[str, KVCacheSpec] = {f"m{i}": mla() for i in range(4)}
        specs["draft"] = sw(block_size=64, is_draft=True)
        groups = get_kv_cache_groups(LAYER_OUTER, specs)
        assert names(groups) == [["m0", "m1", "m2", "m3", "draft"]]
        wrapper = groups[0].kv_cache_spec
        assert isinstance(wrapper, UniformTypeKVCacheSpecs)
        draft = wrapper.kv_cache_specs["draft"]
        assert type(draft) is FullAttentionSpec
        assert (draft.sliding_window, draft.is_draft) == (1024, True)
        assert draft.page_size_bytes == 262_144

    def test_3_8e_blhnc_packed(self) -> None:
        """The same model under BLHNC is packed as [m0..m3] (294,912 B) and [draft]."""
        specs: dict[str, KVCacheSpec] = {f"m{i}": mla() for i in range(4)}
        specs["draft"] = sw(block_size=64, is_draft=True)
        groups = get_kv_cache_groups(BLHNC, specs)
        assert names(groups) == [["m0", "m1", "m2", "m3"], ["draft"]]
        assert [sum(layer_pages(g)) for g in groups] == [294_912, 262_144]

    def test_unpaddable_mla_without_fallback(self) -> None:
        """MLA whose page does not divide the largest page, with no fallback, raises."""
        with pytest.raises(PageSizeUnificationError, match="'m'"):
            get_kv_cache_groups(LAYER_OUTER, mla_beside_chunked())


class TestUnifyPageSize:
    def test_single_page_unchanged(self) -> None:
        """One page size returns the specs unchanged."""
        specs: dict[str, KVCacheSpec] = {"a": full(), "b": sw()}
        assert unify_kv_cache_spec_page_size(specs) == specs

    def test_scaling(self) -> None:
        """A page dividing the largest one scales its block size."""
        out = unify_kv_cache_spec_page_size({"a": full(), "b": sw(heads=2)})
        assert out["b"].block_size == 64
        assert out["b"].page_size_bytes == 65_536

    def test_attention_padding(self) -> None:
        """A non-MLA attention page not dividing the largest page is padded."""
        out = unify_kv_cache_spec_page_size({"a": full(), "b": sw(heads=6)})
        assert out["b"].block_size == 16
        assert out["b"].page_size_bytes == 65_536

    def test_mamba_padding(self) -> None:
        """Mamba is padded even when its page divides the largest page."""
        state = MambaSpec(block_size=16, shapes=[[8192]], dtypes=["fp32"])
        out = unify_kv_cache_spec_page_size({"a": full(), "m": state})
        assert out["m"].block_size == 16
        assert out["m"].page_size_bytes == 65_536

    def test_mla_not_paddable(self) -> None:
        """An MLA page that does not divide the largest page raises PageSizeUnificationError."""
        with pytest.raises(PageSizeUnificationError, match=r"'m'.*73728.*262144"):
            unify_kv_cache_spec_page_size({"m": mla(), "s": sw(block_size=64)})

    def test_already_padded_cannot_scale(self) -> None:
        """An explicitly padded page that divides the largest page fails clearly."""
        padded = sw(heads=2, page_size_padded=32_768)
        with pytest.raises(GroupingError, match="already padded") as info:
            unify_kv_cache_spec_page_size({"a": full(), "b": padded})
        assert not isinstance(info.value, PageSizeUnificationError)

    def test_mla_alignment_recomputed(self) -> None:
        """Scaling an aligned MLA page recomputes its padding: 37,440 -> 74,880."""
        c4 = compressed_mla()
        wide = full(heads=1, state_content_bytes=4680)
        assert wide.page_size_bytes == 74_880
        out = unify_kv_cache_spec_page_size({"c4": c4, "w": wide})
        assert (out["c4"].block_size, out["c4"].page_size_bytes) == (512, 74_880)

    def test_is_draft_kept(self) -> None:
        """Unification keeps each layer's is_draft although equality ignores it."""
        out = unify_kv_cache_spec_page_size(
            {"a": full(), "b": sw(heads=2), "d": sw(heads=2, is_draft=True)}
        )
        assert (out["b"].is_draft, out["d"].is_draft) == (False, True)


class TestHybridDisabled:
    def test_3_2_example(self) -> None:
        """full + sw1024 + sw1024 give one FullAttentionSpec(sliding_window=1024) group."""
        specs: dict[str, KVCacheSpec] = {"f": full(), "s0": sw(), "s1": sw()}
        groups = get_kv_cache_groups(NO_HYBRID, specs)
        assert names(groups) == [["f", "s0", "s1"]]
        spec = groups[0].kv_cache_spec
        assert type(spec) is FullAttentionSpec
        assert spec.sliding_window == 1024

    def test_block_size_and_extra_tokens(self) -> None:
        """Promotion takes the full layers' block size and drops extra_retained_tokens."""
        local = sw(block_size=32, extra_retained_tokens=3)
        out = promote_local_kv_cache_specs({"f": full(heads=4), "s": local})
        promoted = out["s"]
        assert type(promoted) is FullAttentionSpec
        assert (promoted.block_size, promoted.sliding_window) == (16, 1024)

    def test_padded_page_rule(self) -> None:
        """page_size_padded becomes max(old padded, unpadded scaled to the new block)."""
        local = sw(heads=1, block_size=8, page_size_padded=5000)
        out = promote_local_kv_cache_specs({"f": full(heads=1), "s": local})
        assert out["s"].page_size_bytes == max(5000, 4096 * 16 // 8)

    def test_chunked_local_promoted(self) -> None:
        """Chunked local becomes full attention keeping its chunk size."""
        chunk = ChunkedLocalAttentionSpec(
            block_size=16, num_kv_heads=8, head_size=128, dtype="bf16", attention_chunk_size=8192
        )
        out = promote_local_kv_cache_specs({"f": full(), "c": chunk})
        assert out["c"] == full(attention_chunk_size=8192)

    def test_sw_mla_promoted_to_mla(self) -> None:
        """SW-MLA becomes MLA next to MLA layers."""
        swm = SlidingWindowMLASpec(
            block_size=64, num_kv_heads=1, head_size=576, dtype="bf16", sliding_window=128
        )
        out = promote_local_kv_cache_specs({"m": mla(), "w": swm})
        assert type(out["w"]) is MLAAttentionSpec

    def test_replicated_partition(self) -> None:
        """DCP-replicated layers are promoted separately from sharded ones."""
        specs: dict[str, KVCacheSpec] = {
            "f": full(),
            "s": sw(),
            "d": sw(block_size=32, dcp_sharded=False, is_draft=True),
        }
        out = unify_hybrid_kv_cache_specs(specs)
        assert type(out["s"]) is FullAttentionSpec
        assert out["d"] == specs["d"]
        assert type(out["d"]) is SlidingWindowSpec
        assert list(out) == ["f", "s", "d"]

    def test_mamba_and_full_fail(self) -> None:
        """Mamba next to full attention cannot be promoted: GroupingError naming the layers."""
        with pytest.raises(GroupingError, match=r"MambaSpec: \['m'\]"):
            get_kv_cache_groups(NO_HYBRID, {"a": full(), "m": mamba()})

    def test_two_windows_fail(self) -> None:
        """Two sliding windows without full attention fail, naming the windows."""
        with pytest.raises(GroupingError, match=r"\[512, 1024\]"):
            get_kv_cache_groups(NO_HYBRID, {"a": sw(), "b": sw(window=512)})

    def test_full_and_two_windows_fail(self) -> None:
        """Full + two windows promote to conflicting windows: GroupingError."""
        with pytest.raises(GroupingError, match="same window size"):
            get_kv_cache_groups(NO_HYBRID, {"f": full(), "a": sw(), "b": sw(window=512)})

    def test_gemma3_like(self) -> None:
        """A 5:1 Gemma-3-like model becomes one full group of 131,072-byte pages."""
        f, s = full(heads=16), sw(heads=16)
        specs: dict[str, KVCacheSpec] = {f"l{i}": (f if i % 6 == 5 else s) for i in range(12)}
        groups = get_kv_cache_groups(NO_HYBRID, specs)
        assert len(groups) == 1
        assert groups[0].kv_cache_spec.page_size_bytes == 131_072


class TestFallback:
    def test_needs_mla_and_sliding_window(self) -> None:
        """Without MLA, or without a sliding window, there is no fallback."""
        assert try_get_full_allocation_fallback_groups({"f": full(), "s": sw()}) is None
        assert try_get_full_allocation_fallback_groups({"m": mla(), "f": full()}) is None

    def test_sw_mla_blocks_fallback_in_0_33(self) -> None:
        """Under vLLM 0.33.0 an SW-MLA layer rules the fallback out."""
        swm = SlidingWindowMLASpec(
            block_size=64, num_kv_heads=1, head_size=576, dtype="bf16", sliding_window=128
        )
        specs: dict[str, KVCacheSpec] = {"m": mla(), "s": sw(), "w": swm}
        assert try_get_full_allocation_fallback_groups(specs, rules(V0_33)) is None

    def test_promotion_failure_gives_none(self) -> None:
        """A model that cannot be promoted (different block sizes) gives None."""
        specs: dict[str, KVCacheSpec] = {"m": mla(), "f": full(block_size=16), "s": sw()}
        assert try_get_full_allocation_fallback_groups(specs) is None


class TestPacked:
    @staticmethod
    def model_3_7() -> dict[str, KVCacheSpec]:
        latent = mla(block_size=16, head_size=128)
        indexer = mla(block_size=16, head_size=32, cache_role="INDEXER")
        window = sw(window=128, heads=1, head_size=32)
        state = MambaSpec(block_size=16, shapes=[[750]], dtypes=["fp32"])
        assert [s.page_size_bytes for s in (latent, indexer, window, state)] == [
            4096,
            1024,
            2048,
            3000,
        ]
        specs: dict[str, KVCacheSpec] = {}
        for i in range(6):
            specs.update({f"m{i}": latent, f"i{i}": indexer})
        specs.update({f"s{i}": window for i in range(20)})
        specs.update({"z0": state, "z1": state})
        return specs

    def test_approximate_gcd_3_7(self) -> None:
        """R = approximate_gcd([6, 20, 2], 6) = 7: padding 8 at d=6, 7 at d=7.

        See contract.md#packed-grouping.
        """
        assert approximate_gcd([6, 20, 2], lower_bound=6) == 7

    def test_approximate_gcd_edges(self) -> None:
        """A bound above the maximum is returned; ties prefer the larger d."""
        assert approximate_gcd([3, 4], lower_bound=9) == 9
        assert approximate_gcd([2, 3]) == 1
        assert approximate_gcd([4, 6]) == 2  # d = 1 and d = 2 both pad 0

    @pytest.mark.parametrize("values", [[], [0, 3], [-1]])
    def test_approximate_gcd_rejects(self, values: list[int]) -> None:
        """Empty or non-positive values raise GroupingError."""
        with pytest.raises(GroupingError):
            approximate_gcd(values)

    def test_3_7_example(self) -> None:
        """MLA+indexer 12 / SW 7,7,6 / Mamba 1 (contract.md#packed-grouping)."""
        groups = get_kv_cache_groups(BLHNC, self.model_3_7())
        assert [len(n) for n in names(groups)] == [12, 7, 7, 6, 2]
        assert names(groups)[0] == [n for i in range(6) for n in (f"m{i}", f"i{i}")]
        assert names(groups)[1] == [f"s{i}" for i in range(0, 20, 3)]
        assert names(groups)[2] == [f"s{i}" for i in range(1, 20, 3)]
        assert names(groups)[3] == [f"s{i}" for i in range(2, 20, 3)]
        assert sum(layer_pages(groups[0])) == 30_720
        assert max(sum(layer_pages(g)) for g in groups) == 30_720

    def test_layer_outer_not_packed(self) -> None:
        """A layer-outer layout never packs (returns to page unification)."""
        groups = get_kv_cache_groups(PlanningConfig(kv_cache_layout="LBHNC"), self.model_3_7())
        pages = {p for g in groups for p in layer_pages(g)}
        assert len(pages) == 1 or len(groups) == 1

    def test_unbalanced_state_bucket(self) -> None:
        """A two-page SW bucket that must split raises GroupingError, never StopIteration."""
        specs: dict[str, KVCacheSpec] = {
            "f0": full(),
            "f1": full(),
            "s0": sw(),
            "s1": sw(heads=4),
            "s2": sw(heads=4),
        }
        with pytest.raises(GroupingError, match="empty groups or drop layers"):
            get_kv_cache_groups(BLHNC, specs)

    def test_mixed_page_blhnc_golden(self) -> None:
        """The golden mixed_page_sizes_BLHNC problem: one wrapper group per bucket."""
        s, f = sw(window=512, heads=2), full(heads=4)
        specs: dict[str, KVCacheSpec] = {f"l{i}": (s if i % 2 == 0 else f) for i in range(8)}
        groups = get_kv_cache_groups(BLHNC, specs)
        assert names(groups) == [["l0", "l2", "l4", "l6"], ["l1", "l3", "l5", "l7"]]
        assert [g.kv_cache_spec.page_size_bytes for g in groups] == [65_536, 131_072]


class TestHostResident:
    def test_host_group_appended(self) -> None:
        """Host layers form one host-resident group after the device groups."""
        cfg = PlanningConfig(host_resident_layers={"h0", "h1"})
        specs: dict[str, KVCacheSpec] = {"h0": mla(), "a": full(), "h1": mla(), "b": full()}
        groups = get_kv_cache_groups(cfg, specs)
        assert names(groups) == [["a", "b"], ["h0", "h1"]]
        assert [g.host_resident for g in groups] == [False, True]
        assert isinstance(groups[1].kv_cache_spec, MLAAttentionSpec)

    def test_host_uniform_type(self) -> None:
        """Host layers of one type but different pages get a wrapper."""
        cfg = PlanningConfig(host_resident_layers={"h0", "h1"})
        groups = get_kv_cache_groups(cfg, {"a": full(), "h0": full(), "h1": full(heads=2)})
        assert isinstance(groups[-1].kv_cache_spec, UniformTypeKVCacheSpecs)
        assert groups[-1].host_resident

    def test_host_mixed_types_rejected(self) -> None:
        """Host layers of several types raise GroupingError naming them."""
        cfg = PlanningConfig(host_resident_layers={"h0", "h1"})
        with pytest.raises(GroupingError, match="'h0', 'h1'"):
            get_kv_cache_groups(cfg, {"h0": full(), "h1": sw()})

    def test_unknown_host_layer(self) -> None:
        """A host layer name not in the input raises ConfigError naming it."""
        cfg = PlanningConfig(host_resident_layers={"ghost"})
        with pytest.raises(ConfigError, match="ghost"):
            get_kv_cache_groups(cfg, {"a": full()})

    def test_all_host(self) -> None:
        """With every layer host-resident the device part is empty."""
        cfg = PlanningConfig(host_resident_layers={"a", "b"})
        groups = get_kv_cache_groups(cfg, {"a": full(), "b": full()})
        assert names(groups) == [["a", "b"]]
        assert groups[0].host_resident

    def test_host_layers_leave_device_grouping(self) -> None:
        """Removing host layers changes nothing about how device layers group."""
        specs = pattern_fss(4, full(), sw())
        cfg = PlanningConfig(host_resident_layers={"h"})
        groups = get_kv_cache_groups(cfg, {**specs, "h": mla()})
        assert groups[:-1] == get_kv_cache_groups(LAYER_OUTER, specs)


class TestInputNotMutated:
    @pytest.mark.parametrize("cfg", [LAYER_OUTER, BLHNC, NO_HYBRID])
    def test_input_unchanged(self, cfg: PlanningConfig) -> None:
        """Grouping never changes the caller's mapping (vLLM mutates it in place)."""
        specs: dict[str, KVCacheSpec] = {"f": full(), "s": sw(heads=4), "t": sw(heads=4)}
        before = list(specs.items())
        get_kv_cache_groups(cfg, specs)
        assert list(specs.items()) == before
        assert all(specs[k] is v for k, v in before)


# -- properties -------------------------------------------------------------

_POOL: list[KVCacheSpec] = [
    full(),
    full(heads=4),
    full(sliding_window=1024),
    sw(),
    sw(heads=4),
    sw(heads=6),
    sw(window=512),
    sw(block_size=32),
    mla(block_size=16, head_size=128),
    ChunkedLocalAttentionSpec(
        block_size=16, num_kv_heads=8, head_size=128, dtype="bf16", attention_chunk_size=256
    ),
    MambaSpec(block_size=16, shapes=[[4096]], dtypes=["fp32"]),
    MambaSpec(block_size=16, shapes=[[8192]], dtypes=["fp32"], page_size_padded=65_536),
]

models = st.lists(st.sampled_from(_POOL), min_size=1, max_size=40).map(
    lambda specs: {f"l{i}": s for i, s in enumerate(specs)}
)
configs = st.builds(
    PlanningConfig,
    kv_cache_layout=st.sampled_from(["LBNHC", "BLHNC"]),
    disable_hybrid_kv_cache_manager=st.booleans(),
)


def _group_or_none(
    cfg: PlanningConfig, specs: Mapping[str, KVCacheSpec]
) -> list[KVCacheGroupSpec] | None:
    try:
        return get_kv_cache_groups(cfg, specs)
    except KVRefError:
        return None


class TestProperties:
    @settings(max_examples=150, deadline=None)
    @given(cfg=configs, specs=models)
    def test_partition(self, cfg: PlanningConfig, specs: dict[str, KVCacheSpec]) -> None:
        """Groups are non-empty and hold every layer exactly once (or a typed error)."""
        groups = _group_or_none(cfg, specs)
        if groups is None:
            return
        flat = [n for g in groups for n in g.layer_names]
        assert all(g.layer_names for g in groups)
        assert sorted(flat) == sorted(specs)
        if cfg.disable_hybrid_kv_cache_manager:
            return  # promotion may lower the block size, and with it the page
        for g in groups:
            for name, spec in g.layer_specs():
                assert spec.page_size_bytes >= specs[name].page_size_bytes

    @settings(max_examples=150, deadline=None)
    @given(specs=models)
    def test_uniform_page_path(self, specs: dict[str, KVCacheSpec]) -> None:
        """Outside the single-group rules, every per-layer page is equal (layer-outer layout)."""
        groups = _group_or_none(LAYER_OUTER, specs)
        if groups is None or len(groups) == 1:
            return
        pages = {p for g in groups for p in layer_pages(g)}
        assert len(pages) == 1
        assert all(not isinstance(g.kv_cache_spec, UniformTypeKVCacheSpecs) for g in groups)

    @settings(max_examples=100, deadline=None)
    @given(cfg=configs, specs=models)
    def test_deterministic(self, cfg: PlanningConfig, specs: dict[str, KVCacheSpec]) -> None:
        """The same input gives equal groups twice, and the input is left as it was."""
        before = dict(specs)
        assert _group_or_none(cfg, specs) == _group_or_none(cfg, dict(specs))
        assert specs == before


class TestScale:
    @pytest.mark.parametrize("cfg", [LAYER_OUTER, BLHNC, NO_HYBRID])
    def test_16384_layers(self, cfg: PlanningConfig) -> None:
        """16,384 mixed layers group, each layer once.

        How fast is measured in benchmarks/planning.py, not asserted here: a
        wall-clock bound fails on a busy machine.
        """
        specs = pattern_fss(16_384 // 3, full(), sw(heads=4))
        groups = get_kv_cache_groups(cfg, specs)
        assert sum(len(g.layer_names) for g in groups) == len(specs)
        assert len({n for g in groups for n in g.layer_names}) == len(specs)
