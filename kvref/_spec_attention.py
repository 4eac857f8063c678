"""The attention spec kinds, and ``evolve_spec``.

Full attention (with its sink, RSWA and MLA kinds), sliding window (and
sliding-window MLA), chunked local, circular buffer, cross and encoder-only
attention.  Import the names from :mod:`kvref.specs`; the page formula is
contract.md#page-formula, the merge rules contract.md#merge-rules.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import attrs

from kvref._math import cdiv, round_up
from kvref._spec_base import KVCacheSpec, MemoryInputs
from kvref._spec_fields import (
    boolean,
    convert_tokens_per_state,
    dtype_size,
    homed,
    is_int,
    non_negative,
    optional_positive,
    optional_str,
    positive,
    to_dtype,
    tokens_per_state_validator,
)
from kvref.errors import ConflictingWindowError, IncompatibleSpecsError, SpecError

if TYPE_CHECKING:
    import torch

    from kvref.versions import Rules

__all__ = [
    "AttentionSpec",
    "ChunkedLocalAttentionSpec",
    "CircularBufferSpec",
    "CrossAttentionSpec",
    "EncoderOnlyAttentionSpec",
    "FullAttentionSpec",
    "MLAAttentionSpec",
    "RSWASpec",
    "SinkFullAttentionSpec",
    "SlidingWindowMLASpec",
    "SlidingWindowSpec",
    "evolve_spec",
]

_S = TypeVar("_S", bound=KVCacheSpec)

_ATTENTION_COMPARE_FIELDS = (
    "block_size",
    "dcp_sharded",
    "block_stride_alignment",
    "max_tp_shards",
    "num_kv_heads",
    "head_size",
    "head_size_v",
    "dtype",
    "kv_quant_mode",
    "page_size_padded",
    "num_head_slots",
    "state_content_bytes",
    "kv_head_major_slots",
    "tokens_per_state",
)

#: What MLA specs compare besides :data:`_ATTENTION_COMPARE_FIELDS`, after them.
_MLA_COMPARE_FIELDS = (
    *_ATTENTION_COMPARE_FIELDS,
    "cache_dtype_str",
    "topk_buffer_width",
    "model_version",
    "cache_role",
    "is_index_group_leader",
)


def _convert_dtype(value: object) -> torch.dtype:
    return to_dtype(value, "dtype")


@homed
@attrs.frozen(kw_only=True, eq=False)
class AttentionSpec(KVCacheSpec):
    """Base of attention specs (vLLM ``AttentionSpec``), page formula of contract.md#page-formula.

    Attributes:
        num_kv_heads, head_size, dtype: the head geometry; ``dtype`` accepts names.
        head_size_v: defaults to ``head_size`` (0 for MLA kinds).
        kv_quant_mode: an opaque name (vLLM ``KVQuantMode``), ``"NONE"`` by default.
        page_size_padded: bytes per page when padded; never below the real page.
        num_head_slots, state_content_bytes, tokens_per_state: backend-set page shape
            overrides, treated as opaque (``H``, ``C`` and compression).
        max_tp_shards: metadata for TP replication; compared by merge only.
        kv_head_major_slots: the head slots are grouped by KV head, so each KV
            head is one contiguous run of the page (vLLM 0.34.0; part of the
            spec's identity, so of grouping; merges copy the first spec's).
    """

    kind: ClassVar[str] = "attention"
    has_dtype: ClassVar[bool] = True
    _default_head_size_v_is_zero: ClassVar[bool] = False

    dcp_sharded: bool = attrs.field(default=True, validator=boolean)
    num_kv_heads: int = attrs.field(validator=positive)
    head_size: int = attrs.field(validator=positive)
    dtype: torch.dtype = attrs.field(converter=_convert_dtype)
    head_size_v: int | None = attrs.field(default=None)
    max_tp_shards: int | None = attrs.field(default=None, validator=optional_positive)
    kv_quant_mode: str = attrs.field(default="NONE")
    page_size_padded: int | None = attrs.field(default=None, validator=optional_positive)
    num_head_slots: int | None = attrs.field(default=None, validator=optional_positive)
    state_content_bytes: int | None = attrs.field(default=None, validator=optional_positive)
    kv_head_major_slots: bool = attrs.field(default=False, validator=boolean)
    tokens_per_state: int | Fraction = attrs.field(
        default=1, converter=convert_tokens_per_state, validator=tokens_per_state_validator
    )

    def __attrs_post_init__(self) -> None:
        if self.head_size_v is None:
            default = 0 if self._default_head_size_v_is_zero else self.head_size
            self._set_derived_field("head_size_v", default)
        elif not is_int(self.head_size_v) or self.head_size_v < 0:
            raise SpecError(
                f"{type(self).__name__}.head_size_v={self.head_size_v!r} must be a "
                "non-negative int or None"
            )
        if not isinstance(self.kv_quant_mode, str):
            raise SpecError(
                f"{type(self).__name__}.kv_quant_mode={self.kv_quant_mode!r} must be a str"
            )
        if self.tokens_per_state <= 0:
            raise SpecError(
                f"{type(self).__name__}.tokens_per_state={self.tokens_per_state!r} must be positive"
            )
        if self.num_states <= 0:
            raise SpecError(
                f"{type(self).__name__}: block_size={self.block_size} holds no state at "
                f"tokens_per_state={self.tokens_per_state!r}"
            )
        self._apply_alignment()
        self._check_padding()

    def _apply_alignment(self) -> None:
        """Hook for MLA kinds' alignment padding (contract.md#spec-kinds)."""

    @property
    def tokens_per_state_value(self) -> int | Fraction:
        """Tokens per kernel state."""
        return self.tokens_per_state

    @property
    def num_page_heads(self) -> int:
        """``num_head_slots`` if set, else ``num_kv_heads``."""
        return self.num_head_slots if self.num_head_slots is not None else self.num_kv_heads

    @property
    def state_content_size_bytes(self) -> int:
        """``state_content_bytes`` if set, else ``(head_size + head_size_v) * sizeof(dtype)``."""
        if self.state_content_bytes is not None:
            return self.state_content_bytes
        assert self.head_size_v is not None  # set in __attrs_post_init__
        return (self.head_size + self.head_size_v) * dtype_size(self.dtype)

    @property
    def padded_page_size(self) -> int | None:
        """``page_size_padded``."""
        return self.page_size_padded

    @property
    def view_dtype(self) -> torch.dtype | None:
        """The attention dtype."""
        return self.dtype


