"""Hypothesis strategies for KV cache planning problems: the kit's inputs.

Everything here generates *valid* inputs: specs that construct, models that
vLLM 0.33.0 could report, layouts that its ``resolve_kv_cache_layout`` would
pick for the model (SPEC 6 caveats, SPEC 8 last row), pipeline splits with no
empty worker, and memory budgets on both sides of the admission boundary.
Inputs that only exist to show a vLLM defect live in explicitly named
strategies (:func:`vllm_p3_alias_models`), never in the general ones.

Shrinking goes towards small, readable examples: few layers, one KV head,
head size 64, block 16, bf16, no opaque backend fields, LBNHC, one worker,
a budget that fits.

The building blocks, from small to large:

- :func:`dtypes`, :func:`block_sizes`;
- per-layer specs: :func:`full_attention_specs`, :func:`mla_specs`,
  :func:`sliding_window_specs`, :func:`sliding_window_mla_specs`,
  :func:`chunked_local_specs`, :func:`circular_buffer_specs`,
  :func:`mamba_specs`, :func:`cross_attention_specs`;
- whole models (:class:`Model`): :func:`models` and its families;
- :func:`layouts_for` (and the pure rule :func:`allowed_layouts`);
- :func:`planning_configs`, :func:`pp_splits`, :func:`memory_budgets`,
  :func:`num_blocks`;
- :func:`planning_problems`, giving a :class:`PlanningProblem`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

import attrs
import torch
from hypothesis import strategies as st

from kvref._math import cdiv, round_up
from kvref.config import PlanningConfig
from kvref.layout import (
    DEFAULT_LAYOUT_PREFERENCE,
    KVCacheLayout,
    compute_layer_kv_cache_shape_bytes,
)
from kvref.specs import (
    AttentionSpec,
    ChunkedLocalAttentionSpec,
    CircularBufferSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    MultipleOf,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
    UniformTypeKVCacheSpecs,
    dtype_size,
)

__all__ = [
    # records
    "Model",
    "PlanningProblem",
    # scalars
    "dtypes",
    "block_sizes",
    # per-layer specs
    "full_attention_specs",
    "mla_specs",
    "sliding_window_specs",
    "sliding_window_mla_specs",
    "chunked_local_specs",
    "circular_buffer_specs",
    "mamba_specs",
    "cross_attention_specs",
    # models
    "models",
    "uniform_models",
    "hybrid_models",
    "mla_models",
    "mamba_hybrid_models",
    "cross_attention_models",
    "attention_free_models",
    "mixed_page_models",
    "circular_buffer_models",
    "realistic_models",
    "vllm_p3_alias_models",
    "vllm_p3_alias_problems",
    # layouts, configs, splits, budgets
    "allowed_layouts",
    "layouts_for",
    "planning_configs",
    "pp_splits",
    "memory_budgets",
    "num_blocks",
    "planning_problems",
    "MAX_PAGE_BYTES",
    "DEFAULT_MAX_MEMORY_BYTES",
]

#: Largest page the spec strategies emit by default, so plans stay allocatable.
MAX_PAGE_BYTES = 4 * 2**20
#: Default ceiling of one worker's available memory in :func:`planning_problems`
#: (the kit's default device allocation cap).
DEFAULT_MAX_MEMORY_BYTES = 2**30

HEAD_SIZES = (64, 80, 96, 128, 256)
# 16 first: vLLM's default block, and what shrinking should land on.  The rest
# mixes powers of two with the odd sizes platforms produce (80, 528: SPEC 3.8d).
_COMMON_BLOCK_SIZES = (16, 1, 2, 4, 8, 32, 64, 128, 256, 512, 1024, 2048)
_ODD_BLOCK_SIZES = (3, 12, 48, 80, 96, 528, 1000)
BLOCK_SIZE_CHOICES = (*_COMMON_BLOCK_SIZES, *_ODD_BLOCK_SIZES)
KV_HEAD_CHOICES = (1, 2, 4, 8, 16, 32, 64, 128)
SLIDING_WINDOWS = (1024, 128, 512, 4096, 32, 1, 8192)
CHUNK_SIZES = (8192, 1024, 2048, 16)
MAX_MODEL_LENS = (8192, 2048, 4096, 1024, 16384, 32768, 512, 1000, 100, 1)
AUTO_FIT_MAX_MODEL_LENS = (131072, 32768, 8192, 163840)
MAX_NUM_BATCHED_TOKENS = (2048, 8192, 512, 1024, 4096, 16384, 256)

_ATTENTION = "model.layers.{}.self_attn.attn"
_MAMBA = "model.layers.{}.mixer"


# ---------------------------------------------------------------------------
# records


def _read_only_specs(value: Mapping[str, KVCacheSpec]) -> Mapping[str, KVCacheSpec]:
    # A private, read-only copy: a builder that mutates its input (vLLM's
    # default does, SPEC 2) must not change the counterexample the kit prints.
    return MappingProxyType(dict(value))


def _read_only_workers(
    value: Iterable[Mapping[str, KVCacheSpec]],
) -> tuple[Mapping[str, KVCacheSpec], ...]:
    return tuple(_read_only_specs(w) for w in value)


def _int_tuple(value: Iterable[int]) -> tuple[int, ...]:
    return tuple(value)


@attrs.frozen(repr=False)
class Model:
    """A model's KV cache layers: layer name to spec, in layer order, and a description.

    ``specs`` is a read-only copy; insertion order is the model's layer order,
    which vLLM's grouping depends on.
    """

    specs: Mapping[str, KVCacheSpec] = attrs.field(converter=_read_only_specs, hash=False)
    description: str = ""

    def __repr__(self) -> str:
        legend, patterns = _render_layers([self.specs])
        lines = [f"Model({self.description!r}, {len(self.specs)} layers"]
        lines += [f"  {line}" for line in legend]
        if patterns[0]:
            lines.append(f"  layers: {patterns[0]}")
        return "\n".join(lines) + ")"


@attrs.frozen(repr=False)
class PlanningProblem:
    """One cross-worker planning problem: what Core feeds ``get_kv_cache_configs`` (SPEC 5).

    Attributes:
        config: the planning config (layout, lengths, override, auto-fit, ...).
        workers: one read-only ``layer -> spec`` mapping per worker (PP stage).
        available_memory: bytes each worker profiled as free for the KV cache.
        description: how the problem was made, for humans.

    The repr is the counterexample a vendor reads: specs are listed once with
    a letter, and each worker's layers as a run-length pattern of letters.

    """

    config: PlanningConfig
    workers: tuple[Mapping[str, KVCacheSpec], ...] = attrs.field(
        converter=_read_only_workers, hash=False
    )
    available_memory: tuple[int, ...] = attrs.field(converter=_int_tuple)
    description: str = ""

    def __attrs_post_init__(self) -> None:
        if len(self.available_memory) != len(self.workers):
            raise ValueError(
                f"PlanningProblem: {len(self.workers)} workers but "
                f"{len(self.available_memory)} available_memory values"
            )

    @property
    def specs(self) -> Mapping[str, KVCacheSpec]:
        """Every worker's layers in one read-only mapping, in worker order."""
        merged: dict[str, KVCacheSpec] = {}
        for worker in self.workers:
            merged.update(worker)
        return MappingProxyType(merged)

    def worker_specs(self) -> list[dict[str, KVCacheSpec]]:
        """Fresh mutable copies of the workers' mappings, to hand to a builder."""
        return [dict(w) for w in self.workers]

    def __repr__(self) -> str:
        legend, patterns = _render_layers(self.workers)
        lines = [f"PlanningProblem({self.description!r},", f"  config: {_config_repr(self.config)}"]
        lines += [f"  {line}" for line in legend]
        for i, (pattern, avail) in enumerate(zip(patterns, self.available_memory, strict=True)):
            lines.append(
                f"  worker {i}: {pattern or '(no layers)'}; "
                f"available_memory={avail} ({avail / 2**30:.2f} GiB)"
            )
        return "\n".join(lines) + ")"


