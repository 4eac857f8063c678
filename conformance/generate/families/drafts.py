"""Speculative-decoding draft layers: EAGLE, EAGLE-3 and MTP heads on common targets.

vLLM plans a draft model's KV cache layers with the target's (the draft's
specs carry ``is_draft``); its layers continue the target's numbering
(EAGLE's ``start_layer_id``, DeepSeek's MTP at ``num_hidden_layers``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import torch
from hypothesis import strategies as st

from conformance.generate.records import Model
from conformance.generate.specs import ATTENTION
from kvref.specs import FullAttentionSpec, KVCacheSpec, MLAAttentionSpec, SlidingWindowSpec

__all__ = ["draft_models"]

_TARGETS = ("llama", "gpt_oss", "deepseek_v3")


def _target(kind: str, layers: int, dtype: torch.dtype) -> tuple[dict[str, KVCacheSpec], Any]:
    """The target's layers and the spec a same-geometry draft layer copies."""
    if kind == "deepseek_v3":
        mla = MLAAttentionSpec(
            block_size=64, num_kv_heads=1, max_tp_shards=1, head_size=576, dtype=dtype
        )
        return {ATTENTION.format(i): mla for i in range(layers)}, mla
    heads, head_size = (8, 128) if kind == "llama" else (8, 64)
    full = FullAttentionSpec(block_size=16, num_kv_heads=heads, head_size=head_size, dtype=dtype)
    if kind == "llama":
        return {ATTENTION.format(i): full for i in range(layers)}, full
    window = SlidingWindowSpec(
        block_size=16, num_kv_heads=heads, head_size=head_size, dtype=dtype, sliding_window=128
    )
    # gpt-oss alternates sliding (even) and full (odd) layers.
    return {ATTENTION.format(i): full if i % 2 else window for i in range(layers)}, full


@st.composite
def _draft_models(draw: st.DrawFn, max_layers: int) -> Model:
    kind = draw(st.sampled_from(_TARGETS))
    layers = draw(st.integers(1, max(1, min(8, max_layers - 1))))
    dtype = draw(st.sampled_from([torch.bfloat16, torch.float16, torch.float8_e4m3fn]))
    specs, like = _target(kind, layers, dtype)
    methods = ["mtp", "eagle3"] if kind == "deepseek_v3" else ["eagle", "eagle3"]
    method = draw(st.sampled_from(methods))
    drafts = draw(st.integers(1, 3)) if method == "mtp" else 1
    draft: KVCacheSpec = attrs.evolve(like, is_draft=True)
    if method == "eagle3" and isinstance(like, FullAttentionSpec) and kind != "deepseek_v3":
        # EAGLE-3 heads keep the target's head size but not always its KV heads.
        heads = draw(st.sampled_from([8, 4, 1]))
        draft = attrs.evolve(like, num_kv_heads=heads, is_draft=True)
    elif method == "eagle3":
        # A full-attention EAGLE-3 head on an MLA target (8 heads of 128).
        draft = FullAttentionSpec(
            block_size=64, num_kv_heads=8, head_size=128, dtype=dtype, is_draft=True
        )
    for k in range(drafts):
        specs[ATTENTION.format(layers + k)] = draft
    return Model(
        specs,
        f"{kind} + {method.upper()} ({drafts} draft layer{'s' if drafts > 1 else ''}): "
        f"{layers} target layers",
        num_hidden_layers=layers,
    )


def draft_models(*, max_layers: int = 64) -> st.SearchStrategy[Model]:
    """Targets with draft layers (Llama-3 + EAGLE/EAGLE-3, gpt-oss + EAGLE-3, DeepSeek-V3 + MTP).

    The target has 1-8 layers; EAGLE adds one draft layer of the target's
    geometry, EAGLE-3 one whose KV heads may differ (other pages) and MTP
    1-3 MLA draft layers, or a full-attention EAGLE-3 head on the MLA
    target.  Every model has a draft layer.
    """
    return _draft_models(max_layers)


FAMILIES: dict[str, Callable[..., st.SearchStrategy[Model]]] = {"drafts": draft_models}
