"""Spec kinds against the worked numbers of contract.md#specs and contract.md#grouping-examples."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import attrs
import pytest
import torch
from specs import COMPRESSED_MLA, compressed_mla, full, mla, window_mla

from kvref.config import PlanningConfig
from kvref.errors import ConflictingWindowError, IncompatibleSpecsError, SpecError
from kvref.specs import (
    ChunkedLocalAttentionSpec,
    CircularBufferSpec,
    CrossAttentionSpec,
    EncoderOnlyAttentionSpec,
    FullAttentionSpec,
    MambaSpec,
    MLAAttentionSpec,
    MultipleOf,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
    UniformTypeKVCacheSpecs,
    evolve_spec,
    iter_layer_specs,
    to_dtype,
)


def sw(window: int = 128, heads: int = 8, head_size: int = 64, **kw: Any) -> SlidingWindowSpec:
    kw.setdefault("block_size", 16)
    return SlidingWindowSpec(
        num_kv_heads=heads, head_size=head_size, dtype="bfloat16", sliding_window=window, **kw
    )


#: contract.md#grouping-examples, model (b): L = 8192, I = 2 batches in flight x 1024 tokens = 2048.
CFG_B = PlanningConfig(max_model_len=8192, max_num_batched_tokens=1024)


class TestPageSize:
    def test_full_attention_page(self) -> None:
        """8 heads x (128+128) x bf16 x 16 tokens is a 65,536-byte page.

        See contract.md#grouping-examples, model (a).
        """
        assert full().page_size_bytes == 65_536

    def test_mla_dense_page(self) -> None:
        """DeepSeek-V3 MLA, head 576, bf16, block 64 has a 73,728-byte page.

        See contract.md#page-formula.
        """
        spec = mla()
        assert spec.head_size_v == 0
        assert spec.page_size_bytes == 73_728

    def test_mla_fp8_ds_mla_page(self) -> None:
        """fp8_ds_mla with C = 656 and uint8 gives 64 * 656 = 41,984 bytes.

        See contract.md#page-formula.
        """
        spec = mla(dtype="uint8", state_content_bytes=656, cache_dtype_str="fp8_ds_mla")
        assert spec.page_size_bytes == 41_984

    def test_num_head_slots_override_heads(self) -> None:
        """num_head_slots replaces num_kv_heads as H (FlashInfer NVFP4: 2 x heads)."""
        spec = full(heads=4, num_head_slots=8)
        assert spec.num_page_heads == 8
        assert spec.page_size_bytes == 8 * 16 * 512

    def test_tokens_per_state_compression(self) -> None:
        """tokens_per_state 4 stores block_size // 4 states."""
        spec = full(block_size=256, tokens_per_state=4)
        assert spec.num_states == 64

    def test_tokens_per_state_fraction(self) -> None:
        """A Fraction below 1 stores several states per token."""
        spec = full(block_size=16, tokens_per_state=Fraction(1, 2))
        assert spec.num_states == 32
        assert spec.get_num_kernel_states(8) == 16

    def test_fraction_string_accepted(self) -> None:
        """tokens_per_state given as "1/4" becomes Fraction(1, 4)."""
        assert full(tokens_per_state="1/4").tokens_per_state == Fraction(1, 4)

    def test_mamba_page(self) -> None:
        """A Mamba page is Σ prod(shape) * sizeof: 4*1024*2 + 8*64*64*4 = 139,264.

        See contract.md#grouping-examples, model (d).
        """
        spec = MambaSpec(block_size=80, shapes=[[4, 1024], [8, 64, 64]], dtypes=["bf16", "fp32"])
        assert spec.page_size_bytes == 139_264
        assert spec.num_states == 1
        assert evolve_spec(spec, page_size_padded=163_840).page_size_bytes == 163_840

    def test_dtype_names(self) -> None:
        """Dtype names and aliases convert to torch dtypes."""
        assert to_dtype("bf16") is torch.bfloat16
        assert to_dtype("torch.float16") is torch.float16
        assert full().dtype is torch.bfloat16