# ---------------------------------------------------------------------------
# compact reprs

_INDEXED_NAME = re.compile(r"^(.*?)(\d+)(.*)$")
#: Longest run of missing layer indices a pattern bridges with "-" units.
_MAX_GAP = 4


def _value_repr(value: object) -> str:
    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    if isinstance(value, MultipleOf):
        return f"MultipleOf({value.n})"
    if isinstance(value, KVCacheLayout):
        return value.name
    if isinstance(value, frozenset):
        return "{" + _names_repr(sorted(value)) + "}"
    if isinstance(value, tuple):
        inner = ", ".join(_value_repr(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    return repr(value)


def _derived_default(spec: KVCacheSpec, name: str, value: object) -> bool:
    """Whether ``value`` of field ``name`` is what the spec computes by itself."""
    if name == "head_size_v" and isinstance(spec, AttentionSpec):
        mla = isinstance(spec, (MLAAttentionSpec, SlidingWindowMLASpec))
        return value == (0 if mla else spec.head_size)
    if name == "page_size_padded":
        alignment = getattr(spec, "alignment", None)
        # MLA alignment padding is recomputed from ``alignment`` (SPEC 1.3).
        return alignment is not None and value == round_up(spec.real_page_size_bytes, alignment)
    return False


def _spec_repr(spec: KVCacheSpec) -> str:
    """``Class(field=value, ...)`` with only the fields that differ from their defaults."""
    parts = []
    for field in attrs.fields(type(spec)):
        if not field.init:
            continue
        value = getattr(spec, field.name)
        if field.default is not attrs.NOTHING and value == field.default:
            continue
        if _derived_default(spec, field.name, value):
            continue
        parts.append(f"{field.name}={_value_repr(value)}")
    return f"{type(spec).__name__}({', '.join(parts)})"


def _config_repr(config: PlanningConfig) -> str:
    parts = [
        f"{field.name}={_value_repr(getattr(config, field.name))}"
        for field in attrs.fields(PlanningConfig)
        if getattr(config, field.name) != field.default
    ]
    return f"PlanningConfig({', '.join(parts)})"


def _ranges(indices: Sequence[int]) -> str:
    out: list[str] = []
    start = prev = indices[0]
    for i in [*indices[1:], None]:
        if i is not None and i == prev + 1:
            prev = i
            continue
        out.append(str(start) if start == prev else f"{start}..{prev}")
        if i is not None:
            start = prev = i
    return ",".join(out)


def _names_repr(names: Sequence[str]) -> str:
    """Layer names with the same template folded: ``model.layers.{0..3,7}.self_attn.attn``."""
    by_template: dict[tuple[str, str], list[int]] = {}
    plain: list[str] = []
    for name in names:
        match = _INDEXED_NAME.match(name)
        if match is None:
            plain.append(name)
        else:
            by_template.setdefault((match[1], match[3]), []).append(int(match[2]))
    folded = [
        f"{prefix}{{{_ranges(sorted(indices))}}}{suffix}"
        for (prefix, suffix), indices in by_template.items()
    ]
    return ", ".join(folded + plain)


def _letters(n: int) -> str:
    out = ""
    n += 1
    while n:
        n, rem = divmod(n - 1, 26)
        out = chr(ord("A") + rem) + out
    return out


def _compress(seq: Sequence[str]) -> str:
    """Run-length encode ``seq`` with repeated patterns: ``(A*5 B)*10 A*2``."""
    out: list[str] = []
    i, n = 0, len(seq)
    while i < n:
        best_period, best_reps = 1, 1
        for period in range(1, (n - i) // 2 + 1):
            covered = period
            while i + covered < n and seq[i + covered] == seq[i + covered - period]:
                covered += 1
            reps = covered // period
            if reps >= 2 and reps * period > best_reps * best_period:
                best_period, best_reps = period, reps
        if best_reps == 1:
            out.append(seq[i])
        elif best_period == 1:
            unit = seq[i] if "+" not in seq[i] else f"({seq[i]})"
            out.append(f"{unit}*{best_reps}")
        else:
            out.append(f"({_compress(seq[i : i + best_period])})*{best_reps}")
        i += best_period * best_reps
    return " ".join(out)


def _render_layers(
    workers: Sequence[Mapping[str, KVCacheSpec]],
) -> tuple[list[str], list[str]]:
    """Return a legend of distinct ``(name template, spec)`` and a compact pattern per worker.

    Layers ``prefix{i}suffix`` with consecutive ``i`` form one segment,
    printed as ``[lo..hi]`` and a pattern of per-index units (``S+X`` when
    one index holds several layers, as in encoder-decoder models; ``-`` for
    an index without a KV cache layer).
    """
    labels: dict[tuple[str, str, KVCacheSpec, bool], str] = {}
    legend: list[str] = []

    def label(prefix: str, suffix: str, spec: KVCacheSpec, template: str) -> str:
        key = (prefix, suffix, spec, spec.is_draft)
        if key not in labels:
            labels[key] = _letters(len(labels))
            legend.append(f"{labels[key]} = {template}: {_spec_repr(spec)}")
        return labels[key]

    return legend, [_worker_pattern(worker, label) for worker in workers]


@attrs.define
class _Segment:
    """Consecutive layers ``prefix{lo..hi}...``; ``units[k]`` are the labels at index ``lo + k``."""

    prefix: str | None
    lo: int
    hi: int
    units: list[list[str]]

    def render(self) -> str:
        if self.prefix is None:  # a name without an index
            return self.units[0][0]
        span = f"[{self.lo}]" if self.lo == self.hi else f"[{self.lo}..{self.hi}]"
        return f"{span} {_compress(['+'.join(u) for u in self.units])}"


def _worker_pattern(
    worker: Mapping[str, KVCacheSpec], label: Callable[[str, str, KVCacheSpec, str], str]
) -> str:
    segments: list[_Segment] = []
    for name, spec in worker.items():
        match = _INDEXED_NAME.match(name)
        if match is None:
            segments.append(_Segment(None, -1, -1, [[label(name, "", spec, name)]]))
            continue
        prefix, index, suffix = match[1], int(match[2]), match[3]
        letter = label(prefix, suffix, spec, f"{prefix}{{i}}{suffix}")
        last = segments[-1] if segments else None
        if last is not None and last.prefix == prefix and index == last.hi:
            last.units[-1].append(letter)
        elif last is not None and last.prefix == prefix and 0 < index - last.hi <= _MAX_GAP + 1:
            # Short gaps (layers without KV cache, e.g. MLPs) print as "-".
            last.units.extend([["-"]] * (index - last.hi - 1))
            last.units.append([letter])
            last.hi = index
        else:
            segments.append(_Segment(prefix, index, index, [[letter]]))
    return ", ".join(seg.render() for seg in segments)


# ---------------------------------------------------------------------------
# scalars


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


def _rarely(draw: st.DrawFn) -> bool:
    # About one draw in eight; shrinks to False, so opaque backend fields and
    # other edge cases vanish from minimal examples.  Callers draw it before
    # checking whether the edge case applies: Hypothesis orders examples by
    # their choice sequence, shortest first, so a path that skipped this draw
    # would shrink towards whatever made the edge case inapplicable.
    return draw(st.integers(0, 7)) == 7


def _pick_block_size(
    draw: st.DrawFn, token_bytes: int, max_page_bytes: int, tokens_per_state: int = 1
) -> int:
    """Draw a block size whose page (``token_bytes`` per state) stays within ``max_page_bytes``."""
    limit = max(tokens_per_state, max_page_bytes * tokens_per_state // max(token_bytes, 1))
    choices = [b for b in BLOCK_SIZE_CHOICES if tokens_per_state <= b <= limit and b <= 2048]
    if _rarely(draw):
        return draw(st.integers(tokens_per_state, max(tokens_per_state, min(limit, 2048))))
    return draw(st.sampled_from(choices or [tokens_per_state]))


def _alignments() -> st.SearchStrategy[int | MultipleOf]:
    # Byte alignments that backends use (576/512: DeepSeek-V4; 4096: page),
    # or a kernel block size in tokens.  All are multiples of 8 bytes so that
    # typed views of every dtype stay aligned (SPEC 6, P10).
    return st.one_of(
        st.sampled_from([256, 512, 576, 4096, 64]),
        st.builds(MultipleOf, st.sampled_from([16, 32, 64, 128, 256])),
    )


# ---------------------------------------------------------------------------
# per-layer specs


@st.composite
def _attention_kwargs(
    draw: st.DrawFn,
    *,
    block_size: int | None,
    max_page_bytes: int,
    edge: bool,
) -> dict[str, Any]:
    """Draw attention spec keywords: heads, head size, dtype, block and opaque fields."""
    dtype = draw(dtypes())
    heads = draw(st.one_of(st.sampled_from(KV_HEAD_CHOICES), st.integers(1, 128)))
    head_size = draw(st.sampled_from(HEAD_SIZES))
    kw: dict[str, Any] = {"num_kv_heads": heads, "head_size": head_size, "dtype": dtype}
    slots, content = heads, 2 * head_size * dtype_size(dtype)
    if edge and _rarely(draw):
        # Backend customize_spec shapes (SPEC 1.2); the planner treats them as opaque.
        variant = draw(st.sampled_from(["per_token_head", "nvfp4", "b12x"]))
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
        block_size = _pick_block_size(draw, token_bytes, max_page_bytes)
    kw["block_size"] = block_size
    page = token_bytes * block_size
    extras = [e for e in (16, 256, 4096, page) if round_up(page + e, 16) <= max_page_bytes]
    if edge and _rarely(draw) and extras:
        # Multiples of 16 keep every dtype's typed views aligned (SPEC 6, P10).
        kw["page_size_padded"] = round_up(page + draw(st.sampled_from(extras)), 16)
    if edge and _rarely(draw):
        kw["block_stride_alignment"] = draw(_alignments())
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
    return _attention_kwargs(block_size=block_size, max_page_bytes=max_page_bytes, edge=edge).map(
        lambda kw: FullAttentionSpec(**kw)
    )


def cross_attention_specs(
    *, block_size: int | None = None, max_page_bytes: int = MAX_PAGE_BYTES, edge: bool = True
) -> st.SearchStrategy[CrossAttentionSpec]:
    """Encoder-decoder cross attention, with the same geometry as :func:`full_attention_specs`."""
    return _attention_kwargs(block_size=block_size, max_page_bytes=max_page_bytes, edge=edge).map(
        lambda kw: CrossAttentionSpec(**kw)
    )


def circular_buffer_specs(
    *, block_size: int | None = None, max_page_bytes: int = MAX_PAGE_BYTES, edge: bool = True
) -> st.SearchStrategy[CircularBufferSpec]:
    """Ring buffers holding one block per request, with :func:`full_attention_specs` geometry."""
    return _attention_kwargs(block_size=block_size, max_page_bytes=max_page_bytes, edge=edge).map(
        lambda kw: CircularBufferSpec(**kw)
    )


def sliding_window_specs(
    *, block_size: int | None = None, max_page_bytes: int = MAX_PAGE_BYTES, edge: bool = True
) -> st.SearchStrategy[SlidingWindowSpec]:
    """Sliding-window attention (window 1..8192, 1024 first), :func:`full_attention_specs` geometry.

    Never sets ``extra_retained_tokens`` (Core tags it from the config, SPEC 5.1).
    """
    return st.builds(
        lambda kw, window: SlidingWindowSpec(**kw, sliding_window=window),
        _attention_kwargs(block_size=block_size, max_page_bytes=max_page_bytes, edge=edge),
        st.sampled_from(SLIDING_WINDOWS),
    )


def chunked_local_specs(
    *, block_size: int | None = None, max_page_bytes: int = MAX_PAGE_BYTES, edge: bool = True
) -> st.SearchStrategy[ChunkedLocalAttentionSpec]:
    """Chunked local attention (Llama-4-like chunks, 8192 first), full-attention geometry."""
    return st.builds(
        lambda kw, chunk: ChunkedLocalAttentionSpec(**kw, attention_chunk_size=chunk),
        _attention_kwargs(block_size=block_size, max_page_bytes=max_page_bytes, edge=edge),
        st.sampled_from(CHUNK_SIZES),
    )


@st.composite
def _mla_kwargs(
    draw: st.DrawFn, *, block_size: int | None, max_page_bytes: int, edge: bool
) -> dict[str, Any]:
    """MLA geometry: one latent head of 576 (head_size_v 0), dense or fp8_ds_mla."""
    variant = "dense"
    if edge and _rarely(draw):
        variant = draw(st.sampled_from(["fp8_ds_mla", "deepseek_v4"]))
    kw: dict[str, Any] = {"num_kv_heads": 1, "head_size": 576}
    tokens_per_state = 1
    if variant == "dense":
        kw["dtype"] = draw(st.sampled_from([torch.bfloat16, torch.float8_e4m3fn, torch.float16]))
        content = 576 * dtype_size(kw["dtype"])
    elif variant == "fp8_ds_mla":
        kw.update(dtype=torch.uint8, cache_dtype_str="fp8_ds_mla", state_content_bytes=656)
        content = 656
    else:
        # DeepSeek-V4 C4 compressed latent (SPEC 1.3): 4 tokens per state,
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
        block_size = _pick_block_size(draw, content, limit, tokens_per_state)
    kw["block_size"] = block_size
    if edge and _rarely(draw) and "alignment" not in kw:
        kw["alignment"] = draw(st.sampled_from([576, 512, 4096]))
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
    return _mla_kwargs(block_size=block_size, max_page_bytes=max_page_bytes, edge=edge).map(
        lambda kw: MLAAttentionSpec(**kw)
    )


def sliding_window_mla_specs(
    *, block_size: int | None = None, max_page_bytes: int = MAX_PAGE_BYTES, edge: bool = True
) -> st.SearchStrategy[SlidingWindowMLASpec]:
    """Sliding-window MLA (DeepSeek-V4 SWA caches): :func:`mla_specs` geometry, window 128..4096."""

    def build(kw: dict[str, Any], window: int) -> SlidingWindowMLASpec:
        return SlidingWindowMLASpec(**kw, sliding_window=window)

    return st.builds(
        build,
        _mla_kwargs(block_size=block_size, max_page_bytes=max_page_bytes, edge=edge),
        st.sampled_from([128, 1024, 512, 4096]),
    )


@st.composite
def _mamba_state(
    draw: st.DrawFn, *, max_bytes: int
) -> tuple[tuple[tuple[int, ...], ...], tuple[torch.dtype, ...], str]:
    """Realistic conv + SSM state shapes, dtypes and Mamba type, within ``max_bytes``."""
    mamba_type = draw(st.sampled_from(["MAMBA2", "MAMBA1"]))
    conv_dtype = draw(st.sampled_from([torch.bfloat16, torch.float32]))
    ssm_dtype = draw(st.sampled_from([torch.bfloat16, torch.float32]))
    d_conv = draw(st.sampled_from([4, 2, 3]))
    d_state = draw(st.sampled_from([64, 128, 16]))
    heads = draw(st.sampled_from([8, 16, 32, 64, 128, 4, 1]))
    groups = draw(st.sampled_from([1, 8]))  # drawn for MAMBA1 too: see _rarely
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
        size = sum(math.prod(s) * dtype_size(d) for s, d in zip(shapes, dtypes_, strict=True))
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

    @st.composite
    def build(draw: st.DrawFn) -> MambaSpec:
        shapes, dtypes_, mamba_type = draw(_mamba_state(max_bytes=max_page_bytes))
        real = sum(math.prod(s) * dtype_size(d) for s, d in zip(shapes, dtypes_, strict=True))
        mode = mamba_cache_mode or draw(st.sampled_from(["none", "align", "all"]))
        padded = None
        extras = [e for e in (16, 4096, real // 4) if round_up(real + e, 16) <= max_page_bytes]
        if edge and _rarely(draw) and extras:
            padded = round_up(real + draw(st.sampled_from(extras)), 16)
        spec_blocks = draw(st.integers(1, 2)) if edge and _rarely(draw) else 0
        return MambaSpec(
            block_size=block_size if block_size is not None else draw(block_sizes()),
            shapes=shapes,
            dtypes=dtypes_,
            page_size_padded=padded,
            mamba_type=mamba_type,
            mamba_cache_mode=mode,
            num_speculative_blocks=spec_blocks,
        )

    return build()


# ---------------------------------------------------------------------------
# models


def _names(template: str, indices: Iterable[int]) -> list[str]:
    return [template.format(i) for i in indices]


@st.composite
def _uniform_models(draw: st.DrawFn, max_layers: int) -> Model:
    n = draw(st.integers(1, max_layers))
    spec: KVCacheSpec = draw(
        st.one_of(
            full_attention_specs(),
            mla_specs(),
            sliding_window_specs(),
            mamba_specs(),
            chunked_local_specs(),
            sliding_window_mla_specs(),
        )
    )
    template = _MAMBA if isinstance(spec, MambaSpec) else _ATTENTION
    return Model(
        dict.fromkeys(_names(template, range(n)), spec),
        f"uniform: {n} x {type(spec).__name__}",
    )


def uniform_models(*, max_layers: int = 64) -> st.SearchStrategy[Model]:
    """Models of 1..``max_layers`` identical layers of one kind (Llama/DeepSeek/Mamba-like).

    Never cross-attention or ring-buffer only models (no real model has them).
    """
    return _uniform_models(max_layers)


def _draft(spec: KVCacheSpec) -> KVCacheSpec:
    return attrs.evolve(spec, is_draft=True)


@st.composite
def _hybrid_models(draw: st.DrawFn, max_layers: int) -> Model:
    ratio = draw(st.sampled_from(["5:1", "1:1", "3:1"]))
    period = {"5:1": 6, "3:1": 4, "1:1": 2}[ratio]
    kw = draw(_attention_kwargs(block_size=None, max_page_bytes=MAX_PAGE_BYTES, edge=True))
    full = FullAttentionSpec(**kw)
    local: KVCacheSpec
    if ratio == "3:1" and draw(st.booleans()):
        local = ChunkedLocalAttentionSpec(
            **kw, attention_chunk_size=draw(st.sampled_from(CHUNK_SIZES))
        )
    else:
        local = SlidingWindowSpec(**kw, sliding_window=draw(st.sampled_from(SLIDING_WINDOWS)))
    repeats = draw(st.integers(1, max(1, max_layers // period)))
    tail = draw(st.integers(0, period - 1)) if _rarely(draw) else 0
    n = min(repeats * period + tail, max(max_layers, period))
    # gpt-oss puts the window first (S, F, ...); Gemma-3 and Llama-4 end each
    # period with the full layer.  Either way the full layer is index period-1.
    specs: dict[str, KVCacheSpec] = {
        _ATTENTION.format(i): full if i % period == period - 1 else local for i in range(n)
    }
    drafts = draw(st.integers(1, 2)) if _rarely(draw) else 0
    for j in range(drafts):
        # EAGLE draft layers continue the target's numbering (start_layer_id).
        specs[_ATTENTION.format(n + j)] = _draft(full)
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
    which gives the 12-vs-13 case of SPEC 3.8(b) at 24 layers.  Every model
    has at least one full layer; pages are equal across layers.
    """
    return _hybrid_models(max_layers)


@st.composite
def _mla_models(draw: st.DrawFn, max_layers: int) -> Model:
    mla = draw(mla_specs())
    n = draw(st.integers(1, max(1, max_layers - 1)))
    specs: dict[str, KVCacheSpec] = dict.fromkeys(_names(_ATTENTION, range(n)), mla)
    draft = draw(st.sampled_from(["none", "mtp", "swa"])) if _rarely(draw) else "none"
    desc = f"MLA (DeepSeek-like): {n} layers"
    if draft == "mtp":
        specs[_ATTENTION.format(n)] = _draft(mla)
        desc += " + MTP draft"
    elif draft == "swa":
        # SPEC 3.8(e): an MLA target with a sliding-window EAGLE draft.
        kw = draw(
            _attention_kwargs(block_size=mla.block_size, max_page_bytes=MAX_PAGE_BYTES, edge=False)
        )
        specs[_ATTENTION.format(n)] = SlidingWindowSpec(**kw, sliding_window=128, is_draft=True)
        desc += " + sliding-window draft"
    return Model(specs, desc)


def mla_models(*, max_layers: int = 64) -> st.SearchStrategy[Model]:
    """DeepSeek-like MLA models, rarely with an MTP draft or a sliding-window draft (SPEC 3.8e)."""
    return _mla_models(max_layers)


@st.composite
def _mamba_hybrid_models(draw: st.DrawFn, max_layers: int) -> Model:
    dtype = draw(st.sampled_from([torch.bfloat16, torch.float16]))
    heads = draw(st.sampled_from([8, 2, 4, 1, 16]))
    head_size = draw(st.sampled_from([128, 64, 256]))
    token_bytes = heads * 2 * head_size * dtype_size(dtype)
    shapes, dtypes_, mamba_type = draw(_mamba_state(max_bytes=3 * 2**20))
    state = sum(math.prod(s) * dtype_size(d) for s, d in zip(shapes, dtypes_, strict=True))
    shaping = draw(st.sampled_from(["platform", "unpadded"]))
    if shaping == "platform":
        # vLLM's _align_hybrid_block_size (SPEC 3.8d): raise the attention block
        # to a multiple of the 16-token kernel block so one attention page holds
        # the Mamba state, then pad the Mamba page to the attention page.
        block = 16 * cdiv(state, 16 * token_bytes)
        padded: int | None = block * token_bytes
    else:
        block = _pick_block_size(draw, token_bytes, MAX_PAGE_BYTES)
        padded = None
    attention = FullAttentionSpec(
        block_size=block, num_kv_heads=heads, head_size=head_size, dtype=dtype
    )
    mode = draw(st.sampled_from(["none", "align", "all"]))
    # vLLM's Mamba block size is max_model_len without prefix caching of
    # states, and the attention block size with it.
    mamba_block = draw(st.sampled_from([8192, 2048, 32768])) if mode == "none" else block
    mamba = MambaSpec(
        block_size=mamba_block,
        shapes=shapes,
        dtypes=dtypes_,
        page_size_padded=padded,
        mamba_type=mamba_type,
        mamba_cache_mode=mode,
        num_speculative_blocks=draw(st.integers(1, 2)) if _rarely(draw) else 0,
    )
    period = draw(st.sampled_from([4, 2, 6, 8]))
    repeats = draw(st.integers(1, max(1, max_layers // period)))
    n = repeats * period
    specs: dict[str, KVCacheSpec] = {}
    for i in range(n):
        if i % period == period - 1:
            specs[_ATTENTION.format(i)] = attention
        else:
            specs[_MAMBA.format(i)] = mamba
    return Model(
        specs,
        f"Mamba hybrid ({shaping} pages, mode {mode}): {n - repeats} {mamba_type} + "
        f"{repeats} attention",
    )


def mamba_hybrid_models(*, max_layers: int = 64) -> st.SearchStrategy[Model]:
    """Mamba/attention hybrids with attention every 2nd..8th layer (Jamba/Nemotron-H/Zamba-like).

    Mostly with pages as vLLM's platform config pre-shapes them (SPEC 3.8d):
    the attention block raised so its page holds the Mamba state, and the
    Mamba ``page_size_padded`` equal to the attention page; otherwise
    unpadded (mixed pages).  All Mamba layers share one spec and one
    ``mamba_cache_mode``.  Never a model without attention.
    """
    return _mamba_hybrid_models(max_layers)


@st.composite
def _cross_attention_models(draw: st.DrawFn, max_layers: int) -> Model:
    kw = draw(_attention_kwargs(block_size=None, max_page_bytes=MAX_PAGE_BYTES, edge=False))
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
    """Generate the attention-free model: no KV cache layers at all (SPEC 3.1 step 2)."""
    return st.just(Model({}, "attention-free"))


@st.composite
def _mixed_page_models(draw: st.DrawFn, max_layers: int) -> Model:
    # A sixteenth of the page limit: the other head count is at most 16x larger.
    kw = draw(_attention_kwargs(block_size=None, max_page_bytes=MAX_PAGE_BYTES // 16, edge=False))
    heads = kw["num_kv_heads"]
    other = draw(st.sampled_from([h for h in (4, 6, 2, 1, 3, 8, 16) if h != heads]))
    full = FullAttentionSpec(**kw)
    repeats = draw(st.integers(1, max(1, max_layers // 3)))
    specs: dict[str, KVCacheSpec] = {}
    if draw(st.booleans()):
        # SPEC 3.8(c): (F, S, S) x k with sliding windows of another head count.
        local = SlidingWindowSpec(**{**kw, "num_kv_heads": other}, sliding_window=1024)
        for i in range(3 * repeats):
            specs[_ATTENTION.format(i)] = full if i % 3 == 0 else local
        desc = f"mixed pages (SPEC 3.8c): (F{heads}h, S{other}h, S{other}h) x {repeats}"
    else:
        # Full layers with two head counts: one uniform-type group, two pages.
        narrow = FullAttentionSpec(**{**kw, "num_kv_heads": other})
        for i in range(2 * repeats):
            specs[_ATTENTION.format(i)] = full if i % 2 == 0 else narrow
        desc = f"mixed pages: (F{heads}h, F{other}h) x {repeats}"
    return Model(specs, desc)


def mixed_page_models(*, max_layers: int = 64) -> st.SearchStrategy[Model]:
    """Models whose layers have different page sizes (SPEC 3.8c): head counts differ.

    Either full + sliding window layers or full layers only; each kind has a
    single page, so no state bucket of packed grouping mixes pages.
    """
    return _mixed_page_models(max_layers)


@st.composite
def _circular_buffer_models(draw: st.DrawFn, max_layers: int) -> Model:
    full = draw(full_attention_specs(edge=False))
    ring = draw(circular_buffer_specs(block_size=full.block_size, edge=False))
    period = draw(st.sampled_from([4, 2, 8]))
    repeats = draw(st.integers(1, max(1, max_layers // period)))
    specs: dict[str, KVCacheSpec] = {}
    for i in range(period * repeats):
        if i % period == period - 1:
            specs[f"model.layers.{i}.self_attn.kpool"] = ring
        else:
            specs[_ATTENTION.format(i)] = full
    return Model(
        specs, f"ring buffers (GLM5-like kpool): {len(specs) - repeats} full + {repeats} ring"
    )


def circular_buffer_models(*, max_layers: int = 64) -> st.SearchStrategy[Model]:
    """Full attention with a ring buffer (``CircularBufferSpec``) every 2nd..8th layer.

    Its backend only allows BLHNC (SPEC 8), which :func:`allowed_layouts` honours.
    """
    return _circular_buffer_models(max_layers)


def _llama3_8b() -> Model:
    full = FullAttentionSpec(block_size=16, num_kv_heads=8, head_size=128, dtype=torch.bfloat16)
    return Model(dict.fromkeys(_names(_ATTENTION, range(32)), full), "Llama-3-8B-like: 32 full")


def _gemma3_27b() -> Model:
    kw: dict[str, Any] = {
        "block_size": 16,
        "num_kv_heads": 16,
        "head_size": 128,
        "dtype": "bfloat16",
    }
    full, local = FullAttentionSpec(**kw), SlidingWindowSpec(**kw, sliding_window=1024)
    specs: dict[str, KVCacheSpec] = {
        _ATTENTION.format(i): full if i % 6 == 5 else local for i in range(62)
    }
    return Model(specs, "Gemma-3-27B-like: 52 sliding(1024) + 10 full, 5:1")


def _gpt_oss_20b_eagle() -> Model:
    kw: dict[str, Any] = {"block_size": 16, "num_kv_heads": 8, "head_size": 64, "dtype": "bfloat16"}
    full, local = FullAttentionSpec(**kw), SlidingWindowSpec(**kw, sliding_window=128)
    specs: dict[str, KVCacheSpec] = {
        _ATTENTION.format(i): full if i % 2 else local for i in range(24)
    }
    specs[_ATTENTION.format(24)] = _draft(full)
    return Model(specs, "gpt-oss-20b-like + EAGLE draft: 12 sliding(128) vs 13 full (SPEC 3.8b)")


def _deepseek_v3() -> Model:
    mla = MLAAttentionSpec(
        block_size=64,
        num_kv_heads=1,
        max_tp_shards=1,
        head_size=576,
        dtype="bfloat16",
        cache_dtype_str="auto",
    )
    return Model(dict.fromkeys(_names(_ATTENTION, range(61)), mla), "DeepSeek-V3-like: 61 MLA")


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
    return Model(specs, "Nemotron-H-8B-like: 24 Mamba2 + 4 attention, pre-padded (SPEC 3.8d)")


_PRESETS = (_llama3_8b, _gpt_oss_20b_eagle, _gemma3_27b, _deepseek_v3, _nemotron_h_8b)


def realistic_models(*, max_layers: int = 64) -> st.SearchStrategy[Model]:
    """Generate fixed real-size models from the golden set (Llama-3-8B, gpt-oss-20b + EAGLE, ...).

    Only those with at most ``max_layers`` layers; never a model that differs
    from one of the presets.
    """
    presets = [m for m in (p() for p in _PRESETS) if len(m.specs) <= max_layers]
    return st.sampled_from(presets) if presets else st.nothing()


_FAMILIES = {
    "uniform": uniform_models,
    "hybrid": hybrid_models,
    "mla": mla_models,
    "mamba_hybrid": mamba_hybrid_models,
    "cross_attention": cross_attention_models,
    "mixed_pages": mixed_page_models,
    "circular_buffer": circular_buffer_models,
    "realistic": realistic_models,
}


def models(
    *, max_layers: int = 64, families: Sequence[str] | None = None
) -> st.SearchStrategy[Model]:
    """Generate whole models from the families named in ``families``, uniform first.

    Families: ``uniform``, ``hybrid``, ``mla``, ``mamba_hybrid``,
    ``cross_attention``, ``attention_free``, ``mixed_pages``,
    ``circular_buffer``, ``aligned_hybrid`` (full and sliding-window layers of
    one page whose backends ask for different ``block_stride_alignment``:
    :func:`vllm_p3_alias_models`) (the default: all of these) and
    ``realistic`` (fixed presets, opt-in because they would dominate
    shrinking).  Layer names look like vLLM's (``model.layers.{i}.self_attn.attn``).
    Never two specs of one state kind with different pages, and never
    hidden-state or HiSparse specs.

    Raises:
        ValueError: ``families`` names an unknown family.

    """
    if families is None:
        # Presets are opt-in: a sampled preset is a shorter choice sequence
        # than any generated model, so Hypothesis would shrink counterexamples
        # towards a 62-layer preset instead of a 2-layer model.
        families = [f for f in (*_FAMILIES, "attention_free", "aligned_hybrid") if f != "realistic"]
    names = list(families)
    strategies: list[st.SearchStrategy[Model]] = []
    for name in names:
        if name == "attention_free":
            strategies.append(attention_free_models())
        elif name == "aligned_hybrid":
            strategies.append(_vllm_p3_alias_models())
        elif name in _FAMILIES:
            strategies.append(_FAMILIES[name](max_layers=max_layers))
        else:
            known = ", ".join([*_FAMILIES, "attention_free", "aligned_hybrid"])
            raise ValueError(f"models(families=...): unknown family {name!r} (known: {known})")
    return st.one_of(strategies)


@st.composite
def _vllm_p3_alias_models(draw: st.DrawFn) -> Model:
    kw = draw(_attention_kwargs(block_size=None, max_page_bytes=2**16, edge=False))
    page = FullAttentionSpec(**kw).page_size_bytes
    choices = [64, 128, 256, 512, 576, 4096]
    full_alignment = draw(st.sampled_from(choices))
    stride = round_up(page, full_alignment)
    others = [a for a in choices if round_up(page, a) != stride]
    # A multiple of 8 just above the full layers' stride always differs from it.
    local_alignment = draw(st.sampled_from(others)) if others else stride + 8
    full = FullAttentionSpec(**kw, block_stride_alignment=full_alignment)
    local = SlidingWindowSpec(**kw, block_stride_alignment=local_alignment, sliding_window=1024)
    repeats = draw(st.integers(1, 4))
    specs: dict[str, KVCacheSpec] = {
        _ATTENTION.format(i): full if i % 3 == 0 else local for i in range(3 * repeats)
    }
    return Model(
        specs,
        f"aligned hybrid (SPEC 6 P3): (F, S, S) x {repeats}, page {page}, block strides "
        f"{stride} vs {round_up(page, local_alignment)} in layer-outer layouts",
    )


def vllm_p3_alias_models() -> st.SearchStrategy[Model]:
    """Models on which vLLM 0.33.0's layer-outer placement lets block IDs alias (SPEC 6, P3).

    Full and sliding-window layers with one page but different
    ``block_stride_alignment``, so ``round_up(page, alignment)`` differs
    across groups.  Only for demonstrating the defect: pair them with LBNHC or
    LBHNC (:func:`vllm_p3_alias_problems`); :func:`models` mixes them in as the
    ``aligned_hybrid`` family.
    """
    return _vllm_p3_alias_models()


@st.composite
def _vllm_p3_alias_problems(draw: st.DrawFn) -> PlanningProblem:
    model = draw(vllm_p3_alias_models())
    layout = draw(st.sampled_from([KVCacheLayout.LBNHC, KVCacheLayout.LBHNC]))
    config = PlanningConfig(max_model_len=2048, kv_cache_layout=layout)
    page_sum, need = _worker_estimate(model.specs, config)
    budget = (cdiv(need, page_sum) + 1) * page_sum * 4  # the estimate is a lower bound
    return PlanningProblem(config, [model.specs], [budget], model.description)


def vllm_p3_alias_problems() -> st.SearchStrategy[PlanningProblem]:
    """Single-worker problems of :func:`vllm_p3_alias_models` in LBNHC/LBHNC, with room to spare."""
    return _vllm_p3_alias_problems()


# ---------------------------------------------------------------------------
# layouts


def _as_specs(model: Model | Mapping[str, KVCacheSpec]) -> Mapping[str, KVCacheSpec]:
    return model.specs if isinstance(model, Model) else model


def allowed_layouts(model: Model | Mapping[str, KVCacheSpec]) -> tuple[KVCacheLayout, ...]:
    """Layouts vLLM's layout resolution could pick for this model, in vLLM's preference order.

    The rule (SPEC 4.2, SPEC 6 caveats, SPEC 8), kept conservative and
    independent of grouping:

    - attention-free: every layout;
    - LBNHC, LBHNC, BLNHC and BLHNC always (layer-outer ones with mixed
      pages go through page-size unification; with different aligned strides
      across groups vLLM aliases block IDs, SPEC 6, a defect the kit finds);
    - LHBNC and BHLNC only for single-shape models: one ``(H, S, C)``, one
      page, no padding and no ``block_stride_alignment``;
    - a model with a ring buffer (``CircularBufferSpec``): BLHNC only, the
      one layout its backend supports.
    """
    specs = list(_as_specs(model).values())
    if not specs:
        return DEFAULT_LAYOUT_PREFERENCE
    # vLLM's resolution picks LBNHC/LBHNC first whatever the pages and
    # alignments: page-size unification then runs, and with different aligned
    # strides vLLM's own placement aliases block IDs (SPEC 6), which the kit
    # must be able to find.  The kit drops problems the reference rejects.
    allowed = {KVCacheLayout.LBNHC, KVCacheLayout.LBHNC, KVCacheLayout.BLNHC, KVCacheLayout.BLHNC}
    pages = {s.page_size_bytes for s in specs}
    if len(pages) == 1:
        shapes = {compute_layer_kv_cache_shape_bytes(s, 1)[1:] for s in specs}
        plain = all(s.padded_page_size is None and s.block_stride_alignment is None for s in specs)
        if len(shapes) == 1 and plain:
            allowed |= {KVCacheLayout.LHBNC, KVCacheLayout.BHLNC}
    if any(isinstance(s, CircularBufferSpec) for s in specs):
        allowed &= {KVCacheLayout.BLHNC}
    return tuple(layout for layout in DEFAULT_LAYOUT_PREFERENCE if layout in allowed)


def layouts_for(model: Model | Mapping[str, KVCacheSpec]) -> st.SearchStrategy[KVCacheLayout]:
    """Generate a layout from :func:`allowed_layouts`, shrinking to vLLM's first preference.

    Never a layout vLLM's resolution would refuse for the model.
    """
    return st.sampled_from(allowed_layouts(model))


# ---------------------------------------------------------------------------
# configs


def _promotion_succeeds(specs: Sequence[KVCacheSpec]) -> bool:
    """Whether disabling the hybrid manager leaves one group (SPEC 3.2), conservatively.

    True for models already of one type, and for plain full attention plus
    one kind of local attention with a single window (or chunk) and one
    full-attention block size.
    """
    if not specs or UniformTypeKVCacheSpecs.is_uniform_type(list(specs)):
        return True
    plain = (FullAttentionSpec, SlidingWindowSpec, ChunkedLocalAttentionSpec)
    if any(type(s) not in plain for s in specs):
        return False
    fulls = [s for s in specs if type(s) is FullAttentionSpec]
    windows = {s.sliding_window for s in specs if isinstance(s, SlidingWindowSpec)}
    chunks = {s.attention_chunk_size for s in specs if isinstance(s, ChunkedLocalAttentionSpec)}
    return (
        bool(fulls)
        and len(windows) + len(chunks) == 1
        and len({s.block_size for s in fulls}) == 1
        and len({s.dcp_sharded for s in specs}) == 1
    )


def _blocks_per_request(spec: KVCacheSpec, config: PlanningConfig) -> int:
    return cdiv(spec.max_memory_usage_bytes(config), spec.page_size_bytes)


def _worker_estimate(
    worker: Mapping[str, KVCacheSpec],
    config: PlanningConfig,
    model: Mapping[str, KVCacheSpec] | None = None,
) -> tuple[int, int]:
    """``(Σ block strides, bytes one request needs)`` over a worker's device layers.

    The first is about the bytes per block (exact for one layer-outer group,
    an upper bound otherwise).  The second is a lower bound of Core's figure
    (SPEC 5.3), ``bpb * Σ_groups blocks``: the per-layer sum of
    ``max_memory_usage_bytes`` (vLLM's legacy estimate), or the worker's
    largest page times the most blocks any layer of ``model`` needs (every
    global group counts on every worker), whichever is larger.  Neither needs
    grouping, so the kit's inputs do not depend on the planner it tests.
    """
    host = config.host_resident_layers
    device = [s for n, s in worker.items() if n not in host]
    if not device:
        return 0, 0
    everyone = [s for n, s in (model or worker).items() if n not in host] or device
    page_sum = sum(s.block_stride for s in device)
    usage = sum(s.max_memory_usage_bytes(config) for s in device)
    most_blocks = max(_blocks_per_request(s, config) for s in everyone)
    largest_page = max(s.page_size_bytes for s in device)
    return page_sum, max(usage, largest_page * most_blocks)


@st.composite
def _planning_configs(
    draw: st.DrawFn,
    model: Model | Mapping[str, KVCacheSpec],
    pipeline_parallel_size: int,
    max_memory_bytes: int | None,
) -> PlanningConfig:
    specs = _as_specs(model)
    values = list(specs.values())
    layout = draw(layouts_for(specs))
    modes = {s.mamba_cache_mode for s in values if isinstance(s, MambaSpec)}
    mamba_mode = next(iter(modes)) if len(modes) == 1 else "none"
    auto_fit = _rarely(draw)
    base = PlanningConfig(
        kv_cache_layout=layout,
        max_num_batched_tokens=draw(st.sampled_from(MAX_NUM_BATCHED_TOKENS)),
        async_scheduling=not _rarely(draw),
        mamba_cache_mode=mamba_mode,
        pipeline_parallel_size=pipeline_parallel_size,
        auto_fit_max_model_len=auto_fit,
    )
    if auto_fit:
        # The auto-fit upper bound is the model's derived length: large on purpose.
        lengths = list(AUTO_FIT_MAX_MODEL_LENS)
    else:
        lengths = list(MAX_MODEL_LENS)
        mamba_blocks = [s.block_size for s in values if isinstance(s, MambaSpec)]
        if mamba_mode == "none" and mamba_blocks and mamba_blocks[0] not in lengths:
            # vLLM sizes the Mamba block as max_model_len in this mode.
            lengths.insert(0, mamba_blocks[0])
        if max_memory_bytes is not None and values:
            # Lengths whose one request fits in half the memory cap, so that
            # roomy budgets stay under the cap.
            fitting = [
                n
                for n in lengths
                if _worker_estimate(specs, base.with_max_model_len(n))[1] <= max_memory_bytes // 2
            ]
            lengths = fitting or [min(lengths)]
    config = base.with_max_model_len(draw(st.sampled_from(lengths)))

    changes: dict[str, Any] = {}
    if any(isinstance(s, CrossAttentionSpec) for s in values) and draw(st.booleans()):
        changes["max_num_encoder_input_tokens"] = 1500  # Whisper's encoder length
    if any(s.is_draft for s in values):
        # EAGLE: lookahead 1 (so no extra retained tokens) and the block drop.
        changes["num_prefill_lookahead_tokens"] = 1
        changes["eagle_block_drop"] = draw(st.booleans())
    elif _rarely(draw):
        changes["num_prefill_lookahead_tokens"] = draw(st.sampled_from([2, 4]))  # MTP
    if _rarely(draw) and _promotion_succeeds(values):
        changes["disable_hybrid_kv_cache_manager"] = True
    if values and _rarely(draw):
        page_sum = sum(s.block_stride for s in values)
        cap = max(1, min((max_memory_bytes or 64 * 2**30) // page_sum, 65536))
        # At least one request's blocks (an upper bound: one group per layer)
        # plus the null block, or a handful that may not admit a request.
        enough = min(cap, 1 + sum(_blocks_per_request(s, config) for s in values))
        changes["num_gpu_blocks_override"] = draw(
            st.one_of(st.integers(enough, cap), st.integers(1, min(16, cap)))
        )
    if len(values) >= 2 and _rarely(draw):
        changes.update(draw(_host_resident(specs, config)))
    return attrs.evolve(config, **changes) if changes else config


@st.composite
def _host_resident(
    draw: st.DrawFn, specs: Mapping[str, KVCacheSpec], config: PlanningConfig
) -> dict[str, Any]:
    """``host_resident_layers`` (a proper subset of one spec's layers) and a host pool for them."""
    by_spec: dict[KVCacheSpec, list[str]] = {}
    for name, spec in specs.items():
        by_spec.setdefault(spec, []).append(name)
    spec = draw(st.sampled_from(list(by_spec)))
    candidates = by_spec[spec]
    # Keep at least one device layer: a plan with no device group says
    # nothing about device placement.
    most = min(len(candidates), len(specs) - 1)
    host = draw(st.lists(st.sampled_from(candidates), min_size=1, max_size=most, unique=True))
    host_bytes_per_block = len(host) * spec.block_stride
    # vLLM's HiSparse pool holds at least one request plus two blocks.
    minimum = cdiv(config.max_model_len, spec.block_size) + 2
    blocks = draw(st.integers(minimum, 4 * minimum))
    return {
        "host_resident_layers": frozenset(host),
        "host_pool_bytes": blocks * host_bytes_per_block,
    }


def planning_configs(
    model: Model | Mapping[str, KVCacheSpec],
    *,
    pipeline_parallel_size: int = 1,
    max_memory_bytes: int | None = None,
) -> st.SearchStrategy[PlanningConfig]:
    """Planning configs consistent with ``model``.

    Draws: a layout from :func:`layouts_for`; ``max_model_len`` (8192 first;
    with ``max_memory_bytes``, only lengths whose estimated request fits in half
    of it); ``max_num_batched_tokens``; rarely auto-fit (with a large upper
    bound), ``num_gpu_blocks_override`` (enough for a request, or 1..16; at
    most ``max_memory_bytes`` worth of blocks), MTP lookahead,
    ``disable_hybrid_kv_cache_manager`` (only when promotion gives one
    group) and host-resident layers (a proper subset of one spec's layers,
    with a host pool of at least one request).  The Mamba
    cache mode is the model's; draft layers turn on EAGLE's lookahead.
    Never a config that asks for DCP, TP replication or HiSparse.
    """
    return _planning_configs(model, pipeline_parallel_size, max_memory_bytes)


# ---------------------------------------------------------------------------
# splits, budgets, block counts


@st.composite
def _pp_splits(
    draw: st.DrawFn, model: Model | Mapping[str, KVCacheSpec], max_workers: int
) -> list[dict[str, KVCacheSpec]]:
    items = list(_as_specs(model).items())
    n = len(items)
    if n == 0:
        return [{} for _ in range(draw(st.integers(1, max_workers)))]
    workers = draw(st.integers(1, min(max_workers, n)))
    if workers > 1 and draw(st.booleans()):
        cuts = sorted(
            draw(
                st.lists(
                    st.integers(1, n - 1), min_size=workers - 1, max_size=workers - 1, unique=True
                )
            )
        )
    else:
        # vLLM's default: layers spread as evenly as possible over stages.
        cuts = [n * k // workers for k in range(1, workers)]
    bounds = [0, *cuts, n]
    return [dict(items[bounds[k] : bounds[k + 1]]) for k in range(workers)]


def pp_splits(
    model: Model | Mapping[str, KVCacheSpec], *, max_workers: int = 4
) -> st.SearchStrategy[list[dict[str, KVCacheSpec]]]:
    """Pipeline-parallel splits: the layers in order, cut into 1..``max_workers`` contiguous runs.

    Even (vLLM's default, shrinks to it) or uneven cuts.  Never an empty
    worker, except for the attention-free model, whose 1..``max_workers``
    workers all hold no layer (as in vLLM).
    """
    if max_workers < 1:
        raise ValueError(f"pp_splits(max_workers={max_workers}) needs at least one worker")
    return _pp_splits(model, max_workers)


def memory_budgets(
    bytes_per_block: int, blocks_per_request: int, *, max_extra_blocks: int = 4096
) -> st.SearchStrategy[int]:
    """Available-memory figures around Core's admission boundary (SPEC 5.2 steps 4 and 6).

    ``exact`` is ``(blocks_per_request + 1) * bytes_per_block``: the smallest
    budget that admits one request after the null block.  Generates ``exact``
    (shrinks to it), large budgets in ``(exact, exact + max_extra_blocks
    blocks]`` (not always a whole number of blocks), and too-small ones in
    ``[0, exact)``, 0 included.  With ``bytes_per_block == 0``
    (attention-free) any budget up to 1 GiB, 0 first.

    Raises:
        ValueError: a negative argument.

    """
    if bytes_per_block < 0 or blocks_per_request < 0 or max_extra_blocks < 0:
        raise ValueError(
            f"memory_budgets({bytes_per_block}, {blocks_per_request}, "
            f"max_extra_blocks={max_extra_blocks}): arguments must be non-negative"
        )
    if bytes_per_block == 0:
        return st.one_of(st.just(0), st.integers(0, 2**30))
    exact = (blocks_per_request + 1) * bytes_per_block
    large = st.integers(exact + 1, exact + (max_extra_blocks + 1) * bytes_per_block - 1)
    return st.one_of(st.just(exact), large, st.integers(0, exact - 1))


def num_blocks(*, max_value: int = 1 << 16) -> st.SearchStrategy[int]:
    """Block counts for placement: 1 (shrinks to it), small (2..16) and large (up to ``max_value``).

    Never 0 or negative (the block pool needs its null block).
    """
    if max_value < 1:
        raise ValueError(f"num_blocks(max_value={max_value}) must allow at least one block")
    strategies = [st.just(1), st.integers(min(2, max_value), min(16, max_value))]
    if max_value > 16:
        strategies.append(st.integers(17, max_value))
    return st.one_of(strategies)


# ---------------------------------------------------------------------------
# whole problems


@st.composite
def _planning_problems(
    draw: st.DrawFn,
    model_strategy: st.SearchStrategy[Model],
    max_workers: int,
    max_memory_bytes: int,
) -> PlanningProblem:
    model = draw(model_strategy)
    workers = draw(pp_splits(model, max_workers=max_workers))
    config = draw(
        planning_configs(
            model, pipeline_parallel_size=len(workers), max_memory_bytes=max_memory_bytes
        )
    )
    host = config.host_resident_layers
    if host and any(w and all(n in host for n in w) for w in workers):
        # A worker with only host layers has no device group; keep the
        # problem about device placement instead.
        config = attrs.evolve(config, host_resident_layers=frozenset(), host_pool_bytes=None)
    regime = draw(st.sampled_from(["roomy", "boundary", "short"]))
    budgets = []
    for worker in workers:
        page_sum, need = _worker_estimate(worker, config, model.specs)
        if page_sum == 0:
            budgets.append(draw(memory_budgets(0, 0)))
            continue
        # The estimate is a lower bound of Core's figure, often close to it:
        # "boundary" budgets land on both sides of it.
        exact = (cdiv(need, page_sum) + 1) * page_sum
        cap = max(max_memory_bytes, 2 * page_sum)
        if regime == "roomy":
            low = min(4 * exact, cap)
            budgets.append(draw(st.integers(low, max(low, cap))))
        elif regime == "boundary":
            budgets.append(draw(st.integers(max(0, exact - 4 * page_sum), exact + 4 * page_sum)))
        else:
            budgets.append(draw(st.integers(0, max(0, min(exact * 3 // 4, cap)))))
    description = f"{model.description}; {len(workers)} worker(s); {regime} memory"
    return PlanningProblem(config, workers, budgets, description)


def planning_problems(
    *,
    models_strategy: st.SearchStrategy[Model] | None = None,
    max_workers: int = 4,
    max_memory_bytes: int = DEFAULT_MAX_MEMORY_BYTES,
) -> st.SearchStrategy[PlanningProblem]:
    """Whole planning problems: a model, a config, a PP split and each worker's free memory.

    Memory is sized from the model's pages and the estimated bytes of one
    request, in one of three regimes per problem: ``roomy`` (every worker
    has at least four times the estimate; shrinks to it),
    ``boundary`` (within four blocks of it, either side) and ``short``
    (at most 75% of it).  The estimate is a lower bound of what Core
    needs, computed without grouping, so a roomy problem can still be short
    (or fit only after auto-fit).  Budgets stay at or below ``max_memory_bytes``
    when the request fits in it, so most plans are allocatable; the
    attention-free model gets any budget.  Never a problem whose layout
    vLLM would refuse, or with a worker without device layers (unless the
    model is attention-free).
    """
    strategy = models_strategy if models_strategy is not None else models()
    return _planning_problems(strategy, max_workers, max_memory_bytes)
