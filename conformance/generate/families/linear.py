"""Linear-attention / state-space hybrids as vLLM reports them: Qwen3-Next, Nemotron-H, Jamba.

State shapes follow vLLM's ``MambaStateShapeCalculator`` for each layer
kind (gated delta net, Mamba2, Mamba1) with the models' published head
counts and sizes, sharded over a drawn tensor-parallel size; attention uses
the models' KV heads (sharded too) and head sizes.  Pages are mostly
pre-shaped as vLLM's platform config does (the attention block raised so
one attention page holds a state, and the state page padded to it).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from hypothesis import strategies as st

from conformance.check.geometry import cdiv
from conformance.generate.records import Model
from conformance.generate.sampled_from_cache import pick
from conformance.generate.specs import rarely, state_bytes
from kvref.specs import FullAttentionSpec, KVCacheSpec, MambaSpec

__all__ = ["jamba_models", "nemotron_h_models", "qwen3_next_models"]

_Shapes = tuple[tuple[int, ...], ...]


@st.composite
def _pair(
    draw: st.DrawFn,
    shapes: _Shapes,
    dtypes: tuple[torch.dtype, ...],
    kv_heads: int,
    head_size: int,
    mamba_type: str,
    spec_blocks: int,
) -> tuple[FullAttentionSpec, MambaSpec, str]:
    """An attention spec and a state spec, with pages pre-shaped by the platform or not."""
    token_bytes = 2 * kv_heads * head_size * 2  # bf16 K and V
    state = state_bytes(shapes, dtypes)
    shaped = not rarely(draw)
    if shaped:
        block = 16 * cdiv(state, 16 * token_bytes)
        padded: int | None = block * token_bytes
    else:
        block, padded = pick(draw, [16, 64, 32]), None
    mode = pick(draw, ["none", "align", "all"])
    attention = FullAttentionSpec(
        block_size=block, num_kv_heads=kv_heads, head_size=head_size, dtype=torch.bfloat16
    )
    state_spec = MambaSpec(
        block_size=block if mode != "none" else pick(draw, [8192, 4096, 2048]),
        shapes=shapes,
        dtypes=dtypes,
        page_size_padded=padded,
        mamba_type=mamba_type,
        mamba_cache_mode=mode,
        num_speculative_blocks=spec_blocks,
    )
    return attention, state_spec, f"{'pre-shaped' if shaped else 'unpadded'} pages, mode {mode}"


@st.composite
def _qwen3_next_models(draw: st.DrawFn, max_layers: int) -> Model:
    periods = draw(st.integers(1, max(1, min(3, max_layers // 4))))
    tp = pick(draw, [4, 2, 8])
    spec_tokens = pick(draw, [0, 0, 1, 2])
    # Gated delta net: conv over 2 x 16 key heads and 32 value heads of 128,
    # kernel 4 (+ speculative tokens); state (value heads, 128, 128).
    conv = (3 + spec_tokens, (2 * 16 * 128 + 32 * 128) // tp)
    ssm_dtype = pick(draw, [torch.bfloat16, torch.float32])
    shapes: _Shapes = (conv, (32 // tp, 128, 128))
    attention, gdn, shaping = draw(
        _pair(shapes, (torch.bfloat16, ssm_dtype), max(1, 2 // tp), 256, "GDN_ATTN", spec_tokens)
    )
    specs: dict[str, KVCacheSpec] = {}
    layers = 4 * periods
    for i in range(layers):
        if i % 4 == 3:  # full_attention_interval 4
            specs[f"model.layers.{i}.self_attn.attn"] = attention
        else:
            specs[f"model.layers.{i}.linear_attn"] = gdn
    if spec_tokens:
        # The MTP module is one full-attention decoder layer of its own.
        mtp = FullAttentionSpec(
            block_size=attention.block_size,
            num_kv_heads=attention.num_kv_heads,
            head_size=256,
            dtype=torch.bfloat16,
            is_draft=True,
        )
        specs["mtp.layers.0.self_attn.attn"] = mtp
    return Model(
        specs,
        f"Qwen3-Next-like (TP {tp}, {shaping}): {3 * periods} gated delta net + {periods} "
        f"full" + (f" + MTP ({spec_tokens} speculative)" if spec_tokens else ""),
        num_hidden_layers=layers,
    )


def qwen3_next_models(*, max_layers: int = 64) -> st.SearchStrategy[Model]:
    """Qwen3-Next-style hybrids (Qwen3-Next-80B-A3B, Qwen3.5; 4-12 layers).

    Three gated-delta-net layers (``linear_attn``, Mamba specs of type
    ``GDN_ATTN``: bf16 conv state, bf16/fp32 recurrent state) per full
    attention layer (2 KV heads of 256, TP-sharded).  With speculative
    tokens the conv state grows by them, the state layers keep that many
    speculative blocks, and an MTP draft layer (``mtp.layers.0``) follows.
    """
    return _qwen3_next_models(max_layers)


# Nemotron-H-8B's layer pattern (as in the golden nemotron_h_8b_like problem),
# three periods of 11: M = Mamba2, * = attention, - = MLP (no KV cache).
_NEMOTRON_PATTERN = "M-M-M-M*-M-" * 3


@st.composite
def _nemotron_h_models(draw: st.DrawFn, max_layers: int) -> Model:
    length = draw(st.integers(8, max(8, min(len(_NEMOTRON_PATTERN), max_layers))))
    pattern = _NEMOTRON_PATTERN[:length]
    if "*" not in pattern:
        pattern = pattern[:-1] + "*"
    tp = pick(draw, [1, 2, 4])
    heads, groups = 128 // tp, 8
    # Mamba2: 128 heads of 64, 8 groups, state 128, conv kernel 4.
    shapes: _Shapes = ((3, heads * 64 + 2 * groups * 128 // tp), (heads, 64, 128))
    attention, mamba, shaping = draw(
        _pair(shapes, (torch.bfloat16, torch.bfloat16), max(1, 8 // tp), 128, "MAMBA2", 0)
    )
    specs: dict[str, KVCacheSpec] = {}
    for i, kind in enumerate(pattern):
        if kind == "M":
            specs[f"model.layers.{i}.mixer"] = mamba
        elif kind == "*":
            specs[f"model.layers.{i}.mixer.attn"] = attention
    return Model(
        specs,
        f"Nemotron-H-like (TP {tp}, {shaping}): {pattern.count('M')} Mamba2 + "
        f"{pattern.count('*')} attention over {length} layers (MLP layers hold no cache)",
        num_hidden_layers=length,
    )


def nemotron_h_models(*, max_layers: int = 64) -> st.SearchStrategy[Model]:
    """Nemotron-H-style hybrids (Nemotron-H-8B/47B, Nemotron-Nano-9B-v2; 8-33 decoder layers).

    A prefix of Nemotron-H's layer pattern: Mamba2 mixers (128 heads of
    64, 8 groups, state 128, TP-sharded), attention at offset 7 of every 11 layers (8 KV
    heads of 128) and MLP layers without a KV cache in between, so the
    decoder-layer count exceeds the KV cache layers and pipeline stages are
    cut by decoder layer, not by cache.
    """
    return _nemotron_h_models(max_layers)


@st.composite
def _jamba_models(draw: st.DrawFn, max_layers: int) -> Model:
    periods = draw(st.integers(1, max(1, min(2, max_layers // 8))))
    tp = pick(draw, [2, 4, 8])
    # Mamba1: intermediate 8192, state 16, conv kernel 4.
    shapes: _Shapes = ((3, 8192 // tp), (8192 // tp, 16))
    ssm_dtype = pick(draw, [torch.float32, torch.bfloat16])
    attention, mamba, shaping = draw(
        _pair(shapes, (torch.bfloat16, ssm_dtype), max(1, 8 // tp), 128, "MAMBA1", 0)
    )
    specs: dict[str, KVCacheSpec] = {}
    layers = 8 * periods
    for i in range(layers):
        if i % 8 == 4:  # attn_layer_period 8, attn_layer_offset 4
            specs[f"model.layers.{i}.self_attn.attn"] = attention
        else:
            specs[f"model.layers.{i}.mamba"] = mamba
    return Model(
        specs,
        f"Jamba-like (TP {tp}, {shaping}): {7 * periods} Mamba1 + {periods} attention",
        num_hidden_layers=layers,
    )


def jamba_models(*, max_layers: int = 64) -> st.SearchStrategy[Model]:
    """Jamba-style hybrids (Jamba-v0.1, Jamba-1.5-Mini/Large; 8 or 16 layers).

    Mamba1 layers (intermediate 8192, state 16, TP-sharded; fp32 or bf16
    SSM state) with one attention layer (8 KV heads of 128) at offset 4 of
    every 8.
    """
    return _jamba_models(max_layers)


FAMILIES: dict[str, Callable[..., st.SearchStrategy[Model]]] = {
    "qwen3_next": qwen3_next_models,
    "nemotron_h": nemotron_h_models,
    "jamba": jamba_models,
}