class TestMLAAlignment:
    def test_deepseek_v4_c4_padding(self) -> None:
        """DeepSeek-V4 C4: 64 states x 584 B = 37,376, aligned to 576 gives 37,440.

        See contract.md#spec-kinds.
        """
        spec = compressed_mla()
        assert spec.real_page_size_bytes == 37_376
        assert spec.page_size_padded == 37_440
        assert spec.page_size_bytes == 37_440

    def test_aligned_page_is_not_padded(self) -> None:
        """An already aligned page leaves page_size_padded unset."""
        assert mla(alignment=576).page_size_padded is None

    def test_evolve_spec_recomputes_padding(self) -> None:
        """evolve_spec recomputes alignment padding instead of keeping a stale value."""
        spec = compressed_mla()
        doubled = evolve_spec(spec, block_size=512)
        assert doubled.page_size_bytes == 74_880
        aligned = evolve_spec(spec, block_size=256 * 9)  # 576 states x 584 B is aligned
        assert aligned.page_size_padded is None

    def test_sliding_window_mla_alignment(self) -> None:
        """SW-MLA pads by alignment like MLA."""
        spec = window_mla(128, **COMPRESSED_MLA)
        assert spec.page_size_bytes == 37_440


class TestValidation:
    # Zero and negative sizes (block_size, num_kv_heads, head_size) are
    # test_errors.py's TestSpecErrors.test_field_named.

    def test_unknown_dtype(self) -> None:
        """An unknown dtype name raises SpecError naming dtype."""
        with pytest.raises(SpecError, match="dtype='nonsense'"):
            full(dtype="nonsense")

    def test_padded_page_below_real_page(self) -> None:
        """page_size_padded below the real page raises SpecError naming the field."""
        with pytest.raises(SpecError, match="page_size_padded=1000"):
            full(page_size_padded=1000)

    def test_mamba_padded_below_state(self) -> None:
        """A Mamba page_size_padded below its state size raises SpecError."""
        with pytest.raises(SpecError, match="page_size_padded"):
            MambaSpec(block_size=16, shapes=[[1024]], dtypes=["fp32"], page_size_padded=8)

    @pytest.mark.parametrize("value", [0, -4, True, 1.5])
    def test_block_stride_alignment_not_positive(self, value: object) -> None:
        """block_stride_alignment <= 0 (or not an int) raises SpecError naming the field."""
        with pytest.raises(SpecError, match="block_stride_alignment"):
            full(block_stride_alignment=value)

    def test_multiple_of_not_positive(self) -> None:
        """MultipleOf(0) raises SpecError."""
        with pytest.raises(SpecError, match="n=0"):
            MultipleOf(0)

    def test_mamba_shapes_dtypes_mismatch(self) -> None:
        """Mamba with more shapes than dtypes raises SpecError naming both."""
        with pytest.raises(SpecError, match="2 shapes but 1 dtypes"):
            MambaSpec(block_size=16, shapes=[[4], [4]], dtypes=["fp32"])


class TestBlockStrideAlignment:
    def test_none_is_one(self) -> None:
        """No alignment gives 1."""
        assert full().get_block_stride_alignment() == 1

    def test_int_is_itself(self) -> None:
        """An int alignment is returned as is."""
        assert full(block_stride_alignment=4096).get_block_stride_alignment() == 4096

    def test_multiple_of_dividing_block(self) -> None:
        """MultipleOf(b) with gcd(b, block_size) == block_size gives 1."""
        assert full(block_stride_alignment=MultipleOf(32)).get_block_stride_alignment() == 1

    def test_multiple_of_kernel_block_page(self) -> None:
        """MultipleOf(24) on block 16 gives the page at kbs = gcd(24, 16) = 8 tokens."""
        spec = full(block_stride_alignment=MultipleOf(24))
        assert spec.get_block_stride_alignment() == 8 * 8 * 512

    def test_multiple_of_keeps_padded_page(self) -> None:
        """The kernel-block page carries page_size_padded over, as dataclasses.replace does."""
        spec = full(block_stride_alignment=MultipleOf(24), page_size_padded=70_000)
        assert spec.get_block_stride_alignment() == 70_000

    def test_block_stride_rounds_up(self) -> None:
        """block_stride is round_up(page, alignment)."""
        assert full(heads=1, block_stride_alignment=3000).block_stride == 9000


