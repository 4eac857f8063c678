"""The generic families: uniform, local/full hybrids, MLA, Mamba hybrids, encoder-decoder, ...

Each family draws small models whose layer names look like vLLM's and
whose specs are what vLLM's layers report for models of that shape.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable

import attrs
import torch
from hypothesis import strategies as st

from conformance.check.geometry import cdiv
from conformance.generate.records import Model
from conformance.generate.sampled_from_cache import pick
from conformance.generate.specs import (
    ATTENTION,
    CHUNK_SIZES,
    MAMBA,
    MAX_PAGE_BYTES,
    SLIDING_WINDOWS,
    attention_kwargs,
    chunked_local_specs,
    circular_buffer_specs,
    compressed_mla_specs,
    full_attention_specs,
    mamba_specs,
    mamba_state,
    mla_specs,
    pick_block_size,
    rarely,
    sliding_window_mla_specs,
    sliding_window_specs,
    state_bytes,
)
from kvref.specs import (
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    SlidingWindowSpec,
    dtype_size,
)

__all__ = [
    "attention_free_models",
    "circular_buffer_models",
    "cross_attention_models",
    "draft",
    "hybrid_models",
    "layer_names",
    "mamba_hybrid_models",
    "mixed_page_models",
    "mla_models",
    "uniform_models",
]


def layer_names(template: str, indices: Iterable[int]) -> list[str]:
    """``template`` formatted with each index (``model.layers.{}.self_attn.attn``)."""
    return [template.format(i) for i in indices]


@functools.cache
def _uniform_kinds() -> st.SearchStrategy[KVCacheSpec]:
    # Built once: a new strategy tree per draw is validated afresh each time.
    return st.one_of(
        full_attention_specs(),
        mla_specs(),
        sliding_window_specs(),
        mamba_specs(),
        chunked_local_specs(),
        sliding_window_mla_specs(),
        compressed_mla_specs(),
    )


@st.composite
def _uniform_models(draw: st.DrawFn, max_layers: int) -> Model:
    n = draw(st.integers(1, max_layers))
    spec: KVCacheSpec = draw(_uniform_kinds())
    template = MAMBA if isinstance(spec, MambaSpec) else ATTENTION
    return Model(
        dict.fromkeys(layer_names(template, range(n)), spec),
        f"uniform: {n} x {type(spec).__name__}",
    )


def uniform_models(*, max_layers: int = 64) -> st.SearchStrategy[Model]:
    """Models of 1..``max_layers`` identical layers of one kind (Llama/DeepSeek/Mamba-like).

    The kinds include a compressed MLA latent (:func:`compressed_mla_specs`).

    Never cross-attention or ring-buffer only models (no real model has them).
    """
    return _uniform_models(max_layers)


def draft(spec: KVCacheSpec) -> KVCacheSpec:
    """A copy of ``spec`` marked as a draft-model layer."""
    return attrs.evolve(spec, is_draft=True)


@st.composite
def _hybrid_models(draw: st.DrawFn, max_layers: int) -> Model:
    ratio = pick(draw, ["5:1", "1:1", "3:1"])
    period = {"5:1": 6, "3:1": 4, "1:1": 2}[ratio]
    kw = draw(attention_kwargs(block_size=None, max_page_bytes=MAX_PAGE_BYTES, edge=True))
    full = FullAttentionSpec(**kw)
    local: KVCacheSpec
    if ratio == "3:1" and draw(st.booleans()):
        local = ChunkedLocalAttentionSpec(**kw, attention_chunk_size=pick(draw, CHUNK_SIZES))
    else:
        local = SlidingWindowSpec(**kw, sliding_window=pick(draw, SLIDING_WINDOWS))
    repeats = draw(st.integers(1, max(1, max_layers // period)))
    tail = draw(st.integers(0, period - 1)) if rarely(draw) else 0
    n = min(repeats * period + tail, max(max_layers, period))
    # gpt-oss puts the window first (S, F, ...); Gemma-3 and Llama-4 end each
    # period with the full layer.  Either way the full layer is index period-1.
    specs: dict[str, KVCacheSpec] = {
        ATTENTION.format(i): full if i % period == period - 1 else local for i in range(n)
    }
    drafts = draw(st.integers(1, 2)) if rarely(draw) else 0
    for j in range(drafts):
        # EAGLE draft layers continue the target's numbering (start_layer_id).
        specs[ATTENTION.format(n + j)] = draft(full)
    n_full = sum(1 for s in specs.values() if type(s) is FullAttentionSpec)
    like = {"5:1": "Gemma-3-like", "1:1": "gpt-oss-like", "3:1": "Llama-4-like"}[ratio]
    desc = f"hybrid {ratio} ({like}): {n - n_full + drafts} {type(local).__name__} + {n_full} full"
    if drafts:
        desc += f" (incl. {drafts} EAGLE draft)"
    return Model(specs, desc)


def hybrid_models(*, max_layers: int = 64) -> st.SearchStrategy[Model]:
    """Local/full hybrids with one shared geometry: 5:1 (Gemma-3), 1:1 (gpt-oss), 3:1 (Llama-4).

    The local layers are sliding windows (or chunked local for 3:1).  Rarely a
    tail of local layers and 1-2 EAGLE draft layers (full, ``is_draft``),
    which gives the 12-vs-13 case of contract.md#grouping-examples, model (b) at 24 layers.  Every
    model has at least one full layer; pages are equal across layers.
    """
    return _hybrid_models(max_layers)


@st.composite
def _mla_models(draw: st.DrawFn, max_layers: int) -> Model:
    # Half the latents are compressed, as DeepSeek-V4's and GLM-5's are.
    compressed = draw(st.booleans())
    mla = draw(compressed_mla_specs() if compressed else mla_specs())
    n = draw(st.integers(1, max(1, max_layers - 1)))
    specs: dict[str, KVCacheSpec] = dict.fromkeys(layer_names(ATTENTION, range(n)), mla)
    extra = pick(draw, ["none", "mtp", "swa"]) if rarely(draw) else "none"
    desc = f"MLA (DeepSeek-like{', compressed' if compressed else ''}): {n} layers"
    if extra == "mtp":
        specs[ATTENTION.format(n)] = draft(mla)
        desc += " + MTP draft"
    elif extra == "swa":
        # contract.md#grouping-examples, model (e): an MLA target with a sliding-window EAGLE draft.
        kw = draw(
            attention_kwargs(block_size=mla.block_size, max_page_bytes=MAX_PAGE_BYTES, edge=False)
        )
        specs[ATTENTION.format(n)] = SlidingWindowSpec(**kw, sliding_window=128, is_draft=True)
        desc += " + sliding-window draft"
    return Model(specs, desc)


def mla_models(*, max_layers: int = 64) -> st.SearchStrategy[Model]:
    """DeepSeek-like MLA models, rarely with an MTP draft or a sliding-window draft.

    Half of them have a compressed latent (:func:`compressed_mla_specs`),
    which every layout the model allows may place, layer-outer ones included.

    See contract.md#grouping-examples, model (e).
    """
    return _mla_models(max_layers)


#: Built once: a strategy made per draw is validated and labelled afresh.
_HYBRID_MAMBA_STATE = mamba_state(max_bytes=3 * 2**20)


@st.composite
def _mamba_hybrid_models(draw: st.DrawFn, max_layers: int) -> Model:
    dtype = pick(draw, [torch.bfloat16, torch.float16])
    heads = pick(draw, [8, 2, 4, 1, 16])
    head_size = pick(draw, [128, 64, 256])
    token_bytes = heads * 2 * head_size * dtype_size(dtype)
    shapes, dtypes_, mamba_type = draw(_HYBRID_MAMBA_STATE)
    state = state_bytes(shapes, dtypes_)
    shaping = pick(draw, ["platform", "unpadded"])
    if shaping == "platform":
        # vLLM's _align_hybrid_block_size (contract.md#grouping-examples, model (d)): raise the
        # attention block
        # to a multiple of the 16-token kernel block so one attention page holds
        # the Mamba state, then pad the Mamba page to the attention page.
        block = 16 * cdiv(state, 16 * token_bytes)
        padded: int | None = block * token_bytes
    else:
        block = pick_block_size(draw, token_bytes, MAX_PAGE_BYTES)
        padded = None
    attention = FullAttentionSpec(
        block_size=block, num_kv_heads=heads, head_size=head_size, dtype=dtype
    )
    mode = pick(draw, ["none", "align", "all"])
    # vLLM's Mamba block size is max_model_len without prefix caching of
    # states, and the attention block size with it.
    mamba_block = pick(draw, [8192, 2048, 32768]) if mode == "none" else block
    mamba = MambaSpec(
        block_size=mamba_block,
        shapes=shapes,
        dtypes=dtypes_,
        page_size_padded=padded,
        mamba_type=mamba_type,
        mamba_cache_mode=mode,
        num_speculative_blocks=draw(st.integers(1, 2)) if rarely(draw) else 0,
    )
    period = pick(draw, [4, 2, 6, 8])
    repeats = draw(st.integers(1, max(1, max_layers // period)))
    n = repeats * period
    specs: dict[str, KVCacheSpec] = {}
    for i in range(n):
        if i % period == period - 1:
            specs[ATTENTION.format(i)] = attention
        else:
            specs[MAMBA.format(i)] = mamba
    return Model(
        specs,
        f"Mamba hybrid ({shaping} pages, mode {mode}): {n - repeats} {mamba_type} + "
        f"{repeats} attention",
    )


def mamba_hybrid_models(*, max_layers: int = 64) -> st.SearchStrategy[Model]:
    """Mamba/attention hybrids with attention every 2nd..8th layer (Jamba/Nemotron-H/Zamba-like).

    Mostly with pages as vLLM's platform config pre-shapes them (contract.md#grouping-examples,
    model (d)): the attention block raised so its page holds the Mamba state, and the Mamba
    ``page_size_padded`` equal to the attention page; otherwise unpadded (mixed pages).  All Mamba
    layers share one spec and one
    ``mamba_cache_mode``.  Never a model without attention.
    """
    return _mamba_hybrid_models(max_layers)


@st.composite
def _cross_attention_models(draw: st.DrawFn, max_layers: int) -> Model:
    kw = draw(attention_kwargs(block_size=None, max_page_bytes=MAX_PAGE_BYTES, edge=False))
    n = draw(st.integers(1, max(1, max_layers // 2)))
    self_attn, cross = FullAttentionSpec(**kw), CrossAttentionSpec(**kw)
    specs: dict[str, KVCacheSpec] = {}
    for i in range(n):
        specs[f"model.decoder.layers.{i}.self_attn.attn"] = self_attn
        specs[f"model.decoder.layers.{i}.encoder_attn.attn"] = cross
    return Model(specs, f"encoder-decoder (Whisper-like): {n} self + {n} cross attention")


def cross_attention_models(*, max_layers: int = 64) -> st.SearchStrategy[Model]:
    """Whisper-like decoders: per layer one self-attention and one cross-attention layer.

    Both share one geometry (equal pages).  Never includes encoder-only
    layers (the runner adds those after planning).
    """
    return _cross_attention_models(max_layers)


def attention_free_models() -> st.SearchStrategy[Model]:
    """Generate the attention-free model: no KV cache layers at all.

    See contract.md#default-grouping.
    """
    return st.just(Model({}, "attention-free"))


@st.composite
def _mixed_page_models(draw: st.DrawFn, max_layers: int) -> Model:
    # A sixteenth of the page limit: the other head count is at most 16x larger.
    kw = draw(attention_kwargs(block_size=None, max_page_bytes=MAX_PAGE_BYTES // 16, edge=False))
    heads = kw["num_kv_heads"]
    other = pick(draw, [h for h in (4, 6, 2, 1, 3, 8, 16) if h != heads])
    full = FullAttentionSpec(**kw)
    repeats = draw(st.integers(1, max(1, max_layers // 3)))
    specs: dict[str, KVCacheSpec] = {}
    if draw(st.booleans()):
        # contract.md#grouping-examples, model (c): (F, S, S) x k with sliding windows of another
        # head count.
        local = SlidingWindowSpec(**{**kw, "num_kv_heads": other}, sliding_window=1024)
        for i in range(3 * repeats):
            specs[ATTENTION.format(i)] = full if i % 3 == 0 else local
        desc = (
            f"mixed pages (contract.md#grouping-examples, model (c)): "
            f"(F{heads}h, S{other}h, S{other}h) x {repeats}"
        )
    else:
        # Full layers with two head counts: one uniform-type group, two pages.
        narrow = FullAttentionSpec(**{**kw, "num_kv_heads": other})
        for i in range(2 * repeats):
            specs[ATTENTION.format(i)] = full if i % 2 == 0 else narrow
        desc = f"mixed pages: (F{heads}h, F{other}h) x {repeats}"
    return Model(specs, desc)


def mixed_page_models(*, max_layers: int = 64) -> st.SearchStrategy[Model]:
    """Models whose layers have different page sizes: head counts differ.

    See contract.md#grouping-examples, model (c).

    Either full + sliding window layers or full layers only; each kind has a
    single page, so no state bucket of packed grouping mixes pages.
    """
    return _mixed_page_models(max_layers)


@st.composite
def _circular_buffer_models(draw: st.DrawFn, max_layers: int) -> Model:
    full = draw(full_attention_specs(edge=False))
    ring = draw(circular_buffer_specs(block_size=full.block_size, edge=False))
    period = pick(draw, [4, 2, 8])
    repeats = draw(st.integers(1, max(1, max_layers // period)))
    specs: dict[str, KVCacheSpec] = {}
    for i in range(period * repeats):
        if i % period == period - 1:
            specs[f"model.layers.{i}.self_attn.kpool"] = ring
        else:
            specs[ATTENTION.format(i)] = full
    return Model(
        specs, f"ring buffers (GLM5-like kpool): {len(specs) - repeats} full + {repeats} ring"
    )


def circular_buffer_models(*, max_layers: int = 64) -> st.SearchStrategy[Model]:
    """Full attention with a ring buffer (``CircularBufferSpec``) every 2nd..8th layer.

    Its backend only allows BLHNC (contract.md#layouts), which :func:`allowed_layouts` honours.
    """
    return _circular_buffer_models(max_layers)


#: The generic families by name, first in :data:`conformance.generate.families.FAMILIES`.
FAMILIES: dict[str, Callable[..., st.SearchStrategy[Model]]] = {
    "uniform": uniform_models,
    "hybrid": hybrid_models,
    "mla": mla_models,
    "mamba_hybrid": mamba_hybrid_models,
    "cross_attention": cross_attention_models,
    "attention_free": lambda max_layers=64: attention_free_models(),
    "mixed_pages": mixed_page_models,
    "circular_buffer": circular_buffer_models,
}