def _specs_of(
    specs: Sequence[KVCacheSpec], kind: type[_S], group: str, excluded: type | None = None
) -> list[_S]:
    """``specs`` as ``kind`` (none an ``excluded``); ``group`` names the group in the error.

    Raises:
        IncompatibleSpecsError: the first spec that is not a ``kind``, or is an ``excluded``.
    """
    of_kind: list[_S] = []
    for spec in specs:
        if not isinstance(spec, kind) or (excluded is not None and isinstance(spec, excluded)):
            raise IncompatibleSpecsError(f"cannot merge {type(spec).__name__} into {group} group")
        of_kind.append(spec)
    return of_kind


def _check_fields_equal(specs: Sequence[KVCacheSpec], fields: Sequence[str], what: str) -> None:
    """Every spec agrees with the first on ``fields``; ``what`` names the specs in the error.

    Raises:
        IncompatibleSpecsError: the first spec that differs from the first one, naming
            the first field (in ``fields`` order) that differs.
    """
    head = specs[0]
    for spec in specs[1:]:
        for name in fields:
            if getattr(head, name) != getattr(spec, name):
                raise IncompatibleSpecsError(
                    f"cannot merge {what} specs: {name} differs "
                    f"({getattr(head, name)!r} vs {getattr(spec, name)!r})"
                )


def _merge_single_value(specs: Sequence[Any], field: str) -> Any:
    values = {getattr(s, field) for s in specs} - {None}
    if len(values) > 1:
        raise ConflictingWindowError(
            f"cannot merge full-attention specs with different {field} values "
            f"{sorted(values)}: every layer of a group needs the same window size"
        )
    return next(iter(values)) if values else None