class TestMaxMemoryUsage:
    def test_sliding_window_3_8b(self) -> None:
        """SW window 128: cdiv(min(127 + 2048, 8192), 16) + 1 = 137 blocks.

        See contract.md#grouping-examples, model (b).
        """
        spec = sw(dcp_sharded=False)
        assert spec.page_size_bytes == 32_768
        assert spec.max_memory_usage_bytes(CFG_B) == 137 * 32_768

    def test_full_3_8b(self) -> None:
        """Full attention at L = 8192, block 16: 512 blocks.

        See contract.md#grouping-examples, model (b).
        """
        spec = full(head_size=64)
        assert spec.max_memory_usage_bytes(CFG_B) == 512 * 32_768

    def test_sliding_window_extra_retained(self) -> None:
        """extra_retained_tokens widens the window: cdiv(127 + 16 + 2048, 16) + 1 = 138."""
        assert sw(extra_retained_tokens=16).max_memory_usage_bytes(CFG_B) == 138 * 32_768

    def test_sliding_window_capped_by_max_model_len(self) -> None:
        """A window longer than max_model_len is capped: cdiv(8192, 16) + 1 = 513."""
        assert sw(window=100_000).max_memory_usage_bytes(CFG_B) == 513 * 32_768

    def test_sliding_window_dcp_sharded_rejected(self) -> None:
        """A DCP-sharded sliding window with DCP > 1 raises SpecError."""
        cfg = PlanningConfig(decode_context_parallel_size=2)
        with pytest.raises(SpecError, match="decode_context_parallel_size=2"):
            sw().max_memory_usage_bytes(cfg)

    def test_full_dcp_sharded(self) -> None:
        """DCP-sharded full attention divides the length: cdiv(8192, 2) / 16 = 256 blocks."""
        cfg = PlanningConfig(decode_context_parallel_size=2)
        assert full().max_memory_usage_bytes(cfg) == 256 * 65_536
        assert full(dcp_sharded=False).max_memory_usage_bytes(cfg) == 512 * 65_536

    def test_mla(self) -> None:
        """MLA uses the full-attention formula: cdiv(163840, 64) * 73,728."""
        cfg = PlanningConfig(max_model_len=163_840)
        assert mla().max_memory_usage_bytes(cfg) == 2560 * 73_728

    def test_chunked_local(self) -> None:
        """Chunked local: cdiv(min(8192 + 2*8192, 65536), 16) * page."""
        cfg = PlanningConfig(max_model_len=65_536, max_num_batched_tokens=8192)
        spec = ChunkedLocalAttentionSpec(
            block_size=16, num_kv_heads=8, head_size=128, dtype="bf16", attention_chunk_size=8192
        )
        assert spec.max_memory_usage_bytes(cfg) == 1536 * 65_536

    def test_cross_attention(self) -> None:
        """Cross attention: cdiv(1500 encoder tokens, 16) = 94 blocks of 81,920 B (Whisper)."""
        cfg = PlanningConfig(max_model_len=448, max_num_encoder_input_tokens=1500)
        spec = CrossAttentionSpec(block_size=16, num_kv_heads=20, head_size=64, dtype="float16")
        assert spec.page_size_bytes == 81_920
        assert spec.max_memory_usage_bytes(cfg) == 94 * 81_920

    def test_cross_attention_default_budget(self) -> None:
        """Without an encoder budget, cross attention uses max_num_batched_tokens."""
        spec = CrossAttentionSpec(block_size=16, num_kv_heads=20, head_size=64, dtype="float16")
        assert spec.max_memory_usage_bytes(CFG_B) == 64 * 81_920

    def test_circular_buffer(self) -> None:
        """A circular buffer holds one page per request."""
        spec = CircularBufferSpec(block_size=16, num_kv_heads=1, head_size=64, dtype="bf16")
        assert spec.max_memory_usage_bytes(CFG_B) == spec.page_size_bytes

    def test_encoder_only(self) -> None:
        """Encoder-only layers keep nothing."""
        spec = EncoderOnlyAttentionSpec(block_size=16, num_kv_heads=12, head_size=64, dtype="fp32")
        assert spec.page_size_bytes == 98_304
        assert spec.max_memory_usage_bytes(CFG_B) == 0

    @pytest.mark.parametrize(
        ("cfg", "pages"),
        [
            pytest.param(CFG_B, 1 + 2, id="default-mode"),
            pytest.param(PlanningConfig(mamba_cache_mode="align"), 2 + 2 + 3, id="align-mode"),
        ],
    )
    def test_mamba_modes(self, cfg: PlanningConfig, pages: int) -> None:
        """Mamba needs page * (1 + speculative blocks) outside align mode.

        The config's align mode needs page * (2 + speculative + checkpoint blocks).
        """
        spec = MambaSpec(
            block_size=80,
            shapes=[[4, 1024]],
            dtypes=["bf16"],
            num_speculative_blocks=2,
            num_prefill_checkpoint_blocks=3,
        )
        assert spec.max_memory_usage_bytes(cfg) == pages * 8192

    def test_uniform_type_wrapper(self) -> None:
        """A wrapper needs max pages over layers times the summed page."""
        wrapper = UniformTypeKVCacheSpecs(kv_cache_specs={"a": full(), "b": full(heads=4)})
        assert wrapper.page_size_bytes == 98_304
        assert wrapper.max_memory_usage_pages(CFG_B) == 512
        assert wrapper.max_memory_usage_bytes(CFG_B) == 512 * 98_304


