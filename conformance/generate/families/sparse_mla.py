"""Sparse-MLA families: several caches per decoder layer, shared tuples, compressed latents.

The specs are the ones vLLM 0.33.0's model code reports for these models
(``get_kv_cache_spec`` of their attention, indexer, compressor and
sliding-window cache layers), with head sizes, dtypes, alignments and
compress ratios from the models' published configs; only the layer count
is small.  Every decoder layer's caches share the layer's name prefix
(``model.layers.7.attn``, ``model.layers.7.attn.indexer.k_cache``, ...), and
MTP draft layers come last, continuing the target's layer numbering.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from hypothesis import strategies as st

from conformance.check.geometry import cdiv, round_up
from conformance.generate.records import Model
from conformance.generate.sampled_from_cache import pick
from conformance.generate.specs import kernel_block_alignments, rarely, state_bytes
from kvref.specs import (
    CircularBufferSpec,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    MultipleOf,
    SlidingWindowMLASpec,
)

__all__ = [
    "deepseek_v32_models",
    "deepseek_v4_models",
    "glm5_models",
    "v32_attention",
    "v32_indexer",
]

#: DeepSeek-V4 layer kinds by compress ratio: 0 sliding window only, 4 CSA, 128 HCA.
_DSV4_RATIOS = (4, 128, 0)
#: The indexer key: 128 fp8 values plus one fp32 scale per 128 (DeepSeek-V3.2/V4, GLM-5).
_INDEX_HEAD = 128 + 128 // 128 * 4


def _dsv4_ratios(draw: st.DrawFn, layers: int) -> list[int]:
    """Per-layer compress ratios: the default V4 pattern or any mix of SWA/CSA/HCA."""
    if draw(st.booleans()):
        # DeepseekV4Config's default: two HCA layers, then HCA/CSA alternating.
        return [128 if i < 2 or i % 2 == 0 else 4 for i in range(layers)]
    return [pick(draw, _DSV4_RATIOS) for _ in range(layers)]


def _dsv4_layer(
    prefix: str, ratio: int, fp8: bool, block: int, draft: bool, kernel: MultipleOf | None = None
) -> dict[str, KVCacheSpec]:
    """The caches of one DeepSeek-V4 decoder layer (attention, compressor, indexer, SWA).

    ``kernel`` is the indexer backend's kernel block (``None``: the cache block).
    """
    packed: dict[str, Any] = (
        {"dtype": torch.uint8, "cache_dtype_str": "fp8_ds_mla", "alignment": 576}
        if fp8
        else {"dtype": torch.bfloat16, "cache_dtype_str": "auto", "alignment": 512}
    )
    common: dict[str, Any] = {"num_kv_heads": 1, "max_tp_shards": 1, "is_draft": draft}
    # The compressed-state layout: 448 NoPE + 128 RoPE bytes + an 8-byte scale.
    content: dict[str, Any] = {"state_content_bytes": 584} if fp8 else {}
    caches: dict[str, KVCacheSpec] = {}
    if ratio > 1:
        caches[prefix] = MLAAttentionSpec(
            block_size=block,
            head_size=512,
            tokens_per_state=ratio,
            model_version="deepseek_v4",
            **packed,
            **content,
            **common,
        )
        overlap = 2 if ratio == 4 else 1  # C4 compressors keep two overlapping windows
        caches[f"{prefix}.compressor.state_cache"] = SlidingWindowMLASpec(
            block_size=4 if ratio == 4 else 8,
            head_size=2 * overlap * 512,
            dtype=torch.float32,
            sliding_window=overlap * ratio,
            alignment=packed["alignment"],
            **common,
        )
    if ratio == 4:
        # Only CSA layers index: an fp8 key cache and its own compressor.
        caches[f"{prefix}.indexer.k_cache"] = MLAAttentionSpec(
            block_size=block,
            head_size=_INDEX_HEAD,
            dtype=torch.uint8,
            tokens_per_state=ratio,
            alignment=packed["alignment"],
            block_stride_alignment=kernel,
            **common,
        )
        caches[f"{prefix}.indexer.compressor.state_cache"] = SlidingWindowMLASpec(
            block_size=4,
            head_size=2 * 2 * 128,
            dtype=torch.float32,
            sliding_window=8,
            alignment=packed["alignment"],
            **common,
        )
    caches[f"{prefix}.swa_cache"] = SlidingWindowMLASpec(
        block_size=64,
        head_size=512,
        sliding_window=128,
        model_version="deepseek_v4",
        **packed,
        **content,
        **common,
    )
    return caches


@st.composite
def _deepseek_v4_models(draw: st.DrawFn, max_layers: int) -> Model:
    layers = draw(st.integers(1, max(1, min(6, max_layers // 3))))
    ratios = _dsv4_ratios(draw, layers)
    fp8 = draw(st.booleans())
    # 256 tokens per block: 64 compressed C4 states, 2 C128 states.
    block = 256 if not rarely(draw) else 128
    mtp = draw(st.integers(0, 1))
    # The indexer kernels may read a cache block as several kernel blocks.
    kernel = draw(kernel_block_alignments(block, 4))
    specs: dict[str, KVCacheSpec] = {}
    for i, ratio in enumerate(ratios):
        specs.update(_dsv4_layer(f"model.layers.{i}.attn", ratio, fp8, block, False, kernel))
    # MTP layers: sliding window only in V4; V4.1-style configs may compress them.
    mtp_ratio = pick(draw, [0, 4]) if mtp else 0
    for k in range(mtp):
        prefix = f"model.layers.{layers + k}.mtp_block.attn"
        specs.update(_dsv4_layer(prefix, mtp_ratio, fp8, block, True, kernel))
    kinds = "/".join({0: "SWA", 4: "CSA", 128: "HCA"}[r] for r in ratios)
    return Model(
        specs,
        f"DeepSeek-V4-like ({'fp8_ds_mla' if fp8 else 'bf16'}): {layers} layers {kinds}"
        + (f" + MTP (C{mtp_ratio})" if mtp else "")
        + _kernel_note(kernel),
        num_hidden_layers=layers,
    )


def deepseek_v4_models(*, max_layers: int = 64) -> st.SearchStrategy[Model]:
    """DeepSeek-V4-style shared-tuple layouts (DeepSeek-V4-Flash/Pro, V4.1; 1-6 layers).

    Per decoder layer ``model.layers.{i}.attn``: a sliding-window MLA cache
    (``swa_cache``, window 128, block 64); on compressed layers a compressed
    MLA latent with ``tokens_per_state`` = the compress ratio (4 for CSA,
    128 for HCA; block 256) and the compressor's fp32 state cache (a
    sliding-window MLA spec); on CSA layers also the indexer's fp8 key cache
    (``tokens_per_state`` 4) and its compressor state.  ``fp8_ds_mla``
    (uint8, 584-byte states, alignment 576) or bf16 (alignment 512).  Rarely an
    MTP draft layer, which may carry the CSA caches too.  The indexer's
    kernel block is the cache block or a smaller one
    (:func:`~conformance.generate.specs.kernel_block_alignments`).  Never more than
    six decoder layers.
    """
    return _deepseek_v4_models(max_layers)


def _kernel_note(kernel: MultipleOf | None) -> str:
    return f", indexer kernel block {kernel.n}" if kernel is not None else ""


def _v32_attention(
    fp8: bool, block: int, draft: bool, leader: bool, **extra: Any
) -> MLAAttentionSpec:
    # vLLM's MLA layer reports itself an index-group leader exactly when it
    # owns an indexer (mla_attention.py: ``is_index_group_leader=self.indexer is not None``).
    common: dict[str, Any] = {
        "block_size": block,
        "num_kv_heads": 1,
        "max_tp_shards": 1,
        "head_size": 576,
        "is_draft": draft,
        "is_index_group_leader": leader,
        **extra,
    }
    if fp8:
        return MLAAttentionSpec(
            dtype=torch.uint8,
            cache_dtype_str="fp8_ds_mla",
            state_content_bytes=656,  # 512 fp8 NoPE + 16 fp32 scales + 64 bf16 RoPE
            **common,
        )
    return MLAAttentionSpec(dtype=torch.bfloat16, cache_dtype_str="auto", **common)


def _index_cache_skips(draw: st.DrawFn, layers: int) -> list[bool]:
    """Which target layers skip their indexer: none, or IndexCache's pattern.

    DeepSeek-V3.2-style configs with IndexCache (``index_topk_freq``, default
    1: no skipping; ``index_skip_topk_offset``, default 2) keep the indexer
    only on layers ``i`` with ``max(i - offset + 1, 0) % freq == 0``; the
    others reuse the previous layer's top-k (vLLM's ``deepseek_v2.py``).
    """
    # Released V3.2 checkpoints index every layer; IndexCache's skipping is a
    # variant, so it is drawn one time in four: a platform gate that wants
    # every layer indexed then opens on most of the family's examples.
    if draw(st.integers(0, 3)) != 3:
        return [False] * layers
    freq = pick(draw, [2, 4])
    offset = pick(draw, [2, 1, 3])
    return [max(i - offset + 1, 0) % freq != 0 for i in range(layers)]


def _indexer(block: int, tokens_per_state: int, draft: bool, **extra: Any) -> MLAAttentionSpec:
    return MLAAttentionSpec(
        block_size=block,
        num_kv_heads=1,
        max_tp_shards=1,
        head_size=_INDEX_HEAD,
        dtype=torch.uint8,
        tokens_per_state=tokens_per_state,
        cache_role="INDEXER",
        is_draft=draft,
        **extra,
    )


@st.composite
def _deepseek_v32_models(draw: st.DrawFn, max_layers: int) -> Model:
    layers = draw(st.integers(1, max(1, min(8, max_layers // 2))))
    fp8 = draw(st.booleans())
    block = pick(draw, [64, 16, 128])
    mtp = draw(st.integers(0, 1)) if rarely(draw) else 0
    # MTP layers always build the full indexer (they compute the top-k of draft step 0).
    skips = _index_cache_skips(draw, layers) + [False] * mtp
    kernel = draw(kernel_block_alignments(block))
    specs: dict[str, KVCacheSpec] = {}
    for i in range(layers + mtp):
        draft = i >= layers
        indexed = not skips[i]
        specs[f"model.layers.{i}.self_attn.attn"] = _v32_attention(fp8, block, draft, indexed)
        if indexed:
            specs[f"model.layers.{i}.self_attn.indexer.k_cache"] = _indexer(
                block, 1, draft, block_stride_alignment=kernel
            )
    indexers = layers - sum(skips)
    return Model(
        specs,
        f"DeepSeek-V3.2-like sparse MLA ({'fp8_ds_mla' if fp8 else 'bf16'}): {layers} layers "
        f"x MLA, {indexers} with an indexer" + (" + MTP" if mtp else "") + _kernel_note(kernel),
        num_hidden_layers=layers,
    )


#: A DeepSeek-V3.2 layer's latent and indexer specs, for families that serve its target.
v32_attention = _v32_attention
v32_indexer = _indexer


def deepseek_v32_models(*, max_layers: int = 64) -> st.SearchStrategy[Model]:
    """Sparse-attention indexers (DeepSeek-V3.2-Exp, GLM-5 without linear layers; 1-8 layers).

    Per layer an MLA cache (576 wide; bf16, or ``fp8_ds_mla`` with 656-byte
    states) and the lightning indexer's fp8 key cache (``cache_role``
    ``INDEXER``, 132 bytes per token), one block size; rarely an MTP draft
    layer with both.  Structure drawn: every layer indexed (V3.2, V3.2-Exp;
    three draws in four), or IndexCache's skipping (``index_topk_freq`` 2 or 4, offsets 1-3):
    skipping layers keep only their latent, not an index-group leader.
    The indexer's kernel block is the cache block or a smaller one.
    """
    return _deepseek_v32_models(max_layers)


def _kda_state(tp: int) -> tuple[tuple[tuple[int, ...], ...], tuple[torch.dtype, ...]]:
    """GLM-5's KDA state at TP ``tp``: a 3-wide conv over q, k, v and a 128x128 state per head."""
    heads = 64 // tp
    conv = (3, heads * 128 * 3)
    return (conv, (heads, 128, 128)), (torch.bfloat16, torch.float32)