@homed
@attrs.frozen(kw_only=True, eq=False)
class FullAttentionSpec(AttentionSpec):
    """Full attention (vLLM ``FullAttentionSpec``); may record a window or chunk after promotion."""

    kind: ClassVar[str] = "full_attention"

    sliding_window: int | None = attrs.field(default=None, validator=optional_positive)
    attention_chunk_size: int | None = attrs.field(default=None, validator=optional_positive)
    non_causal: bool = attrs.field(default=False, validator=boolean)

    def max_memory_usage_bytes(self, config: MemoryInputs) -> int:
        """``cdiv(L', block_size) * page`` with ``L' = cdiv(L, dcp)`` when DCP-sharded."""
        length = config.max_model_len
        dcp = config.decode_context_parallel_size
        if self.dcp_sharded and dcp > 1:
            length = cdiv(length, dcp)
        return cdiv(length, self.block_size) * self.page_size_bytes

    @classmethod
    def uniform_type_base(cls) -> type[KVCacheSpec]:
        """Full attention and its subclasses (MLA included) share one type."""
        return FullAttentionSpec

    @classmethod
    def merge(cls, specs: Sequence[KVCacheSpec], rules: Rules | None = None) -> KVCacheSpec:
        """Merge full-attention specs (contract.md#merge-rules); the same in every release.

        Raises:
            IncompatibleSpecsError: a spec is not full attention, is MLA, a compared
                field differs, or both a window and a chunk size are present.
            ConflictingWindowError: two different windows or chunk sizes.
        """
        full = _specs_of(specs, FullAttentionSpec, "a FullAttentionSpec", MLAAttentionSpec)
        _check_fields_equal(full, _ATTENTION_COMPARE_FIELDS, "full-attention")
        head = full[0]
        window = _merge_single_value(full, "sliding_window")
        chunk = _merge_single_value(full, "attention_chunk_size")
        if window is not None and chunk is not None:
            raise IncompatibleSpecsError(
                f"cannot merge a sliding window ({window}) and a chunk size ({chunk}) in one group"
            )
        return attrs.evolve(
            head,
            sliding_window=window,
            attention_chunk_size=chunk,
            non_causal=any(s.non_causal for s in full),
        )


@homed
@attrs.frozen(kw_only=True, eq=False)
class SinkFullAttentionSpec(FullAttentionSpec):
    """Full attention with attention-sink tokens (vLLM ``SinkFullAttentionSpec``).

    Planned as full attention; ``sink_len`` is taken from the first spec of a
    merge and not compared, as in vLLM.
    """

    kind: ClassVar[str] = "sink_full_attention"

    sink_len: int | None = attrs.field(default=None, validator=optional_positive)


@homed
@attrs.frozen(kw_only=True, eq=False)
class RSWASpec(FullAttentionSpec):
    """Full-attention allocation for a restricted sliding window (vLLM ``RSWASpec``)."""

    kind: ClassVar[str] = "rswa"

    rswa_window: int = attrs.field(validator=positive)

    @classmethod
    def merge(cls, specs: Sequence[KVCacheSpec], rules: Rules | None = None) -> KVCacheSpec:
        """The full-attention merge, and every ``rswa_window`` equal.

        Raises:
            IncompatibleSpecsError: the full-attention rule fails or the windows differ.
        """
        windows = {getattr(s, "rswa_window", None) for s in specs}
        if len(windows) > 1:
            raise IncompatibleSpecsError(
                f"cannot merge RSWA specs with different rswa_window values {windows}"
            )
        return super().merge(specs, rules)


def _mla_alignment(spec: AttentionSpec, alignment: int | None) -> None:
    if alignment is None:
        return
    unpadded = spec.real_page_size_bytes
    padded = round_up(unpadded, alignment)
    if padded != unpadded:
        spec._set_derived_field("page_size_padded", padded)


