"""Small KV cache specs that many test modules share.

One place for the layer specs the tests build again and again, so that a
change to a spec's fields is made once.  Each helper's defaults are the
values the tests use most; keyword arguments reach the spec unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import torch

from kvref import FullAttentionSpec, MLAAttentionSpec, SlidingWindowSpec
from kvref.specs import (
    ChunkedLocalAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    SlidingWindowMLASpec,
)


def full(
    heads: int = 8, head_size: int = 128, block_size: int = 16, **kw: Any
) -> FullAttentionSpec:
    """A full-attention layer, bf16 unless ``dtype`` is given."""
    kw.setdefault("dtype", "bfloat16")
    return FullAttentionSpec(block_size=block_size, num_kv_heads=heads, head_size=head_size, **kw)


def sw(
    window: int = 1024, heads: int = 8, head_size: int = 128, block_size: int = 16, **kw: Any
) -> SlidingWindowSpec:
    """A sliding-window layer of ``window`` tokens, bf16 unless ``dtype`` is given."""
    kw.setdefault("dtype", "bfloat16")
    return SlidingWindowSpec(
        block_size=block_size, num_kv_heads=heads, head_size=head_size, sliding_window=window, **kw
    )


def mamba(block_size: int = 80, **kw: Any) -> MambaSpec:
    """A Mamba layer: a bf16 conv state (4, 1024) and an fp32 SSM state (8, 64, 64) by default."""
    kw.setdefault("shapes", [[4, 1024], [8, 64, 64]])
    kw.setdefault("dtypes", ["bfloat16", "float32"])
    return MambaSpec(block_size=block_size, **kw)


def mla(block_size: int = 64, head_size: int = 576, **kw: Any) -> MLAAttentionSpec:
    """A DeepSeek-V3 MLA layer (one head of 576), bf16 unless ``dtype`` is given."""
    kw.setdefault("dtype", "bfloat16")
    return MLAAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=head_size, **kw)


def window_mla(
    window: int, block_size: int = 64, head_size: int = 576, **kw: Any
) -> SlidingWindowMLASpec:
    """:func:`mla`'s layer with a sliding window of ``window`` tokens."""
    kw.setdefault("dtype", "bfloat16")
    return SlidingWindowMLASpec(
        block_size=block_size, num_kv_heads=1, head_size=head_size, sliding_window=window, **kw
    )


def sparse_mla_source(block_size: int = 64) -> MLAAttentionSpec:
    """DeepSeek-V3.2's sparse-MLA source layer: ``fp8_ds_mla``, 656 B a token.

    512 fp8 NoPE bytes, 16 fp32 scales and 64 bf16 RoPE values per token; the
    leader of its index group.
    """
    return mla(
        block_size,
        dtype=torch.uint8,
        state_content_bytes=656,
        cache_dtype_str="fp8_ds_mla",
        is_index_group_leader=True,
    )


def sparse_mla_indexer(block_size: int = 64) -> MLAAttentionSpec:
    """DeepSeek-V3.2's indexer layer beside :func:`sparse_mla_source`: 132 B a token."""
    return mla(block_size, 128, dtype=torch.uint8, state_content_bytes=132, cache_role="INDEXER")


#: A compressed MLA layer's fields (less its one head): four tokens a state of
#: 584 B, pages padded to 576 B multiples.
COMPRESSED_MLA: Mapping[str, Any] = MappingProxyType(
    {
        "block_size": 256,
        "head_size": 512,
        "dtype": torch.uint8,
        "state_content_bytes": 584,
        "tokens_per_state": 4,
        "alignment": 576,
    }
)


def compressed_mla(**kw: Any) -> MLAAttentionSpec:
    """The :data:`COMPRESSED_MLA` layer: block 256 holds 64 states, 37,376 B padded to 37,440."""
    return mla(**{**COMPRESSED_MLA, **kw})


def mla_beside_chunked() -> dict[str, KVCacheSpec]:
    """An MLA page (73,728 B) that does not divide the chunked-local one beside it (262,144 B).

    No padding unifies them: without the full-attention fallback, grouping refuses.
    """
    chunked = ChunkedLocalAttentionSpec(
        block_size=64, num_kv_heads=8, head_size=128, dtype="bfloat16", attention_chunk_size=64
    )
    return {"m": mla(), "c": chunked}


#: Model (a) of contract.md#grouping-examples: 8 heads of 128, bf16, block 16,
#: full attention and a 1,024-token window.
MODEL_A_FULL = full()
MODEL_A_SWA = sw()


def model_a(n: int = 30) -> dict[str, KVCacheSpec]:
    """Model (a)'s ``n`` layers ``l<i>`` in the pattern (F, S, S)."""
    return {f"l{i}": (MODEL_A_FULL if i % 3 == 0 else MODEL_A_SWA) for i in range(n)}


#: Model (a)'s 30 layers, and split over two PP workers as in contract.md#core-flow.
MODEL_A = model_a()
MODEL_A_PP0 = {k: v for k, v in MODEL_A.items() if int(k[1:]) < 16}
MODEL_A_PP1 = {k: v for k, v in MODEL_A.items() if int(k[1:]) >= 16}


def projection_repro() -> list[dict[str, KVCacheSpec]]:
    """The PP-projection repro of contract.md#memory-safety, as two workers' layers.

    w0 = {f0..f3 (8 heads), s0a..s3a (6 heads)}, w1 = {s0b..s3b}: under BLHNC
    f0..f3 form a uniform-type group with no layer on w1.
    """
    f, s = full(), sw(heads=6)
    w0 = {f"f{i}": f for i in range(4)} | {f"s{i}a": s for i in range(4)}
    w1 = {f"s{i}b": s for i in range(4)}
    return [w0, w1]


def hydra_layers() -> dict[str, KVCacheSpec]:
    """tests/data/models/acme_hydra.json as the kit drew it (seed 8): 6 x (full + sw512)."""
    kv, local = full(4, block_size=32), sw(512, 2, block_size=32)
    layers: dict[str, KVCacheSpec] = {}
    for i in range(6):
        layers[f"model.layers.{i}.hydra.kv"] = kv
        layers[f"model.layers.{i}.hydra.local"] = local
    return layers


#: Two full-attention layer kinds of different pages, for the worker-rule tests.
WIDE = full(2, 64)
NARROW = full(1, 40)
#: Three layers of one page.
UNIFORM_LAYERS: dict[str, KVCacheSpec] = {
    f"model.layers.{i}.self_attn.attn": WIDE for i in range(3)
}
#: Two pages in one group (block-outermost layouts place them in one block).
MIXED_LAYERS: dict[str, KVCacheSpec] = {
    "model.layers.0.self_attn.attn": WIDE,
    "model.layers.1.self_attn.attn": NARROW,
    "model.layers.2.self_attn.attn": WIDE,
}
