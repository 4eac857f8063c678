"""Per-layer spec strategies and the scalars they draw (dtypes, block sizes, alignments).

Every strategy generates specs that construct, with pages within
``max_page_bytes`` and geometry whose typed views stay aligned; shrinking
goes to one KV head, head size 64, block 16, bf16 and no opaque backend
fields.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from hypothesis import strategies as st

from conformance.check.geometry import round_up
from conformance.generate.sampled_from_cache import pick
from kvref.specs import (
    ChunkedLocalAttentionSpec,
    CircularBufferSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    MambaSpec,
    MLAAttentionSpec,
    MultipleOf,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
    dtype_size,
)

__all__ = [
    "MAX_PAGE_BYTES",
    "block_sizes",
    "chunked_local_specs",
    "circular_buffer_specs",
    "compressed_mla_specs",
    "cross_attention_specs",
    "dtypes",
    "full_attention_specs",
    "kernel_block_alignments",
    "mamba_specs",
    "mla_specs",
    "sliding_window_mla_specs",
    "sliding_window_specs",
    "state_bytes",
]

#: Largest page the spec strategies emit by default, so plans stay allocatable.
MAX_PAGE_BYTES = 4 * 2**20

HEAD_SIZES = (64, 80, 96, 128, 256)
# 16 first: vLLM's default block, and what shrinking should land on.  The rest
# mixes powers of two with the odd sizes platforms produce (80, 528: contract.md#grouping-examples,
# model (d)).
_COMMON_BLOCK_SIZES = (16, 1, 2, 4, 8, 32, 64, 128, 256, 512, 1024, 2048)
_ODD_BLOCK_SIZES = (3, 12, 48, 80, 96, 528, 1000)
BLOCK_SIZE_CHOICES = (*_COMMON_BLOCK_SIZES, *_ODD_BLOCK_SIZES)
KV_HEAD_CHOICES = (1, 2, 4, 8, 16, 32, 64, 128)
#: Built once (generate/sampled_from_cache.py says why): a common head count, or any up to 128.
_KV_HEADS = st.one_of(st.sampled_from(KV_HEAD_CHOICES), st.integers(1, 128))
SLIDING_WINDOWS = (1024, 128, 512, 4096, 32, 1, 8192)
CHUNK_SIZES = (8192, 1024, 2048, 16)
MAX_MODEL_LENS = (8192, 2048, 4096, 1024, 16384, 32768, 512, 1000, 100, 1)
AUTO_FIT_MAX_MODEL_LENS = (131072, 32768, 8192, 163840)
MAX_NUM_BATCHED_TOKENS = (2048, 8192, 512, 1024, 4096, 16384, 256)

ATTENTION = "model.layers.{}.self_attn.attn"
MAMBA = "model.layers.{}.mixer"


def dtypes() -> st.SearchStrategy[torch.dtype]:
    """KV cache dtypes: bf16 (shrinks to it), fp16, fp8 e4m3, fp32 and uint8 (fp8 storage).

    Never generates dtypes vLLM does not store KV in (fp64, int32, bool, ...).
    """
    return st.sampled_from(
        [torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.float32, torch.uint8]
    )


def block_sizes(*, max_value: int = 2048) -> st.SearchStrategy[int]:
    """Tokens per block in ``1..max_value``: common sizes first (16), and any other value.

    Includes non-powers of two (3, 80, 528, 1000, ...). Never 0 or negative.
    """
    common = [b for b in BLOCK_SIZE_CHOICES if b <= max_value] or [1]
    return st.one_of(st.sampled_from(common), st.integers(1, max(1, max_value)))


def rarely(draw: st.DrawFn) -> bool:
    # About one draw in eight; shrinks to False, so opaque backend fields and
    # other edge cases vanish from minimal examples.  Callers draw it before
    # checking whether the edge case applies: Hypothesis orders examples by
    # their choice sequence, shortest first, so a path that skipped this draw
    # would shrink towards whatever made the edge case inapplicable.
    return draw(_EIGHTHS) == 7


_EIGHTHS = st.integers(0, 7)


def pick_block_size(
    draw: st.DrawFn, token_bytes: int, max_page_bytes: int, tokens_per_state: int = 1
) -> int:
    """Draw a block size whose page (``token_bytes`` per state) stays within ``max_page_bytes``."""
    limit = max(tokens_per_state, max_page_bytes * tokens_per_state // max(token_bytes, 1))
    choices = [b for b in BLOCK_SIZE_CHOICES if tokens_per_state <= b <= limit and b <= 2048]
    if rarely(draw):
        return draw(st.integers(tokens_per_state, max(tokens_per_state, min(limit, 2048))))
    return pick(draw, choices or [tokens_per_state])


def alignments() -> st.SearchStrategy[int | MultipleOf]:
    # Byte alignments that backends use (576/512: DeepSeek-V4; 4096: page),
    # or a kernel block size in tokens.  All are multiples of 8 bytes so that
    # typed views of every dtype stay aligned (contract.md#views-and-strides).
    return st.one_of(
        st.sampled_from([256, 512, 576, 4096, 64]),
        st.builds(MultipleOf, st.sampled_from([16, 32, 64, 128, 256])),
    )


#: Kernel block sizes attention backends support (FlashMLA's 64, the indexer
#: kernels' 64/128, paged kernels' 16/32), which vLLM asks for as ``MultipleOf``.
KERNEL_BLOCK_SIZES = (64, 128, 32, 16)


def kernel_block_alignments(
    block_size: int, tokens_per_state: int = 1
) -> st.SearchStrategy[MultipleOf | None]:
    """A backend's kernel block as ``MultipleOf(k)``, ``k`` below and dividing the cache block.

    ``None`` (no kernel block asked: shrinks to it) or a kernel block ``k`` of
    :data:`KERNEL_BLOCK_SIZES` that divides ``block_size`` and holds whole
    states (``tokens_per_state`` divides it), so the worker splits each cache
    block into ``block_size // k`` kernel blocks and the block stride must be
    a multiple of the page at ``k`` tokens (contract.md#views-and-strides).
    Never a kernel block equal to or larger than the cache block (that asks
    for nothing), nor one of a fraction of a state.
    """
    kernels = [
        k
        for k in KERNEL_BLOCK_SIZES
        if k < block_size and block_size % k == 0 and k % max(tokens_per_state, 1) == 0
    ]
    return st.sampled_from([None, *(MultipleOf(k) for k in kernels)])


@st.composite
def attention_kwargs(
    draw: st.DrawFn,
    *,
    block_size: int | None,
    max_page_bytes: int,
    edge: bool,
) -> dict[str, Any]:
    """Draw attention spec keywords: heads, head size, dtype, block and opaque fields."""
    dtype = draw(dtypes())
    heads = draw(_KV_HEADS)
    head_size = pick(draw, HEAD_SIZES)
    kw: dict[str, Any] = {"num_kv_heads": heads, "head_size": head_size, "dtype": dtype}
    slots, content = heads, 2 * head_size * dtype_size(dtype)
    if edge and rarely(draw):
        # Backend customize_spec shapes (contract.md#page-formula); the planner treats them as
        # opaque.
        variant = pick(draw, ["per_token_head", "nvfp4", "b12x"])
        if variant == "per_token_head":
            content = 2 * head_size * dtype_size(dtype) + 8
        elif variant == "nvfp4":
            slots, content = 2 * heads, round_up(head_size // 2 + head_size // 16, 8)
        else:
            slots, content = 2, heads * head_size * dtype_size(dtype)
        if slots != heads:
            kw["num_head_slots"] = slots
        kw["state_content_bytes"] = content
    token_bytes = slots * content
    if block_size is None:
        block_size = pick_block_size(draw, token_bytes, max_page_bytes)
    kw["block_size"] = block_size
    page = token_bytes * block_size
    extras = [e for e in (16, 256, 4096, page) if round_up(page + e, 16) <= max_page_bytes]
    if edge and rarely(draw) and extras:
        # Multiples of 16 keep every dtype's typed views aligned (contract.md#views-and-strides).
        kw["page_size_padded"] = round_up(page + pick(draw, extras), 16)
    if edge and rarely(draw):
        kw["block_stride_alignment"] = draw(alignments())
    return kw


def full_attention_specs(
    *, block_size: int | None = None, max_page_bytes: int = MAX_PAGE_BYTES, edge: bool = True
) -> st.SearchStrategy[FullAttentionSpec]:
    """Generate decoder full attention: 1..128 KV heads, head size 64..256, any KV dtype, any block.

    With ``edge`` it rarely sets the opaque backend fields (``num_head_slots``,
    ``state_content_bytes``, ``page_size_padded``, ``block_stride_alignment``).
    Never generates a recorded ``sliding_window`` or chunk (only promotion
    creates those), a page above ``max_page_bytes`` unless ``block_size`` is
    forced, or ``dcp_sharded=False``.
    """
    return attention_kwargs(block_size=block_size, max_page_bytes=max_page_bytes, edge=edge).map(
        lambda kw: FullAttentionSpec(**kw)
    )


def cross_attention_specs(
    *, block_size: int | None = None, max_page_bytes: int = MAX_PAGE_BYTES, edge: bool = True
) -> st.SearchStrategy[CrossAttentionSpec]:
    """Encoder-decoder cross attention, with the same geometry as :func:`full_attention_specs`."""
    return attention_kwargs(block_size=block_size, max_page_bytes=max_page_bytes, edge=edge).map(
        lambda kw: CrossAttentionSpec(**kw)
    )


def circular_buffer_specs(
    *, block_size: int | None = None, max_page_bytes: int = MAX_PAGE_BYTES, edge: bool = True
) -> st.SearchStrategy[CircularBufferSpec]:
    """Ring buffers holding one block per request, with :func:`full_attention_specs` geometry."""
    return attention_kwargs(block_size=block_size, max_page_bytes=max_page_bytes, edge=edge).map(
        lambda kw: CircularBufferSpec(**kw)
    )


def sliding_window_specs(
    *, block_size: int | None = None, max_page_bytes: int = MAX_PAGE_BYTES, edge: bool = True
) -> st.SearchStrategy[SlidingWindowSpec]:
    """Sliding-window attention (window 1..8192, 1024 first), :func:`full_attention_specs` geometry.

    Never sets ``extra_retained_tokens`` (Core tags it from the config, contract.md#core-flow).
    """
    return st.builds(
        lambda kw, window: SlidingWindowSpec(**kw, sliding_window=window),
        attention_kwargs(block_size=block_size, max_page_bytes=max_page_bytes, edge=edge),
        st.sampled_from(SLIDING_WINDOWS),
    )


def chunked_local_specs(
    *, block_size: int | None = None, max_page_bytes: int = MAX_PAGE_BYTES, edge: bool = True
) -> st.SearchStrategy[ChunkedLocalAttentionSpec]:
    """Chunked local attention (Llama-4-like chunks, 8192 first), full-attention geometry."""
    return st.builds(
        lambda kw, chunk: ChunkedLocalAttentionSpec(**kw, attention_chunk_size=chunk),
        attention_kwargs(block_size=block_size, max_page_bytes=max_page_bytes, edge=edge),
        st.sampled_from(CHUNK_SIZES),
    )


@st.composite
def mla_kwargs(
    draw: st.DrawFn, *, block_size: int | None, max_page_bytes: int, edge: bool
) -> dict[str, Any]:
    """MLA geometry: one latent head of 576 (head_size_v 0), dense or fp8_ds_mla."""
    variant = "dense"
    if edge and rarely(draw):
        variant = pick(draw, ["fp8_ds_mla", "deepseek_v4"])
    kw: dict[str, Any] = {"num_kv_heads": 1, "head_size": 576}
    tokens_per_state = 1
    if variant == "dense":
        kw["dtype"] = pick(draw, [torch.bfloat16, torch.float8_e4m3fn, torch.float16])
        content = 576 * dtype_size(kw["dtype"])
    elif variant == "fp8_ds_mla":
        kw.update(dtype=torch.uint8, cache_dtype_str="fp8_ds_mla", state_content_bytes=656)
        content = 656
    else:
        # DeepSeek-V4 C4 compressed latent (contract.md#spec-kinds): 4 tokens per state,
        # 584-byte states, pages padded to a multiple of 576.
        kw.update(
            dtype=torch.uint8,
            cache_dtype_str="fp8_ds_mla",
            state_content_bytes=584,
            tokens_per_state=4,
            alignment=576,
            model_version="deepseek_v4",
        )
        content, tokens_per_state = 584, 4
    if block_size is None:
        # Leave room for alignment padding (at most 4096 bytes) under the limit.
        limit = max(max_page_bytes - 4096, content)
        block_size = pick_block_size(draw, content, limit, tokens_per_state)
    kw["block_size"] = block_size
    if edge and rarely(draw) and "alignment" not in kw:
        kw["alignment"] = pick(draw, [576, 512, 4096])
    return kw


def mla_specs(
    *, block_size: int | None = None, max_page_bytes: int = MAX_PAGE_BYTES, edge: bool = True
) -> st.SearchStrategy[MLAAttentionSpec]:
    """Multi-head latent attention: 1 head of 576, ``head_size_v`` 0, bf16/fp8/fp16.

    With ``edge`` it rarely gives ``cache_dtype_str='fp8_ds_mla'`` (uint8,
    656-byte states), a DeepSeek-V4 compressed variant (4 tokens per state,
    alignment 576), or an ``alignment``.  Never an explicit ``page_size_padded``
    (MLA pads only through ``alignment``).
    """
    return mla_kwargs(block_size=block_size, max_page_bytes=max_page_bytes, edge=edge).map(
        lambda kw: MLAAttentionSpec(**kw)
    )


@st.composite
def compressed_mla_specs(draw: st.DrawFn) -> MLAAttentionSpec:
    """Compressed MLA latents served by a platform's own backend (not DeepSeek-V4's).

    DeepSeek-V4-style geometry (C4 or C128: 4 or 128 tokens per state;
    fp8 states of 584 bytes padded to a multiple of 576, or bf16 ones of
    1024 padded to 512) on a 128- to 512-token block, and sometimes a kernel
    block smaller than the cache block (:func:`kernel_block_alignments`).
    Never ``model_version='deepseek_v4'``: that names the CUDA backends,
    which allow only block-outer layouts (contract.md#layouts); a platform
    with its own backend may be placed in any layout.
    """
    tokens_per_state = pick(draw, [4, 128])
    block = pick(draw, [b for b in (256, 128, 512) if b >= tokens_per_state])
    kw: dict[str, Any] = (
        {"dtype": torch.uint8, "cache_dtype_str": "fp8_ds_mla", "state_content_bytes": 584}
        if draw(st.booleans())
        else {"dtype": torch.bfloat16, "cache_dtype_str": "auto"}
    )
    return MLAAttentionSpec(
        block_size=block,
        num_kv_heads=1,
        head_size=512,
        tokens_per_state=tokens_per_state,
        alignment=576 if kw["dtype"] == torch.uint8 else 512,
        block_stride_alignment=draw(kernel_block_alignments(block, tokens_per_state)),
        **kw,
    )


def sliding_window_mla_specs(
    *, block_size: int | None = None, max_page_bytes: int = MAX_PAGE_BYTES, edge: bool = True
) -> st.SearchStrategy[SlidingWindowMLASpec]:
    """Sliding-window MLA (DeepSeek-V4 SWA caches): :func:`mla_specs` geometry, window 128..4096."""

    def build(kw: dict[str, Any], window: int) -> SlidingWindowMLASpec:
        return SlidingWindowMLASpec(**kw, sliding_window=window)

    return st.builds(
        build,
        mla_kwargs(block_size=block_size, max_page_bytes=max_page_bytes, edge=edge),
        st.sampled_from([128, 1024, 512, 4096]),
    )


@st.composite
def mamba_state(
    draw: st.DrawFn, *, max_bytes: int
) -> tuple[tuple[tuple[int, ...], ...], tuple[torch.dtype, ...], str]:
    """Realistic conv + SSM state shapes, dtypes and Mamba type, within ``max_bytes``."""
    mamba_type = pick(draw, ["MAMBA2", "MAMBA1"])
    conv_dtype = pick(draw, [torch.bfloat16, torch.float32])
    ssm_dtype = pick(draw, [torch.bfloat16, torch.float32])
    d_conv = pick(draw, [4, 2, 3])
    d_state = pick(draw, [64, 128, 16])
    heads = pick(draw, [8, 16, 32, 64, 128, 4, 1])
    groups = pick(draw, [1, 8])  # drawn for MAMBA1 too: see rarely
    while True:
        if mamba_type == "MAMBA2":
            head_dim = 64
            intermediate = heads * head_dim
            shapes: tuple[tuple[int, ...], ...] = (
                (d_conv - 1, intermediate + 2 * groups * d_state),
                (heads, head_dim, d_state),
            )
        else:
            intermediate = heads * 128
            shapes = ((d_conv - 1, intermediate), (intermediate, d_state))
        dtypes_ = (conv_dtype, ssm_dtype)
        size = state_bytes(shapes, dtypes_)
        if size <= max_bytes or heads == 1:
            return shapes, dtypes_, mamba_type
        heads //= 2


def mamba_specs(
    *,
    block_size: int | None = None,
    mamba_cache_mode: str | None = None,
    max_page_bytes: int = MAX_PAGE_BYTES,
    edge: bool = True,
) -> st.SearchStrategy[MambaSpec]:
    """Mamba1/Mamba2 state layers: conv + SSM states in bf16/fp32, one state per request.

    With ``edge`` it rarely pads the page (``page_size_padded`` >= the real
    page, a multiple of 16) and adds speculative blocks.  ``mamba_cache_mode``
    is drawn from ``none``/``align``/``all`` unless given.  Never a page above
    ``max_page_bytes`` (except a 1-head state that is larger by itself) and
    never a mode outside vLLM's three.
    """
    # Decorated once, at import: a composite made per call costs a source parse.
    return _mamba_spec(block_size, mamba_cache_mode, max_page_bytes, edge)


@st.composite
def _mamba_spec(
    draw: st.DrawFn,
    block_size: int | None,
    mamba_cache_mode: str | None,
    max_page_bytes: int,
    edge: bool,
) -> MambaSpec:
    shapes, dtypes_, mamba_type = draw(mamba_state(max_bytes=max_page_bytes))
    real = state_bytes(shapes, dtypes_)
    mode = mamba_cache_mode or pick(draw, ["none", "align", "all"])
    padded = None
    extras = [e for e in (16, 4096, real // 4) if round_up(real + e, 16) <= max_page_bytes]
    if edge and rarely(draw) and extras:
        padded = round_up(real + pick(draw, extras), 16)
    spec_blocks = draw(st.integers(1, 2)) if edge and rarely(draw) else 0
    return MambaSpec(
        block_size=block_size if block_size is not None else draw(block_sizes()),
        shapes=shapes,
        dtypes=dtypes_,
        page_size_padded=padded,
        mamba_type=mamba_type,
        mamba_cache_mode=mode,
        num_speculative_blocks=spec_blocks,
    )


def state_bytes(shapes: tuple[tuple[int, ...], ...], dtypes: tuple[torch.dtype, ...]) -> int:
    """The bytes of a state held as tensors of ``shapes``, each in its dtype of ``dtypes``."""
    return sum(
        dtype_size(dtype) * math.prod(shape) for shape, dtype in zip(shapes, dtypes, strict=True)
    )