@homed
@attrs.frozen(kw_only=True, eq=False)
class MLAAttentionSpec(FullAttentionSpec):
    """Multi-head latent attention (vLLM ``MLAAttentionSpec``); ``head_size_v`` defaults to 0.

    ``alignment`` pads the page to a multiple of it when the real page is not
    already aligned (contract.md#spec-kinds).
    """

    kind: ClassVar[str] = "mla"
    _default_head_size_v_is_zero: ClassVar[bool] = True

    cache_dtype_str: str | None = attrs.field(default=None, validator=optional_str)
    topk_buffer_width: int | None = attrs.field(default=None, validator=optional_positive)
    alignment: int | None = attrs.field(default=None, validator=optional_positive)
    model_version: str | None = attrs.field(default=None, validator=optional_str)
    cache_role: str | None = attrs.field(default="SPARSE", validator=optional_str)
    is_index_group_leader: bool = attrs.field(default=False, validator=boolean)
    non_causal_multi_token_decode: bool = attrs.field(default=False, validator=boolean)

    def _apply_alignment(self) -> None:
        _mla_alignment(self, self.alignment)

    @classmethod
    def merge(cls, specs: Sequence[KVCacheSpec], rules: Rules | None = None) -> KVCacheSpec:
        """Merge MLA specs: single values of the MLA fields; drops ``alignment``.

        The window, chunk and ``non_causal`` of full attention are not MLA
        fields: the merged spec has their defaults, as in vLLM (0.33.0 and
        0.34.0).  See contract.md#merge-rules.

        Raises:
            IncompatibleSpecsError: a spec is not MLA or a compared field differs.
        """
        mla = _specs_of(specs, MLAAttentionSpec, "an MLAAttentionSpec")
        _check_fields_equal(mla, _MLA_COMPARE_FIELDS, "MLA")
        head = mla[0]
        # vLLM builds the merged spec from the MLA fields alone: a window or chunk
        # a promotion carried over and ``non_causal`` fall back to their defaults.
        return attrs.evolve(
            head,
            alignment=None,
            sliding_window=None,
            attention_chunk_size=None,
            non_causal=False,
            non_causal_multi_token_decode=any(s.non_causal_multi_token_decode for s in mla),
        )


@homed
@attrs.frozen(kw_only=True, eq=False)
class SlidingWindowSpec(AttentionSpec):
    """Sliding-window attention (vLLM ``SlidingWindowSpec``).

    ``extra_retained_tokens`` is set by Core from the prefill lookahead (contract.md#core-flow).
    """

    kind: ClassVar[str] = "sliding_window"

    sliding_window: int = attrs.field(validator=positive)
    extra_retained_tokens: int = attrs.field(default=0, validator=non_negative)

    def max_memory_usage_bytes(self, config: MemoryInputs) -> int:
        """``(cdiv(min(sw - 1 + extra + I, L), block_size) + 1) * page``.

        Raises:
            SpecError: the spec is DCP-sharded while the DCP size is above 1.
        """
        dcp = config.decode_context_parallel_size
        if self.dcp_sharded and dcp > 1:
            raise SpecError(
                f"{type(self).__name__}: dcp_sharded=True is not supported with "
                f"decode_context_parallel_size={dcp}; sliding-window layers must be DCP-replicated"
            )
        tokens = min(
            self.sliding_window - 1 + self.extra_retained_tokens + config.max_in_flight_tokens,
            config.max_model_len,
        )
        return (cdiv(tokens, self.block_size) + 1) * self.page_size_bytes

    def is_uniform_with_collection(self, specs: Sequence[KVCacheSpec]) -> bool:
        """Every spec is a sliding window (subclasses count) with the same window."""
        return all(
            isinstance(s, SlidingWindowSpec) and s.sliding_window == self.sliding_window
            for s in specs
        )


@homed
@attrs.frozen(kw_only=True, eq=False)
class SlidingWindowMLASpec(SlidingWindowSpec):
    """Sliding-window MLA (vLLM ``SlidingWindowMLASpec``); ``head_size_v`` defaults to 0.

    ``non_causal_multi_token_decode`` is vLLM 0.34.0's (a group capability:
    merges OR it).
    """

    kind: ClassVar[str] = "sliding_window_mla"
    _default_head_size_v_is_zero: ClassVar[bool] = True

    cache_dtype_str: str | None = attrs.field(default=None, validator=optional_str)
    alignment: int | None = attrs.field(default=None, validator=optional_positive)
    model_version: str | None = attrs.field(default=None, validator=optional_str)
    bounded_replay: bool = attrs.field(default=False, validator=boolean)
    non_causal_multi_token_decode: bool = attrs.field(default=False, validator=boolean)

    def _apply_alignment(self) -> None:
        _mla_alignment(self, self.alignment)

    def is_uniform_with_collection(self, specs: Sequence[KVCacheSpec]) -> bool:
        """Every spec is SW-MLA with the same window and ``bounded_replay``."""
        return all(
            isinstance(s, SlidingWindowMLASpec)
            and s.sliding_window == self.sliding_window
            and s.bounded_replay == self.bounded_replay
            for s in specs
        )

    @classmethod
    def merge(cls, specs: Sequence[KVCacheSpec], rules: Rules | None = None) -> KVCacheSpec:
        """Merge SW-MLA specs (contract.md#merge-rules); ``head_size_v`` becomes 0.

        Under ``rules.sliding_window_mla_merge_keys`` (vLLM 0.34.0, the default
        without ``rules``) ``kv_quant_mode`` and ``alignment`` must be equal and
        are kept; vLLM 0.33.0 dropped both to their defaults whatever they were.
        ``non_causal_multi_token_decode`` is OR-ed.

        Raises:
            IncompatibleSpecsError: a spec is not SW-MLA or a compared field differs.
        """
        keys = rules is None or rules.sliding_window_mla_merge_keys
        swm = _specs_of(specs, SlidingWindowMLASpec, "a SlidingWindowMLASpec")
        fields = (
            "dcp_sharded",
            "max_tp_shards",
            "dtype",
            "tokens_per_state",
            "model_version",
            "sliding_window",
            "extra_retained_tokens",
            "bounded_replay",
            "block_stride_alignment",
            *(("kv_quant_mode", "alignment") if keys else ()),
        )
        _check_fields_equal(swm, fields, "sliding-window MLA")
        head = swm[0]
        decode = any(s.non_causal_multi_token_decode for s in swm)
        if keys:
            return attrs.evolve(head, head_size_v=0, non_causal_multi_token_decode=decode)
        return attrs.evolve(
            head,
            kv_quant_mode="NONE",
            alignment=None,
            head_size_v=0,
            non_causal_multi_token_decode=decode,
        )


