"""Targets whose hidden states are cached: vLLM's ``extract_hidden_states`` speculative method.

With ``speculative_config.method == "extract_hidden_states"`` vLLM runs
``ExtractHiddenStatesModel`` beside the target: one cache-only layer,
``cache_only_layers.{num_hidden_layers}``, whose ``HiddenStateCacheSpec``
(an MLA marker) stores the target's auxiliary hidden states
(``eagle_aux_hidden_state_layer_ids``, three for EAGLE-3 training data) at
the target's hidden size, unquantized, with the cache's block size.  The
targets are Llama-3 (uniform full attention), gpt-oss (sliding/full 1:1),
Gemma-3 (sliding/full 5:1) and DeepSeek-V3 (MLA), so the hidden-state layer
meets every grouping path: a uniform-type group, packing, and the
uniform-page path that shrinks its block and pads its page
(contract.md#hidden-state-alignment).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from hypothesis import strategies as st

from conformance.generate.families.sparse_mla import v32_attention, v32_indexer
from conformance.generate.records import Model
from conformance.generate.sampled_from_cache import pick
from conformance.generate.specs import ATTENTION
from kvref.extra_specs import HiddenStateCacheSpec
from kvref.specs import FullAttentionSpec, KVCacheSpec, MLAAttentionSpec, SlidingWindowSpec

__all__ = ["hidden_state_mla_models", "hidden_state_models"]

#: target -> (hidden size, KV heads, head size, block size)
_TARGETS: dict[str, tuple[int, int, int, int]] = {
    "llama3": (4096, 8, 128, 16),
    "gpt_oss": (2880, 8, 64, 16),
    "gemma3": (2560, 4, 256, 16),
    "deepseek_v3": (7168, 1, 576, 64),
}
#: Local/full period of the hybrid targets (full layer last in each period).
_PERIODS = {"gpt_oss": 2, "gemma3": 6}


def _target_spec(kind: str, index: int, dtype: torch.dtype) -> KVCacheSpec:
    _, heads, head_size, block = _TARGETS[kind]
    if kind == "deepseek_v3":
        return MLAAttentionSpec(
            block_size=block, num_kv_heads=1, max_tp_shards=1, head_size=head_size, dtype=dtype
        )
    period = _PERIODS.get(kind)
    if period is not None and index % period != period - 1:
        window = 128 if kind == "gpt_oss" else 1024
        return SlidingWindowSpec(
            block_size=block,
            num_kv_heads=heads,
            head_size=head_size,
            dtype=dtype,
            sliding_window=window,
        )
    return FullAttentionSpec(block_size=block, num_kv_heads=heads, head_size=head_size, dtype=dtype)


def _with_hidden_states(
    specs: dict[str, KVCacheSpec], layers: int, target: str, block: int, aux: int, hidden: int
) -> Model:
    """``target``'s model (``specs``, ``layers`` decoder layers) plus one hidden-state cache layer.

    The layer, after the target's last, stores ``aux`` auxiliary states of
    the target's ``hidden`` size a token.
    """
    # Hidden states keep the model dtype even when the KV cache is quantized.
    specs[f"cache_only_layers.{layers}"] = HiddenStateCacheSpec(
        block_size=block, num_kv_heads=aux, head_size=hidden, dtype=torch.bfloat16
    )
    return Model(
        specs,
        f"{target} + extract_hidden_states ({aux} aux states of {hidden})",
        num_hidden_layers=layers,
    )


@st.composite
def _hidden_state_models(draw: st.DrawFn, max_layers: int) -> Model:
    kind = pick(draw, list(_TARGETS))
    layers = draw(st.integers(1, max(1, min(12, max_layers - 1))))
    dtype = pick(draw, [torch.bfloat16, torch.float16])
    specs = {ATTENTION.format(i): _target_spec(kind, i, dtype) for i in range(layers)}
    hidden_size, *_, block = _TARGETS[kind]
    aux = pick(draw, [3, 1, 4])
    target = f"{kind} target ({layers} layers)"
    return _with_hidden_states(specs, layers, target, block, aux, hidden_size)


def hidden_state_models(*, max_layers: int = 64) -> st.SearchStrategy[Model]:
    """A target of 1-12 layers plus one hidden-state cache layer after its last layer.

    Targets: Llama-3 (full), gpt-oss (sliding 128 / full), Gemma-3 (sliding
    1024 x5 / full) and DeepSeek-V3 (MLA, block 64); the hidden-state layer
    stores 3, 1 or 4 auxiliary states of the target's hidden size in bf16.
    """
    return _hidden_state_models(max_layers)


#: MLA and MLA-like targets: name -> (hidden size, block sizes, whether it indexes (V3.2)).
_MLA_TARGETS: dict[str, tuple[int, tuple[int, ...], bool]] = {
    "deepseek_v3": (7168, (64, 16, 32), False),
    "kimi_k2": (7168, (64, 16), False),
    "deepseek_v2_lite": (2048, (64, 16), False),
    "deepseek_v32": (7168, (64,), True),
}


@st.composite
def _hidden_state_mla_models(draw: st.DrawFn, max_layers: int) -> Model:
    kind = pick(draw, list(_MLA_TARGETS))
    hidden_size, blocks, indexed = _MLA_TARGETS[kind]
    block = pick(draw, list(blocks))
    layers = draw(st.integers(1, max(1, min(8, max_layers - 1))))
    fp8 = indexed and draw(st.booleans())
    specs: dict[str, KVCacheSpec] = {}
    for i in range(layers):
        if indexed:
            specs[f"model.layers.{i}.self_attn.attn"] = v32_attention(fp8, block, False, True)
            specs[f"model.layers.{i}.self_attn.indexer.k_cache"] = v32_indexer(block, 1, False)
        else:
            specs[ATTENTION.format(i)] = MLAAttentionSpec(
                block_size=block,
                num_kv_heads=1,
                max_tp_shards=1,
                head_size=576,
                dtype=torch.bfloat16,
            )
    # EAGLE-3's three auxiliary layers, or another count a trainer asks for:
    # several states a token, so the hidden-state page is never one latent's.
    aux = pick(draw, [3, 2, 4])
    target = f"{kind} MLA target ({layers} layers, block {block})"
    return _with_hidden_states(specs, layers, target, block, aux, hidden_size)


def hidden_state_mla_models(*, max_layers: int = 64) -> st.SearchStrategy[Model]:
    """An MLA or MLA-like target of 1-8 layers plus one hidden-state cache layer after it.

    The hidden-state cache (``HiddenStateCacheSpec``) is a subclass of
    ``MLAAttentionSpec``: a platform gate written as ``isinstance(spec,
    MLAAttentionSpec)`` opens on it beside the target's latents, with a page
    of several states a token where a latent page holds one.  Targets:
    DeepSeek-V3, Kimi-K2 and DeepSeek-V2-Lite (MLA, 576 wide, block 64, 16
    or 32) and DeepSeek-V3.2 (MLA beside its indexer's fp8 keys, block 64);
    2-4 auxiliary states of the target's hidden size in bf16.  Its own
    family (a stratum of every default run) rather than a target of
    :func:`hidden_state_models`, where one draw in four would find it.
    """
    return _hidden_state_mla_models(max_layers)


FAMILIES: dict[str, Callable[..., st.SearchStrategy[Model]]] = {
    "hidden_state": hidden_state_models,
    "hidden_state_mla": hidden_state_mla_models,
}