class TestMerge:
    def test_window_none_merges_with_window(self) -> None:
        """None + 1024 merges to sliding_window 1024 (contract.md#merge-rules)."""
        merged = FullAttentionSpec.merge([full(), full(sliding_window=1024)])
        assert isinstance(merged, FullAttentionSpec)
        assert merged.sliding_window == 1024

    def test_two_windows_conflict(self) -> None:
        """Two different windows raise ConflictingWindowError (vLLM ValueError)."""
        with pytest.raises(ConflictingWindowError, match="sliding_window"):
            FullAttentionSpec.merge([full(sliding_window=512), full(sliding_window=1024)])

    def test_window_and_chunk_incompatible(self) -> None:
        """A window and a chunk size in one merge are incompatible (vLLM AssertionError)."""
        with pytest.raises(IncompatibleSpecsError):
            FullAttentionSpec.merge([full(sliding_window=512), full(attention_chunk_size=8192)])

    def test_field_mismatch_named(self) -> None:
        """A differing compare field is named in the error."""
        with pytest.raises(IncompatibleSpecsError, match="num_kv_heads"):
            FullAttentionSpec.merge([full(), full(heads=4)])

    def test_full_rejects_mla(self) -> None:
        """Full-attention merge rejects MLA specs."""
        with pytest.raises(IncompatibleSpecsError, match="MLAAttentionSpec"):
            FullAttentionSpec.merge([full(), mla()])

    def test_non_causal_any(self) -> None:
        """non_causal is true if any spec is."""
        merged = FullAttentionSpec.merge([full(), full(non_causal=True)])
        assert isinstance(merged, FullAttentionSpec)
        assert merged.non_causal

    def test_mla_drops_alignment_keeps_padding(self) -> None:
        """MLA merge keeps page_size_padded and drops alignment."""
        spec = compressed_mla()
        merged = MLAAttentionSpec.merge([spec, spec])
        assert isinstance(merged, MLAAttentionSpec)
        assert merged.alignment is None
        assert merged.page_size_bytes == 37_440

    def test_mla_role_mismatch(self) -> None:
        """MLA specs with different cache roles do not merge."""
        with pytest.raises(IncompatibleSpecsError, match="cache_role"):
            MLAAttentionSpec.merge([mla(cache_role="SPARSE"), mla(cache_role="INDEXER")])

    def test_base_rule_equality(self) -> None:
        """Sliding windows merge only when equal."""
        assert SlidingWindowSpec.merge([sw(), sw()]) == sw()
        with pytest.raises(IncompatibleSpecsError):
            SlidingWindowSpec.merge([sw(), sw(window=256)])

    def test_is_draft_outside_equality(self) -> None:
        """is_draft is excluded from equality and hash."""
        assert sw(is_draft=True) == sw()
        assert hash(sw(is_draft=True)) == hash(sw())