@homed
@attrs.frozen(kw_only=True, eq=False)
class ChunkedLocalAttentionSpec(AttentionSpec):
    """Chunked local attention (vLLM ``ChunkedLocalAttentionSpec``)."""

    kind: ClassVar[str] = "chunked_local"

    attention_chunk_size: int = attrs.field(validator=positive)

    def max_memory_usage_bytes(self, config: MemoryInputs) -> int:
        """``cdiv(min(chunk + I, L), block_size) * page``."""
        tokens = min(self.attention_chunk_size + config.max_in_flight_tokens, config.max_model_len)
        return cdiv(tokens, self.block_size) * self.page_size_bytes

    def is_uniform_with_collection(self, specs: Sequence[KVCacheSpec]) -> bool:
        """Every spec is chunked-local with the same chunk size."""
        return all(
            isinstance(s, ChunkedLocalAttentionSpec)
            and s.attention_chunk_size == self.attention_chunk_size
            for s in specs
        )


@homed
@attrs.frozen(kw_only=True, eq=False)
class CircularBufferSpec(AttentionSpec):
    """A ring buffer that holds one block per request (vLLM ``CircularBufferSpec``)."""

    kind: ClassVar[str] = "circular_buffer"

    def max_memory_usage_bytes(self, config: MemoryInputs) -> int:
        """One page."""
        return self.page_size_bytes


@homed
@attrs.frozen(kw_only=True, eq=False)
class CrossAttentionSpec(AttentionSpec):
    """Encoder-decoder cross attention (vLLM ``CrossAttentionSpec``)."""

    kind: ClassVar[str] = "cross_attention"

    def max_memory_usage_bytes(self, config: MemoryInputs) -> int:
        """``cdiv(max_num_encoder_input_tokens, block_size) * page``."""
        return cdiv(config.encoder_input_tokens, self.block_size) * self.page_size_bytes


@homed
@attrs.frozen(kw_only=True, eq=False)
class EncoderOnlyAttentionSpec(AttentionSpec):
    """Encoder-only attention: no cache, and not registered for planning.

    See contract.md#spec-kinds.
    """

    kind: ClassVar[str] = "encoder_only"
    registered: ClassVar[bool] = False

    def max_memory_usage_bytes(self, config: MemoryInputs) -> int:
        """Zero: encoder-only layers keep nothing between steps."""
        return 0


def evolve_spec(spec: _S, **changes: Any) -> _S:
    """``attrs.evolve`` that recomputes MLA alignment padding instead of keeping a stale value.

    vLLM's ``dataclasses.replace`` keeps a ``page_size_padded`` that alignment
    set earlier when the new page happens to be aligned (contract.md#spec-kinds); the
    reference recomputes it.
    """
    alignment = getattr(spec, "alignment", None)
    if alignment is not None and "page_size_padded" not in changes:
        changes["page_size_padded"] = None
    return attrs.evolve(spec, **changes)
