"""Fixed real-size models from the golden set (opt-in: they would dominate shrinking)."""

from __future__ import annotations

from typing import Any

import torch
from hypothesis import strategies as st

from conformance.generate.families.classic import draft, layer_names
from conformance.generate.records import Model
from conformance.generate.specs import ATTENTION
from kvref.specs import (
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
)

__all__ = ["PRESETS", "realistic_models"]


def _llama3_8b() -> Model:
    full = FullAttentionSpec(block_size=16, num_kv_heads=8, head_size=128, dtype=torch.bfloat16)
    return Model(dict.fromkeys(layer_names(ATTENTION, range(32)), full), "Llama-3-8B-like: 32 full")


def _gemma3_27b() -> Model:
    kw: dict[str, Any] = {
        "block_size": 16,
        "num_kv_heads": 16,
        "head_size": 128,
        "dtype": "bfloat16",
    }
    full, local = FullAttentionSpec(**kw), SlidingWindowSpec(**kw, sliding_window=1024)
    specs: dict[str, KVCacheSpec] = {
        ATTENTION.format(i): full if i % 6 == 5 else local for i in range(62)
    }
    return Model(specs, "Gemma-3-27B-like: 52 sliding(1024) + 10 full, 5:1")


def _gpt_oss_20b_eagle() -> Model:
    kw: dict[str, Any] = {"block_size": 16, "num_kv_heads": 8, "head_size": 64, "dtype": "bfloat16"}
    full, local = FullAttentionSpec(**kw), SlidingWindowSpec(**kw, sliding_window=128)
    specs: dict[str, KVCacheSpec] = {
        ATTENTION.format(i): full if i % 2 else local for i in range(24)
    }
    specs[ATTENTION.format(24)] = draft(full)
    return Model(
        specs,
        "gpt-oss-20b-like + EAGLE draft: 12 sliding(128) vs 13 full "
        "(contract.md#grouping-examples, model (b))",
    )


def _deepseek_v3() -> Model:
    mla = MLAAttentionSpec(
        block_size=64,
        num_kv_heads=1,
        max_tp_shards=1,
        head_size=576,
        dtype="bfloat16",
        cache_dtype_str="auto",
    )
    return Model(dict.fromkeys(layer_names(ATTENTION, range(61)), mla), "DeepSeek-V3-like: 61 MLA")


def _nemotron_h_8b() -> Model:
    # The golden nemotron_h_8b_like_hybrid.json: 24 Mamba2 + 4 attention of 52
    # layers (the rest are MLP layers without KV cache), pre-shaped pages.
    mamba = MambaSpec(
        block_size=8192,
        shapes=((3, 10240), (128, 64, 128)),
        dtypes=("bfloat16", "bfloat16"),
        page_size_padded=2162688,
    )
    attention = FullAttentionSpec(block_size=528, num_kv_heads=8, head_size=128, dtype="bfloat16")
    specs: dict[str, KVCacheSpec] = {}
    for chunk in range(5):
        for offset in (0, 2, 4, 6, 7, 9):
            i = 11 * chunk + offset
            if i > 50:
                break
            if offset == 7:
                if chunk < 4:
                    specs[f"model.layers.{i}.mixer.attn"] = attention
            else:
                specs[f"model.layers.{i}.mixer"] = mamba
    return Model(
        specs,
        "Nemotron-H-8B-like: 24 Mamba2 + 4 attention, pre-padded "
        "(contract.md#grouping-examples, model (d))",
    )


PRESETS = (_llama3_8b, _gpt_oss_20b_eagle, _gemma3_27b, _deepseek_v3, _nemotron_h_8b)


def realistic_models(*, max_layers: int = 64) -> st.SearchStrategy[Model]:
    """Generate fixed real-size models from the golden set (Llama-3-8B, gpt-oss-20b + EAGLE, ...).

    Only those with at most ``max_layers`` layers; never a model that differs
    from one of the presets.
    """
    presets = [m for m in (p() for p in PRESETS) if len(m.specs) <= max_layers]
    return st.sampled_from(presets) if presets else st.nothing()