class TestUniformType:
    def test_full_and_mla_are_one_type(self) -> None:
        """MLA and full attention share the FullAttentionSpec type base."""
        assert UniformTypeKVCacheSpecs.is_uniform_type([full(block_size=64), mla()])

    def test_asymmetric_sw_and_sw_mla(self) -> None:
        """[SW, SW-MLA] with one window passes while the reverse order fails.

        See contract.md#uniform-type-groups.
        """
        swm = window_mla(128, block_size=16)
        assert UniformTypeKVCacheSpecs.is_uniform_type([sw(), swm])
        assert not UniformTypeKVCacheSpecs.is_uniform_type([swm, sw()])

    def test_block_size_must_match(self) -> None:
        """Different block sizes are not one type."""
        assert not UniformTypeKVCacheSpecs.is_uniform_type([full(), full(block_size=32)])

    def test_dcp_sharded_must_match(self) -> None:
        """Different dcp_sharded values are not one type."""
        assert not UniformTypeKVCacheSpecs.is_uniform_type([full(), full(dcp_sharded=False)])

    def test_windows_must_match(self) -> None:
        """Sliding windows of different sizes are not one type."""
        assert not UniformTypeKVCacheSpecs.is_uniform_type([sw(), sw(window=256)])

    def test_mamba_pages_must_match(self) -> None:
        """Mamba specs with different pages are not one type."""
        a = MambaSpec(block_size=16, shapes=[[4]], dtypes=["fp32"])
        b = MambaSpec(block_size=16, shapes=[[8]], dtypes=["fp32"])
        assert not UniformTypeKVCacheSpecs.is_uniform_type([a, b])

    def test_circular_buffer_pages_may_differ(self) -> None:
        """Circular buffers of any page are one type."""
        a = CircularBufferSpec(block_size=16, num_kv_heads=1, head_size=64, dtype="bf16")
        b = attrs.evolve(a, num_kv_heads=2)
        assert UniformTypeKVCacheSpecs.is_uniform_type([a, b])

    def test_from_specs(self) -> None:
        """from_specs wraps one type and returns None otherwise."""
        wrapper = UniformTypeKVCacheSpecs.from_specs({"a": full(), "b": full(heads=2)})
        assert wrapper is not None
        assert wrapper.block_size == 16
        assert list(iter_layer_specs(wrapper)) == [full(), full(heads=2)]
        assert UniformTypeKVCacheSpecs.from_specs({"a": full(), "b": sw()}) is None

    def test_max_layers_per_page_size(self) -> None:
        """The largest class of layers sharing one page size is counted."""
        wrapper = UniformTypeKVCacheSpecs(
            kv_cache_specs={"a": full(), "b": full(heads=2), "c": full(), "d": full(heads=4)}
        )
        assert wrapper.get_max_layers_per_page_size() == 2

    def test_wrapper_copies_input(self) -> None:
        """The wrapper keeps a private copy of the caller's dict."""
        layers = {"a": full()}
        wrapper = UniformTypeKVCacheSpecs(kv_cache_specs=layers)
        layers["b"] = full()
        assert list(wrapper.kv_cache_specs) == ["a"]


class TestFullAttentionVariants:
    """Sink and RSWA specs plan as full attention (contract.md#spec-kinds)."""

    def test_sink_merges_with_full(self) -> None:
        """A sink layer and a plain full layer of one geometry form one uniform group."""
        from kvref import FullAttentionSpec, PlanningConfig, ReferenceKVCacheConfigBuilder
        from kvref.specs import SinkFullAttentionSpec

        kw = {"block_size": 16, "num_kv_heads": 8, "head_size": 64, "dtype": "bfloat16"}
        specs = {"a": SinkFullAttentionSpec(sink_len=4, **kw), "b": FullAttentionSpec(**kw)}
        groups = ReferenceKVCacheConfigBuilder().get_kv_cache_groups(PlanningConfig(), specs)
        assert [g.layer_names for g in groups] == [("a", "b")]
        assert groups[0].kv_cache_spec.page_size_bytes == 16 * 8 * 128 * 2

    def test_rswa_windows_must_match(self) -> None:
        """RSWA specs with different rswa_window do not merge; equal ones do."""
        import pytest

        from kvref.errors import IncompatibleSpecsError
        from kvref.specs import RSWASpec

        kw = {"block_size": 16, "num_kv_heads": 8, "head_size": 64, "dtype": "bfloat16"}
        a, b = RSWASpec(rswa_window=128, **kw), RSWASpec(rswa_window=256, **kw)
        assert RSWASpec.merge([a, a]) == a
        with pytest.raises(IncompatibleSpecsError, match="rswa_window"):
            RSWASpec.merge([a, b])


