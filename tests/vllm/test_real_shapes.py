"""kvref and vLLM 0.33.0 plan alike on the shapes of real, published models, at their scale.

tests/vllm/test_differential.py checks small named shapes and Hypothesis
problems; these are the shapes a deployment meets: each model's layer
count, attention kinds, KV heads per worker after tensor parallelism, head
size, window or chunk, at its context length and a realistic memory per
worker, split over pipeline stages as vLLM splits them by default.  The
numbers are read from the models' published ``config.json`` files (field
names in each entry's comment).  Every layout vLLM's resolution allows for
the shape is planned, through Core's whole flow on both sides.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from _vllm_diff import assert_agree, run_kvref, split_stages

from conformance.generate import strategies as kst
from kvref import (
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    PlanningConfig,
    SlidingWindowSpec,
)

pytestmark = pytest.mark.vllm

GIB = 2**30
ATTN = "model.layers.{i}.self_attn.attn"


def _attention(
    cls: type[FullAttentionSpec], heads: int, head: int, *, block: int = 16, **kw: object
) -> FullAttentionSpec:
    dtype = kw.pop("dtype", "bfloat16")
    return cls(block_size=block, num_kv_heads=heads, head_size=head, dtype=dtype, **kw)


def _full(heads: int, head: int, **kw: object) -> KVCacheSpec:
    return _attention(FullAttentionSpec, heads, head, **kw)


def _sliding(heads: int, head: int, window: int) -> KVCacheSpec:
    return _attention(SlidingWindowSpec, heads, head, sliding_window=window)  # type: ignore[arg-type]


def _layers(
    count: int, pick: Callable[[int], KVCacheSpec], name: str = ATTN
) -> dict[str, KVCacheSpec]:
    return {name.format(i=i): pick(i) for i in range(count)}


def _qwen3_next(tp: int) -> dict[str, KVCacheSpec]:
    """48 layers, a gated-delta-net layer three times in four, full attention every 4th.

    ``num_key_value_heads`` 2 (replicated past TP 2), ``head_dim`` 256;
    ``linear_num_key_heads`` 16 and ``linear_num_value_heads`` 32 of 128,
    ``linear_conv_kernel_dim`` 4.  As vLLM's hybrid alignment does, the
    attention block grows (in steps of 16 tokens) until its page holds the
    recurrent state, and the state's page is padded to it.
    """
    kv_heads, value_heads, key_dim = max(1, 2 // tp), 32 // tp, 2048 // tp
    conv = (3, 2 * key_dim + 128 * value_heads)
    ssm = (value_heads, 128, 128)
    state = conv[0] * conv[1] * 2 + value_heads * 128 * 128 * 4
    per_token = 2 * kv_heads * 256 * 2
    block = -(-state // (16 * per_token)) * 16
    full = _full(kv_heads, 256, block=block)
    linear = MambaSpec(
        block_size=block,
        shapes=(conv, ssm),
        dtypes=("bfloat16", "float32"),
        page_size_padded=block * per_token,
        mamba_type="GDN_ATTN",
    )
    return _layers(48, lambda i: full if i % 4 == 3 else linear)


def _whisper_large() -> dict[str, KVCacheSpec]:
    """32 decoder layers of self- and cross-attention, 20 heads of 64, 1,500 encoder positions."""
    return {
        **_layers(32, lambda i: _full(20, 64), "model.decoder.layers.{i}.self_attn.attn"),
        **_layers(
            32,
            lambda i: _attention(CrossAttentionSpec, 20, 64),
            "model.decoder.layers.{i}.encoder_attn.attn",
        ),
    }


#: name -> (model, pipeline stages, config fields, memory per worker)
Shape = tuple[Callable[[], dict[str, KVCacheSpec]], int, dict[str, object], int]

SHAPES: dict[str, Shape] = {
    # Llama 3.1 70B: 80 layers, 8 KV heads of 128 (1 per worker at TP 8), 128K context.
    "llama-3.1-70b-tp8": (lambda: _layers(80, lambda i: _full(1, 128)), 1, {}, 60 * GIB),
    # The same at TP 4 with an fp8 cache.
    "llama-3.1-70b-tp4-fp8": (
        lambda: _layers(80, lambda i: _full(2, 128, dtype="float8_e4m3fn")),
        1,
        {"cache_dtype": "fp8"},
        50 * GIB,
    ),
    # Llama 3.1 405B: 126 layers over two stages (63 each), TP 8.
    "llama-3.1-405b-pp2": (lambda: _layers(126, lambda i: _full(1, 128)), 2, {}, 30 * GIB),
    # Llama 3.1 8B (32 layers, 8 KV heads) asked for 128K on 6 GiB: auto-fit shortens it.
    "llama-3.1-8b-auto-fit": (
        lambda: _layers(32, lambda i: _full(8, 128)),
        1,
        {"auto_fit_max_model_len": True},
        6 * GIB,
    ),
    # The 70B with its block count overridden (num_gpu_blocks_override).
    "llama-3.1-70b-override": (
        lambda: _layers(80, lambda i: _full(1, 128)),
        1,
        {"num_gpu_blocks_override": 20_000},
        60 * GIB,
    ),
    # DeepSeek V3: 61 MLA layers (kv_lora_rank 512 + qk_rope_head_dim 64 = 576), blocks of 64,
    # over 4 and 8 stages: the split is uneven.
    "deepseek-v3-pp4": (
        lambda: _layers(61, lambda i: _attention(MLAAttentionSpec, 1, 576, block=64)),
        4,
        {"max_model_len": 163_840},
        20 * GIB,
    ),
    "deepseek-v3-pp8": (
        lambda: _layers(61, lambda i: _attention(MLAAttentionSpec, 1, 576, block=64)),
        8,
        {"max_model_len": 163_840},
        9 * GIB,
    ),
    # gpt-oss 120B: 36 layers alternating a 128-token window and full attention, 8 KV heads of
    # 64 (4 at TP 2); gpt-oss 20B: 24 such layers over two stages.
    "gpt-oss-120b-tp2": (
        lambda: _layers(36, lambda i: _sliding(4, 64, 128) if i % 2 == 0 else _full(4, 64)),
        1,
        {},
        40 * GIB,
    ),
    "gpt-oss-20b-pp2": (
        lambda: _layers(24, lambda i: _sliding(8, 64, 128) if i % 2 == 0 else _full(8, 64)),
        2,
        {},
        20 * GIB,
    ),
    # Gemma 3 27B: 62 layers, five 1,024-token windows then one full layer (the last two
    # layers are windows), 16 KV heads of 128; Gemma 3 1B: 26 layers, 512-token windows,
    # one KV head of 256.
    "gemma-3-27b-tp4": (
        lambda: _layers(62, lambda i: _full(4, 128) if i % 6 == 5 else _sliding(4, 128, 1024)),
        1,
        {},
        30 * GIB,
    ),
    "gemma-3-27b-pp2": (
        lambda: _layers(62, lambda i: _full(16, 128) if i % 6 == 5 else _sliding(16, 128, 1024)),
        2,
        {},
        30 * GIB,
    ),
    "gemma-3-1b": (
        lambda: _layers(26, lambda i: _full(1, 256) if i % 6 == 5 else _sliding(1, 256, 512)),
        1,
        {"max_model_len": 32_768},
        4 * GIB,
    ),
    # Llama 4 Scout: 48 layers, chunked local attention (8,192) three times in four, full
    # attention every 4th, 8 KV heads of 128 (2 at TP 4), 256K context.
    "llama-4-scout-tp4": (
        lambda: _layers(
            48,
            lambda i: (
                _full(2, 128)
                if i % 4 == 3
                else _attention(ChunkedLocalAttentionSpec, 2, 128, attention_chunk_size=8192)
            ),  # type: ignore[arg-type]
        ),
        1,
        {"max_model_len": 262_144},
        40 * GIB,
    ),
    # Mistral 7B v0.1: 32 layers, a 4,096-token window everywhere.
    "mistral-7b-v0.1": (
        lambda: _layers(32, lambda i: _sliding(8, 128, 4096)),
        1,
        {"max_model_len": 32_768},
        10 * GIB,
    ),
    # Qwen2.5 7B: 28 layers, 4 KV heads of 128, over three stages.
    "qwen2.5-7b-pp3": (
        lambda: _layers(28, lambda i: _full(4, 128)),
        3,
        {"max_model_len": 32_768},
        8 * GIB,
    ),
    "qwen3-next-80b-tp4": (lambda: _qwen3_next(4), 1, {"max_model_len": 262_144}, 30 * GIB),
    "qwen3-next-80b-pp2": (lambda: _qwen3_next(1), 2, {"max_model_len": 65_536}, 30 * GIB),
    "whisper-large-v3": (
        _whisper_large,
        1,
        {"max_model_len": 448, "max_num_encoder_input_tokens": 1500},
        4 * GIB,
    ),
}


def _cases() -> list[object]:
    return [
        pytest.param(name, layout, id=f"{name}-{layout.name}")
        for name, (make, *_) in SHAPES.items()
        for layout in kst.allowed_layouts(make())
    ]


@pytest.mark.parametrize(("name", "layout"), _cases())
def test_core_flow_agrees(name: str, layout: object) -> None:
    """Core's whole flow gives the same plan in kvref and vLLM, and the plan is not empty."""
    make, stages, fields, memory = SHAPES[name]
    fields = {"max_model_len": 131_072, **fields}
    config = PlanningConfig(
        kv_cache_layout=layout,
        pipeline_parallel_size=stages,
        **fields,  # type: ignore[arg-type]
    )
    workers = split_stages(make(), stages)
    assert assert_agree(config, workers, [memory] * stages) == "ok"
    plan = run_kvref(config, workers, [memory] * stages).plan
    assert plan is not None and plan.num_blocks > 0
    if "num_gpu_blocks_override" in fields:
        assert plan.num_blocks == fields["num_gpu_blocks_override"]
    if fields.get("auto_fit_max_model_len"):
        # Shortened to what fits, and not trivially: the memory holds some of the 128K.
        assert 0 < plan.max_model_len < 131_072