@st.composite
def _glm5_models(draw: st.DrawFn, max_layers: int) -> Model:
    periods = draw(st.integers(1, max(1, min(2, max_layers // 4))))
    layers = 4 * periods
    tp = pick(draw, [8, 4, 16])
    shapes, dtypes = _kda_state(tp)
    state = state_bytes(shapes, dtypes)
    token_bytes = 512 * 2  # the 512-wide bf16 latent (kv_lora_rank 512, no RoPE part)
    kpool, spec_tokens = 16, pick(draw, [0, 1, 3])
    ring = kpool * (1 << max(0, cdiv(kpool + spec_tokens, kpool) - 1).bit_length())
    # A kpool indexer whose tail (the tokens of a chunk not yet compressed) is
    # kept in a ring, or recomputed from the latent with no ring: the ring
    # takes BLHNC only, the ringless variant both block-outer layouts
    # (allowed_layouts).  Shrinks to the ring kept, as V3.2 shrinks to every
    # layer indexed: an absent part is not the minimum.
    tail = not draw(st.booleans())
    shaped = draw(st.booleans())
    if shaped:
        # The platform raises the attention block so an MLA page holds the
        # KDA state, a multiple of the ring and of 16, and pads the state page to it.
        block = round_up(cdiv(state, token_bytes), max(ring, 16))
        padded: int | None = block * token_bytes
    else:
        block, padded = max(64, ring), None
    mode = pick(draw, ["align", "none", "all"])
    checkpoint = rarely(draw)
    kda = MambaSpec(
        block_size=block if mode != "none" else pick(draw, [8192, 2048]),
        shapes=shapes,
        dtypes=dtypes,
        page_size_padded=padded,
        mamba_type="LINEAR",
        mamba_cache_mode=mode,
        num_speculative_blocks=spec_tokens,
        num_prefill_checkpoint_blocks=int(checkpoint),
        prefill_checkpoint_alignment=64 if checkpoint else None,
    )
    mtp = 1 if spec_tokens else 0
    kernel = draw(kernel_block_alignments(block, kpool))
    specs: dict[str, KVCacheSpec] = {}
    for i in range(layers + mtp):
        draft = i >= layers
        if i % 4 != 3 and not draft:
            specs[f"model.layers.{i}.self_attn"] = kda
            continue
        prefix = f"model.layers.{i}.self_attn"
        specs.update(_glm5_indexed_layer(prefix, block, ring if tail else None, draft, kernel))
    return Model(
        specs,
        f"GLM-5-like (TP {tp}, {'pre-shaped' if shaped else 'unpadded'} pages, mode {mode}): "
        f"{3 * periods} KDA + {periods} indexed MLA"
        + (" + MTP" if mtp else "")
        + ("" if tail else ", no tail ring")
        + _kernel_note(kernel),
        num_hidden_layers=layers,
    )


def _glm5_indexed_layer(
    prefix: str, block: int, ring: int | None, draft: bool, kernel: MultipleOf | None = None
) -> dict[str, KVCacheSpec]:
    """MLA, the kpool indexer (16 tokens per state) and its tail ring of one GLM-5 layer.

    ``ring`` is the tail ring's block size (``None``: no ring); ``kernel`` is the
    indexer backend's kernel block (``None``: the cache block).
    """
    specs: dict[str, KVCacheSpec] = {
        f"{prefix}.attn": MLAAttentionSpec(
            block_size=block,
            num_kv_heads=1,
            max_tp_shards=1,
            head_size=512,
            dtype=torch.bfloat16,
            cache_dtype_str="auto",
            topk_buffer_width=round_up(2048 + 16 - 1, 128),
            is_draft=draft,
        ),
        f"{prefix}.indexer.k_cache": _indexer(block, 16, draft, block_stride_alignment=kernel),
    }
    if ring is not None:
        specs[f"{prefix}.indexer.tail_cache"] = CircularBufferSpec(
            block_size=ring,
            num_kv_heads=2,
            head_size=128,
            head_size_v=0,
            dtype=torch.bfloat16,
            dcp_sharded=False,
            is_draft=draft,
        )
    return specs


def glm5_models(*, max_layers: int = 64) -> st.SearchStrategy[Model]:
    """GLM-5-style hybrids (GLM-5.3-Flash / glm5_next; 4 or 8 layers, MTP when speculating).

    Three KDA linear-attention layers (Mamba specs, ``LINEAR``: bf16 conv
    over q/k/v and fp32 128x128 states, TP-sharded heads) per indexed MLA
    layer, which holds a 512-wide MLA latent, the kpool indexer's fp8 key
    cache with ``tokens_per_state`` 16 and, in the variant that keeps the
    indexer's tail in a ring rather than recomputing it, its bf16 tail ring
    (``CircularBufferSpec``, which only BLHNC serves; without it BLNHC too).
    Never layer-outer: vLLM 0.33.0 unifies a hybrid's page sizes there, and
    the indexer's page divides no state page, so its planner refuses (as
    kvref does) the layouts field builders use with their own placement.  The indexer's
    kernel block is the cache block or a smaller one
    (:func:`~conformance.generate.specs.kernel_block_alignments`).  Pages
    either pre-shaped by the platform (the MLA block raised until one page
    holds the KDA state, which is padded to it) or unpadded.  With
    speculative tokens an MTP draft layer with the MLA, indexer and tail
    caches comes last.
    """
    return _glm5_models(max_layers)


FAMILIES: dict[str, Callable[..., st.SearchStrategy[Model]]] = {
    "deepseek_v4": deepseek_v4_models,
    "deepseek_v32": deepseek_v32_models,
    "glm5": glm5_models,
}