class TestFieldsOf034:
    """The spec fields vLLM 0.34.0 added, their checks and their merge rules."""

    @staticmethod
    def mamba(**kw: Any) -> MambaSpec:
        # States of 8,000 and 131,072 bytes.
        return MambaSpec(
            block_size=16, shapes=((4, 1000), (8, 64, 64)), dtypes=("bfloat16", "float32"), **kw
        )

    def test_state_alignment_rounds_every_state(self) -> None:
        """Each state is rounded up on its own: 8,192 + 131,072 at 256 bytes, 139,072 at 1."""
        assert self.mamba().page_size_bytes == 139_072
        assert self.mamba(state_alignment=256).page_size_bytes == 139_264

    @pytest.mark.parametrize("value", [0, -4, True, "8", 2.0])
    def test_bad_state_alignment_names_the_field(self, value: object) -> None:
        """Not a positive int: a SpecError naming the field and the value."""
        with pytest.raises(SpecError, match=rf"MambaSpec\.state_alignment={value!r}"):
            self.mamba(state_alignment=value)

    def test_padded_page_must_be_aligned(self) -> None:
        """A padded page that is no multiple of the alignment is refused (vLLM asserts it)."""
        with pytest.raises(SpecError, match=r"page_size_padded=139300 must be a multiple of"):
            self.mamba(state_alignment=256, page_size_padded=139_300)
        assert self.mamba(state_alignment=256, page_size_padded=139_520).page_size_bytes == 139_520

    def test_state_alignment_splits_uniform_type(self) -> None:
        """Mamba layers of one page but different alignments are not of one type."""
        a, b = (
            self.mamba(page_size_padded=140_000),
            self.mamba(state_alignment=16, page_size_padded=140_000),
        )
        assert a.page_size_bytes == b.page_size_bytes
        assert not a.is_uniform_with_collection([a, b])

    def test_kv_head_major_slots_is_identity(self) -> None:
        """Equality and hash see the field, so the full-attention merge refuses a mix."""
        plain, major = full(), full(kv_head_major_slots=True)
        assert plain != major and hash(plain) != hash(major)
        with pytest.raises(IncompatibleSpecsError, match="kv_head_major_slots"):
            FullAttentionSpec.merge([plain, major])
        assert FullAttentionSpec.merge([major, major]).kv_head_major_slots  # type: ignore[attr-defined]

    @pytest.mark.parametrize(
        ("make", "field"),
        [
            (lambda: full(kv_head_major_slots=1), "FullAttentionSpec.kv_head_major_slots=1"),
            (
                lambda: window_mla(128, non_causal_multi_token_decode="yes"),
                "SlidingWindowMLASpec.non_causal_multi_token_decode='yes'",
            ),
        ],
    )
    def test_bool_fields_refuse_other_values(self, make: Any, field: str) -> None:
        """The new flags take bools only; the error names the field and the value."""
        with pytest.raises(SpecError, match=field.replace(".", r"\.")):
            make()

    def test_sliding_window_mla_merge_by_release(self) -> None:
        """0.33.0 drops quant mode and alignment to their defaults; 0.34.0 needs them equal."""
        from kvref.versions import V0_33, V0_34, rules

        fp8 = window_mla(128, kv_quant_mode="FP8_PER_TENSOR", alignment=576)
        plain = window_mla(128)
        old = SlidingWindowMLASpec.merge([fp8, fp8], rules(V0_33))
        assert (old.kv_quant_mode, old.alignment) == ("NONE", None)  # type: ignore[attr-defined]
        new = SlidingWindowMLASpec.merge([fp8, fp8], rules(V0_34))
        assert (new.kv_quant_mode, new.alignment) == ("FP8_PER_TENSOR", 576)  # type: ignore[attr-defined]
        assert SlidingWindowMLASpec.merge([fp8, plain], rules(V0_33)) is not None
        with pytest.raises(IncompatibleSpecsError, match="kv_quant_mode"):
            SlidingWindowMLASpec.merge([fp8, plain], rules(V0_34))
        with pytest.raises(IncompatibleSpecsError, match="kv_quant_mode"):
            SlidingWindowMLASpec.merge([fp8, plain])  # no rules: the newest release's

    def test_non_causal_multi_token_decode_is_or_ed(self) -> None:
        """One SW-MLA layer with the flag gives its merged spec the flag."""
        merged = SlidingWindowMLASpec.merge(
            [window_mla(128), window_mla(128, non_causal_multi_token_decode=True)]
        )
        assert merged.non_causal_multi_token_decode  # type: ignore[attr-defined]
