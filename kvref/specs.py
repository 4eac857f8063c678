"""KV cache spec kinds (contract.md#specs): page size, maximum memory, merge, same-type test.

Every spec is a frozen attrs class whose fields are validated at construction:
a bad value raises :class:`~kvref.errors.SpecError` naming the field and the
value.  Equality and hashing follow vLLM's dataclasses (``is_draft`` is left
out of both).  All fields are keyword-only.

Specs are immutable, so what planning derives from them is computed once per
instance (see ``KVCacheSpec._MEMOISED``): the page geometry, and the tuple of
compared fields that equality and the hash use.  None of it is in the repr or
the pickled state, and ``attrs.evolve`` builds a fresh instance.
"""

from __future__ import annotations

import contextlib
import functools
import math
import sys
from collections.abc import Iterator, Mapping, Sequence
from fractions import Fraction
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeAlias, TypeGuard, TypeVar

import attrs

from kvref._math import cdiv, round_up
from kvref.errors import ConflictingWindowError, IncompatibleSpecsError, SpecError

if TYPE_CHECKING:
    import torch

__all__ = [
    "AttentionSpec",
    "ChunkedLocalAttentionSpec",
    "CircularBufferSpec",
    "CrossAttentionSpec",
    "EncoderOnlyAttentionSpec",
    "FullAttentionSpec",
    "GroupKVCacheSpec",
    "KVCacheSpec",
    "MLAAttentionSpec",
    "MambaSpec",
    "MemoryInputs",
    "MultipleOf",
    "RSWASpec",
    "SinkFullAttentionSpec",
    "SlidingWindowMLASpec",
    "SlidingWindowSpec",
    "UniformTypeKVCacheSpecs",
    "dtype_size",
    "iter_layer_specs",
    "to_dtype",
]

_DTYPE_ALIASES: dict[str, str] = {
    "bf16": "bfloat16",
    "fp16": "float16",
    "half": "float16",
    "fp32": "float32",
    "float": "float32",
    "fp8": "float8_e4m3fn",
    "fp8_e4m3": "float8_e4m3fn",
    "fp8_e5m2": "float8_e5m2",
}


def _is_torch_dtype(value: object) -> TypeGuard[torch.dtype]:
    # A torch.dtype can only exist once torch is imported: asking needs no import.
    torch_module = sys.modules.get("torch")
    return torch_module is not None and isinstance(value, torch_module.dtype)


def to_dtype(value: object, field: str = "dtype") -> torch.dtype:
    """Convert a ``torch.dtype`` or a dtype name ("bfloat16", "bf16", "torch.float16") to a dtype.

    Only a name imports torch: ``import kvref`` and planning on specs built
    from dtype objects never do.

    Raises:
        SpecError: the value is neither a dtype nor the name of one.
    """
    if _is_torch_dtype(value):
        return value
    if isinstance(value, str):
        # Specs hold torch dtypes, so resolving a name is where torch is first needed.
        import torch

        name = value.removeprefix("torch.")
        name = _DTYPE_ALIASES.get(name, name)
        candidate = getattr(torch, name, None)
        if isinstance(candidate, torch.dtype):
            return candidate
    raise SpecError(f"{field}={value!r} is not a torch dtype or the name of one")


def dtype_size(dtype: torch.dtype) -> int:
    """Bytes per element of ``dtype`` (``sizeof`` in the contract)."""
    return int(dtype.itemsize)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _positive(inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not _is_int(value) or value <= 0:  # type: ignore[operator]
        raise SpecError(f"{type(inst).__name__}.{attribute.name}={value!r} must be a positive int")


def _non_negative(inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not _is_int(value) or value < 0:  # type: ignore[operator]
        raise SpecError(
            f"{type(inst).__name__}.{attribute.name}={value!r} must be a non-negative int"
        )


def _optional_positive(inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None:
        _positive(inst, attribute, value)


def _bool(inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, bool):
        raise SpecError(f"{type(inst).__name__}.{attribute.name}={value!r} must be a bool")


def _optional_str(inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None and not isinstance(value, str):
        raise SpecError(f"{type(inst).__name__}.{attribute.name}={value!r} must be a str or None")


@attrs.frozen
class MultipleOf:
    """A block-stride alignment "multiple of ``n`` tokens" (vLLM's ``MultipleOf``).

    The byte alignment it implies depends on the spec: see
    :meth:`KVCacheSpec.get_block_stride_alignment`.
    """

    n: int = attrs.field(validator=_positive)


def _alignment_validator(inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is None or isinstance(value, MultipleOf):
        return
    if not _is_int(value) or value <= 0:  # type: ignore[operator]
        raise SpecError(
            f"{type(inst).__name__}.{attribute.name}={value!r} must be a positive int, "
            "MultipleOf(n) or None"
        )


def _tokens_per_state_validator(
    inst: object, attribute: attrs.Attribute[Any], value: object
) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, Fraction)):
        raise SpecError(
            f"{type(inst).__name__}.{attribute.name}={value!r} must be an int or a Fraction"
        )


def _convert_tokens_per_state(value: object) -> object:
    # Fractions with denominator 1 are ints in vLLM's arithmetic; normalise so
    # that equal values compare equal.
    if isinstance(value, Fraction) and value.denominator == 1:
        return int(value)
    if isinstance(value, str) and "/" in value:
        try:
            return Fraction(value)
        except ValueError:
            return value
    return value


_S = TypeVar("_S", bound="KVCacheSpec")


_EQ_FIELD_NAMES: dict[type[KVCacheSpec], tuple[str, ...]] = {}


def _eq_field_names(cls: type[KVCacheSpec]) -> tuple[str, ...]:
    names = _EQ_FIELD_NAMES.get(cls)
    if names is None:
        names = _EQ_FIELD_NAMES[cls] = tuple(f.name for f in attrs.fields(cls) if f.eq)
    return names


class MemoryInputs(Protocol):
    """What a spec's maximum memory reads from the planning config.

    :class:`kvref.config.PlanningConfig` provides all of it.  The spec kinds
    name this protocol rather than the config class: the config refers to
    specs (its hooks take and return them), so the config must sit above the
    specs, never beside them in an import circle.
    """

    @property
    def max_model_len(self) -> int:
        """Longest request, in tokens."""

    @property
    def decode_context_parallel_size(self) -> int:
        """DCP ranks that shard the token positions of DCP-sharded layers."""

    @property
    def max_in_flight_tokens(self) -> int:
        """``I``: tokens a request may have in flight beyond its window."""

    @property
    def encoder_input_tokens(self) -> int:
        """The cross-attention budget."""

    @property
    def mamba_cache_mode(self) -> str:
        """``"none"``, ``"align"`` or ``"all"``."""


@attrs.frozen(kw_only=True, eq=False)
class KVCacheSpec:
    """Base of every per-layer spec (vLLM ``KVCacheSpec``).

    Attributes:
        block_size: tokens per (manager) block.
        dcp_sharded: token positions are sharded across decode-context-parallel ranks.
        block_stride_alignment: ``None``, a positive int (bytes) or ``MultipleOf(n)``.
        is_draft: the layer belongs to a draft model; excluded from equality and hash.
    """

    kind: ClassVar[str] = "base"
    #: Whether Core's registry check accepts this class (contract.md#spec-registry).
    registered: ClassVar[bool] = True
    #: Whether the class has a ``dtype`` views are reinterpreted as (contract.md#views-and-strides).
    has_dtype: ClassVar[bool] = False

    block_size: int = attrs.field(validator=_positive)
    dcp_sharded: bool = attrs.field(default=False, validator=_bool)
    block_stride_alignment: int | MultipleOf | None = attrs.field(
        default=None, validator=_alignment_validator
    )
    is_draft: bool = attrs.field(default=False, eq=False, validator=_bool)

    #: What is memoised per instance (``functools.cached_property`` slots): the
    #: page geometry and the equality key with its hash.  attrs keeps these
    #: slots out of ``repr`` and the pickled state, and ``attrs.evolve`` builds
    #: a new instance, so a copy never carries a stale value.  Planning reads
    #: the geometry several times per layer and compares thousands of specs.
    _MEMOISED: ClassVar[tuple[str, ...]] = (
        "real_page_size_bytes",
        "page_size_bytes",
        "block_stride_alignment_bytes",
        "block_stride",
        "_eq_key",
        "_hash",
    )

    def _forget_memoised(self) -> None:
        """Drop every memoised value; call after setting a field with ``object.__setattr__``."""
        for name in self._MEMOISED:
            # AttributeError: never computed, or overridden by a plain property.
            with contextlib.suppress(AttributeError):
                object.__delattr__(self, name)

    def _set_derived_field(self, name: str, value: object) -> None:
        # Fields derived in __attrs_post_init__ (frozen): set, then drop what
        # was memoised from the old value while validating.
        object.__setattr__(self, name, value)
        self._forget_memoised()

    # -- equality ----------------------------------------------------------
    # attrs' generated __eq__ builds two tuples of every field on each call.
    # The spec classes are declared with eq=False and compare one memoised
    # tuple of the same fields (those with eq=True, so not is_draft) instead.
    @functools.cached_property
    def _eq_key(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in _eq_field_names(type(self)))

    @functools.cached_property
    def _hash(self) -> int:
        return hash((type(self).__qualname__, self._eq_key))

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self is other or self._eq_key == other._eq_key

    def __hash__(self) -> int:
        return self._hash

    # -- page geometry ---------------------------------------------------
    @property
    def tokens_per_state_value(self) -> int | Fraction:
        """Tokens per kernel state (``> 1`` compression, ``< 1`` several states per token)."""
        return 1

    def get_num_kernel_states(self, kernel_block_size: int) -> int:
        """States stored for a block of ``kernel_block_size`` tokens (contract.md#spec-fields)."""
        tps = self.tokens_per_state_value
        if tps > 0:
            return int(kernel_block_size // tps)
        return 1

    @property
    def num_states(self) -> int:
        """States per manager block (``S``)."""
        return self.get_num_kernel_states(self.block_size)

    @property
    def num_page_heads(self) -> int:
        """Head slots of one page (``H``)."""
        return 1

    @property
    def state_content_size_bytes(self) -> int:
        """Bytes of one (head, state) cell (``C``)."""
        raise NotImplementedError

    @functools.cached_property
    def real_page_size_bytes(self) -> int:
        """The unpadded page: ``H * S * C`` (memoised)."""
        return self.num_page_heads * self.num_states * self.state_content_size_bytes

    @property
    def padded_page_size(self) -> int | None:
        """The padded page, or ``None`` when the spec is not padded."""
        return None

    @functools.cached_property
    def page_size_bytes(self) -> int:
        """Bytes one layer stores per block: the padded page if set, else the real page.

        Memoised, like the rest of the page geometry.
        """
        padded = self.padded_page_size
        return padded if padded is not None else self.real_page_size_bytes

    @property
    def view_dtype(self) -> torch.dtype | None:
        """The dtype a worker reinterprets this layer's bytes as (``None``: raw bytes)."""
        return None

    def _check_padding(self) -> None:
        # vLLM asserts this when the page is read; kvref refuses the spec at once.
        padded = self.padded_page_size
        if padded is not None and padded < self.real_page_size_bytes:
            raise SpecError(
                f"{type(self).__name__}.page_size_padded={padded} is smaller than the real "
                f"page of {self.real_page_size_bytes} bytes"
            )

    def get_block_stride_alignment(self) -> int:
        """Byte alignment of this layer's block stride (contract.md#spec-fields)."""
        return self.block_stride_alignment_bytes

    @functools.cached_property
    def block_stride_alignment_bytes(self) -> int:
        """Memoised :meth:`get_block_stride_alignment`."""
        align = self.block_stride_alignment
        if align is None:
            return 1
        if isinstance(align, int):
            return align
        kernel_bs = math.gcd(align.n, self.block_size)
        if kernel_bs == self.block_size:
            return 1
        # vLLM goes through dataclasses.replace, which carries page_size_padded over.
        return attrs.evolve(self, block_size=kernel_bs).page_size_bytes

    @functools.cached_property
    def block_stride(self) -> int:
        """``round_up(page, alignment)``: the per-layer block stride of layer-outer layouts."""
        return round_up(self.page_size_bytes, self.block_stride_alignment_bytes)

    # -- memory ------------------------------------------------------------
    def max_memory_usage_bytes(self, config: MemoryInputs) -> int:
        """Bytes one request at ``config.max_model_len`` needs for this layer."""
        raise NotImplementedError

    # -- grouping ----------------------------------------------------------
    @classmethod
    def uniform_type_base(cls) -> type[KVCacheSpec]:
        """The registered class used by the same-type test (contract.md#spec-registry)."""
        return cls

    def is_uniform_with_collection(self, specs: Sequence[KVCacheSpec]) -> bool:
        """Whether ``specs`` are of this spec's type (contract.md#spec-registry)."""
        base = self.uniform_type_base()
        return all(isinstance(s, base) for s in specs)

    @classmethod
    def merge(cls, specs: Sequence[KVCacheSpec]) -> KVCacheSpec:
        """Merge specs of one group into one spec (base rule: all equal).

        Raises:
            IncompatibleSpecsError: the specs cannot share one group spec.
        """
        first = specs[0]
        for spec in specs[1:]:
            if spec != first:
                raise IncompatibleSpecsError(f"cannot merge {first!r} with {spec!r}: specs differ")
        return first


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
    "tokens_per_state",
)


def _convert_dtype(value: object) -> torch.dtype:
    return to_dtype(value, "dtype")


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
    """

    kind: ClassVar[str] = "attention"
    has_dtype: ClassVar[bool] = True
    _default_head_size_v_is_zero: ClassVar[bool] = False

    dcp_sharded: bool = attrs.field(default=True, validator=_bool)
    num_kv_heads: int = attrs.field(validator=_positive)
    head_size: int = attrs.field(validator=_positive)
    dtype: torch.dtype = attrs.field(converter=_convert_dtype)
    head_size_v: int | None = attrs.field(default=None)
    max_tp_shards: int | None = attrs.field(default=None, validator=_optional_positive)
    kv_quant_mode: str = attrs.field(default="NONE")
    page_size_padded: int | None = attrs.field(default=None, validator=_optional_positive)
    num_head_slots: int | None = attrs.field(default=None, validator=_optional_positive)
    state_content_bytes: int | None = attrs.field(default=None, validator=_optional_positive)
    tokens_per_state: int | Fraction = attrs.field(
        default=1, converter=_convert_tokens_per_state, validator=_tokens_per_state_validator
    )

    def __attrs_post_init__(self) -> None:
        if self.head_size_v is None:
            default = 0 if self._default_head_size_v_is_zero else self.head_size
            self._set_derived_field("head_size_v", default)
        elif not _is_int(self.head_size_v) or self.head_size_v < 0:
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

    def _attention_fields_equal(self, other: AttentionSpec) -> str | None:
        for name in _ATTENTION_COMPARE_FIELDS:
            if getattr(self, name) != getattr(other, name):
                return name
        return None


def _merge_single_value(specs: Sequence[Any], field: str) -> Any:
    values = {getattr(s, field) for s in specs} - {None}
    if len(values) > 1:
        raise ConflictingWindowError(
            f"cannot merge full-attention specs with different {field} values "
            f"{sorted(values)}: every layer of a group needs the same window size"
        )
    return next(iter(values)) if values else None


@attrs.frozen(kw_only=True, eq=False)
class FullAttentionSpec(AttentionSpec):
    """Full attention (vLLM ``FullAttentionSpec``); may record a window or chunk after promotion."""

    kind: ClassVar[str] = "full_attention"

    sliding_window: int | None = attrs.field(default=None, validator=_optional_positive)
    attention_chunk_size: int | None = attrs.field(default=None, validator=_optional_positive)
    non_causal: bool = attrs.field(default=False, validator=_bool)

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
    def merge(cls, specs: Sequence[KVCacheSpec]) -> KVCacheSpec:
        """Merge full-attention specs (contract.md#merge-rules).

        Raises:
            IncompatibleSpecsError: a spec is not full attention, is MLA, a compared
                field differs, or both a window and a chunk size are present.
            ConflictingWindowError: two different windows or chunk sizes.
        """
        first = specs[0]
        full: list[FullAttentionSpec] = []
        for spec in specs:
            if not isinstance(spec, FullAttentionSpec) or isinstance(spec, MLAAttentionSpec):
                raise IncompatibleSpecsError(
                    f"cannot merge {type(spec).__name__} into a FullAttentionSpec group"
                )
            full.append(spec)
        head = full[0]
        for spec in full[1:]:
            field = head._attention_fields_equal(spec)
            if field is not None:
                raise IncompatibleSpecsError(
                    f"cannot merge full-attention specs: {field} differs "
                    f"({getattr(head, field)!r} vs {getattr(spec, field)!r})"
                )
        window = _merge_single_value(full, "sliding_window")
        chunk = _merge_single_value(full, "attention_chunk_size")
        if window is not None and chunk is not None:
            raise IncompatibleSpecsError(
                f"cannot merge a sliding window ({window}) and a chunk size ({chunk}) in one group"
            )
        del first
        return attrs.evolve(
            head,
            sliding_window=window,
            attention_chunk_size=chunk,
            non_causal=any(s.non_causal for s in full),
        )


@attrs.frozen(kw_only=True, eq=False)
class SinkFullAttentionSpec(FullAttentionSpec):
    """Full attention with attention-sink tokens (vLLM ``SinkFullAttentionSpec``).

    Planned as full attention; ``sink_len`` is taken from the first spec of a
    merge and not compared, as in vLLM.
    """

    kind: ClassVar[str] = "sink_full_attention"

    sink_len: int | None = attrs.field(default=None, validator=_optional_positive)


@attrs.frozen(kw_only=True, eq=False)
class RSWASpec(FullAttentionSpec):
    """Full-attention allocation for a restricted sliding window (vLLM ``RSWASpec``)."""

    kind: ClassVar[str] = "rswa"

    rswa_window: int = attrs.field(validator=_positive)

    @classmethod
    def merge(cls, specs: Sequence[KVCacheSpec]) -> KVCacheSpec:
        """The full-attention merge, and every ``rswa_window`` equal.

        Raises:
            IncompatibleSpecsError: the full-attention rule fails or the windows differ.
        """
        windows = {getattr(s, "rswa_window", None) for s in specs}
        if len(windows) > 1:
            raise IncompatibleSpecsError(
                f"cannot merge RSWA specs with different rswa_window values {windows}"
            )
        return super().merge(specs)


def _mla_alignment(spec: AttentionSpec, alignment: int | None) -> None:
    if alignment is None:
        return
    unpadded = spec.real_page_size_bytes
    padded = round_up(unpadded, alignment)
    if padded != unpadded:
        spec._set_derived_field("page_size_padded", padded)


@attrs.frozen(kw_only=True, eq=False)
class MLAAttentionSpec(FullAttentionSpec):
    """Multi-head latent attention (vLLM ``MLAAttentionSpec``); ``head_size_v`` defaults to 0.

    ``alignment`` pads the page to a multiple of it when the real page is not
    already aligned (contract.md#spec-kinds).
    """

    kind: ClassVar[str] = "mla"
    _default_head_size_v_is_zero: ClassVar[bool] = True

    cache_dtype_str: str | None = attrs.field(default=None, validator=_optional_str)
    topk_buffer_width: int | None = attrs.field(default=None, validator=_optional_positive)
    alignment: int | None = attrs.field(default=None, validator=_optional_positive)
    model_version: str | None = attrs.field(default=None, validator=_optional_str)
    cache_role: str | None = attrs.field(default="SPARSE", validator=_optional_str)
    is_index_group_leader: bool = attrs.field(default=False, validator=_bool)
    non_causal_multi_token_decode: bool = attrs.field(default=False, validator=_bool)

    def _apply_alignment(self) -> None:
        _mla_alignment(self, self.alignment)

    @classmethod
    def merge(cls, specs: Sequence[KVCacheSpec]) -> KVCacheSpec:
        """Merge MLA specs: single values of the MLA fields; drops ``alignment``.

        See contract.md#merge-rules.

        Raises:
            IncompatibleSpecsError: a spec is not MLA or a compared field differs.
        """
        mla: list[MLAAttentionSpec] = []
        for spec in specs:
            if not isinstance(spec, MLAAttentionSpec):
                raise IncompatibleSpecsError(
                    f"cannot merge {type(spec).__name__} into an MLAAttentionSpec group"
                )
            mla.append(spec)
        head = mla[0]
        for spec in mla[1:]:
            field = head._attention_fields_equal(spec)
            if field is None:
                for name in (
                    "cache_dtype_str",
                    "topk_buffer_width",
                    "model_version",
                    "cache_role",
                    "is_index_group_leader",
                ):
                    if getattr(head, name) != getattr(spec, name):
                        field = name
                        break
            if field is not None:
                raise IncompatibleSpecsError(
                    f"cannot merge MLA specs: {field} differs "
                    f"({getattr(head, field)!r} vs {getattr(spec, field)!r})"
                )
        window = _merge_single_value(mla, "sliding_window")
        chunk = _merge_single_value(mla, "attention_chunk_size")
        return attrs.evolve(
            head,
            alignment=None,
            sliding_window=window,
            attention_chunk_size=chunk,
            non_causal=any(s.non_causal for s in mla),
            non_causal_multi_token_decode=any(s.non_causal_multi_token_decode for s in mla),
        )


@attrs.frozen(kw_only=True, eq=False)
class SlidingWindowSpec(AttentionSpec):
    """Sliding-window attention (vLLM ``SlidingWindowSpec``).

    ``extra_retained_tokens`` is set by Core from the prefill lookahead (contract.md#core-flow).
    """

    kind: ClassVar[str] = "sliding_window"

    sliding_window: int = attrs.field(validator=_positive)
    extra_retained_tokens: int = attrs.field(default=0, validator=_non_negative)

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


@attrs.frozen(kw_only=True, eq=False)
class SlidingWindowMLASpec(SlidingWindowSpec):
    """Sliding-window MLA (vLLM ``SlidingWindowMLASpec``); ``head_size_v`` defaults to 0."""

    kind: ClassVar[str] = "sliding_window_mla"
    _default_head_size_v_is_zero: ClassVar[bool] = True

    cache_dtype_str: str | None = attrs.field(default=None, validator=_optional_str)
    alignment: int | None = attrs.field(default=None, validator=_optional_positive)
    model_version: str | None = attrs.field(default=None, validator=_optional_str)
    bounded_replay: bool = attrs.field(default=False, validator=_bool)

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
    def merge(cls, specs: Sequence[KVCacheSpec]) -> KVCacheSpec:
        """Merge SW-MLA specs; drops ``kv_quant_mode``, ``alignment``, ``head_size_v``.

        See contract.md#merge-rules.

        Raises:
            IncompatibleSpecsError: a spec is not SW-MLA or a compared field differs.
        """
        swm: list[SlidingWindowMLASpec] = []
        for spec in specs:
            if not isinstance(spec, SlidingWindowMLASpec):
                raise IncompatibleSpecsError(
                    f"cannot merge {type(spec).__name__} into a SlidingWindowMLASpec group"
                )
            swm.append(spec)
        head = swm[0]
        for spec in swm[1:]:
            for name in (
                "dcp_sharded",
                "max_tp_shards",
                "dtype",
                "tokens_per_state",
                "model_version",
                "sliding_window",
                "extra_retained_tokens",
                "bounded_replay",
                "block_stride_alignment",
            ):
                if getattr(head, name) != getattr(spec, name):
                    raise IncompatibleSpecsError(
                        f"cannot merge sliding-window MLA specs: {name} differs "
                        f"({getattr(head, name)!r} vs {getattr(spec, name)!r})"
                    )
        return attrs.evolve(head, kv_quant_mode="NONE", alignment=None, head_size_v=0)


@attrs.frozen(kw_only=True, eq=False)
class ChunkedLocalAttentionSpec(AttentionSpec):
    """Chunked local attention (vLLM ``ChunkedLocalAttentionSpec``)."""

    kind: ClassVar[str] = "chunked_local"

    attention_chunk_size: int = attrs.field(validator=_positive)

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


@attrs.frozen(kw_only=True, eq=False)
class CircularBufferSpec(AttentionSpec):
    """A ring buffer that holds one block per request (vLLM ``CircularBufferSpec``)."""

    kind: ClassVar[str] = "circular_buffer"

    def max_memory_usage_bytes(self, config: MemoryInputs) -> int:
        """One page."""
        return self.page_size_bytes


@attrs.frozen(kw_only=True, eq=False)
class CrossAttentionSpec(AttentionSpec):
    """Encoder-decoder cross attention (vLLM ``CrossAttentionSpec``)."""

    kind: ClassVar[str] = "cross_attention"

    def max_memory_usage_bytes(self, config: MemoryInputs) -> int:
        """``cdiv(max_num_encoder_input_tokens, block_size) * page``."""
        return cdiv(config.encoder_input_tokens, self.block_size) * self.page_size_bytes


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


def _convert_shapes(value: object) -> tuple[tuple[int, ...], ...]:
    if not isinstance(value, (list, tuple)) or not value:
        raise SpecError(f"MambaSpec.shapes={value!r} must be a non-empty sequence of shapes")
    out: list[tuple[int, ...]] = []
    for shape in value:
        if not isinstance(shape, (list, tuple)) or not all(_is_int(d) and d > 0 for d in shape):
            raise SpecError(
                f"MambaSpec.shapes={value!r}: shape {shape!r} must be a sequence of positive ints"
            )
        out.append(tuple(shape))
    return tuple(out)


def _convert_dtypes(value: object) -> tuple[torch.dtype, ...]:
    if isinstance(value, str) or _is_torch_dtype(value) or not isinstance(value, (list, tuple)):
        raise SpecError(f"MambaSpec.dtypes={value!r} must be a sequence of dtypes")
    return tuple(to_dtype(v, "MambaSpec.dtypes") for v in value)


@attrs.frozen(kw_only=True, eq=False)
class MambaSpec(KVCacheSpec):
    """A recurrent state layer (vLLM ``MambaSpec``): one state per request, not per token.

    The page is ``Σ prod(shape_i) * sizeof(dtype_i)`` or ``page_size_padded``.
    """

    kind: ClassVar[str] = "mamba"

    shapes: tuple[tuple[int, ...], ...] = attrs.field(converter=_convert_shapes)
    dtypes: tuple[torch.dtype, ...] = attrs.field(converter=_convert_dtypes)
    page_size_padded: int | None = attrs.field(default=None, validator=_optional_positive)
    mamba_type: str = attrs.field(default="MAMBA2")
    mamba_cache_mode: str = attrs.field(default="none")
    num_speculative_blocks: int = attrs.field(default=0, validator=_non_negative)
    num_prefill_checkpoint_blocks: int = attrs.field(default=0, validator=_non_negative)
    prefill_checkpoint_alignment: int | None = attrs.field(
        default=None, validator=_optional_positive
    )
    num_heads: int = attrs.field(default=1, validator=_positive)
    tokens_per_state: int = attrs.field(default=-1)
    tp_replicated: bool = attrs.field(default=False, validator=_bool)

    def __attrs_post_init__(self) -> None:
        if len(self.shapes) != len(self.dtypes):
            raise SpecError(
                f"MambaSpec: {len(self.shapes)} shapes but {len(self.dtypes)} dtypes "
                f"(shapes={self.shapes!r}, dtypes={self.dtypes!r})"
            )
        if not _is_int(self.tokens_per_state):
            raise SpecError(f"MambaSpec.tokens_per_state={self.tokens_per_state!r} must be an int")
        self._check_padding()

    @property
    def tokens_per_state_value(self) -> int | Fraction:
        """``tokens_per_state`` (``-1``: one state per block)."""
        return self.tokens_per_state

    @property
    def num_states(self) -> int:
        """Always one state per block (contract.md#spec-kinds: ``S = 1``)."""
        return 1

    @property
    def num_page_heads(self) -> int:
        """``num_heads``: vLLM uses it as the view's ``H`` (in-tree models leave it at 1)."""
        return self.num_heads

    @property
    def real_page_size_bytes(self) -> int:
        """The state bytes ``C``: vLLM leaves ``num_heads`` out of the page."""
        return self.state_content_size_bytes

    def get_num_kernel_states(self, kernel_block_size: int) -> int:
        """One state, whatever the kernel block size."""
        return 1

    @property
    def state_content_size_bytes(self) -> int:
        """``Σ prod(shape_i) * sizeof(dtype_i)``."""
        return sum(
            math.prod(shape) * dtype_size(dtype)
            for shape, dtype in zip(self.shapes, self.dtypes, strict=True)
        )

    @property
    def padded_page_size(self) -> int | None:
        """``page_size_padded``."""
        return self.page_size_padded

    def max_memory_usage_bytes(self, config: MemoryInputs) -> int:
        """``page * (2 + spec + ckpt)`` in ``align`` mode, else ``page * (1 + spec)``."""
        if config.mamba_cache_mode == "align":
            return self.page_size_bytes * (
                2 + self.num_speculative_blocks + self.num_prefill_checkpoint_blocks
            )
        return self.page_size_bytes * (1 + self.num_speculative_blocks)

    def is_uniform_with_collection(self, specs: Sequence[KVCacheSpec]) -> bool:
        """Every spec is Mamba with the same extra blocks, alignment, page and replication."""
        return all(
            isinstance(s, MambaSpec)
            and s.num_speculative_blocks == self.num_speculative_blocks
            and s.num_prefill_checkpoint_blocks == self.num_prefill_checkpoint_blocks
            and s.prefill_checkpoint_alignment == self.prefill_checkpoint_alignment
            and s.page_size_bytes == self.page_size_bytes
            and s.tp_replicated == self.tp_replicated
            for s in specs
        )


def _convert_layer_specs(value: object) -> Mapping[str, KVCacheSpec]:
    if not isinstance(value, Mapping) or not value:
        raise SpecError(
            f"UniformTypeKVCacheSpecs.kv_cache_specs={value!r} must be a non-empty mapping "
            "of layer name to spec"
        )
    for name, spec in value.items():
        if not isinstance(name, str) or not isinstance(spec, KVCacheSpec):
            raise SpecError(
                f"UniformTypeKVCacheSpecs.kv_cache_specs[{name!r}]={spec!r} must map a layer "
                "name to a per-layer KVCacheSpec"
            )
    # A private copy: the caller's dict stays theirs, and ours cannot change.
    return MappingProxyType(dict(value))


@attrs.frozen(kw_only=True)
class UniformTypeKVCacheSpecs:
    """One group whose layers keep their own specs.

    See contract.md#uniform-type-groups (vLLM ``UniformTypeKVCacheSpecs``).

    The specs share a type (see :meth:`is_uniform_type`), one block size and
    one ``dcp_sharded``; their pages may differ.  Not hashable, like vLLM's.
    """

    kind: ClassVar[str] = "uniform_type"

    kv_cache_specs: Mapping[str, KVCacheSpec] = attrs.field(converter=_convert_layer_specs)

    def __deepcopy__(self, memo: dict[int, Any]) -> UniformTypeKVCacheSpecs:
        # The read-only mapping proxy cannot be pickled; copy through a dict.
        import copy

        return UniformTypeKVCacheSpecs(
            kv_cache_specs=copy.deepcopy(dict(self.kv_cache_specs), memo)
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_uniform_type, (dict(self.kv_cache_specs),))

    @property
    def first(self) -> KVCacheSpec:
        """The first layer's spec, which decides the type."""
        return next(iter(self.kv_cache_specs.values()))

    @property
    def block_size(self) -> int:
        """The first spec's block size (all are equal)."""
        return self.first.block_size

    @property
    def dcp_sharded(self) -> bool:
        """The first spec's ``dcp_sharded`` (all are equal)."""
        return self.first.dcp_sharded

    @functools.cached_property
    def page_size_bytes(self) -> int:
        """Sum of the layers' pages: the group's bytes per block before alignment (memoised)."""
        return sum(s.page_size_bytes for s in self.kv_cache_specs.values())

    def max_memory_usage_pages(self, config: MemoryInputs) -> int:
        """``max_i cdiv(maxmem_i, page_i)``: blocks one request needs."""
        return max(
            cdiv(s.max_memory_usage_bytes(config), s.page_size_bytes)
            for s in self.kv_cache_specs.values()
        )

    def max_memory_usage_bytes(self, config: MemoryInputs) -> int:
        """``max_memory_usage_pages * Σ page``."""
        return self.max_memory_usage_pages(config) * self.page_size_bytes

    def get_max_layers_per_page_size(self) -> int:
        """Size of the largest class of layers sharing one page size."""
        counts: dict[int, int] = {}
        for s in self.kv_cache_specs.values():
            counts[s.page_size_bytes] = counts.get(s.page_size_bytes, 0) + 1
        return max(counts.values())

    @staticmethod
    def is_uniform_type(specs: Sequence[KVCacheSpec]) -> bool:
        """Equal block sizes, equal ``dcp_sharded``, and the first spec's same-type test.

        The test is asymmetric on purpose: vLLM lets the first spec decide.
        """
        if not specs:
            return False
        first = specs[0]
        return (
            all(s.block_size == first.block_size for s in specs)
            and all(s.dcp_sharded == first.dcp_sharded for s in specs)
            and first.is_uniform_with_collection(specs)
        )

    @classmethod
    def from_specs(cls, specs: Mapping[str, KVCacheSpec]) -> UniformTypeKVCacheSpecs | None:
        """The wrapper over ``specs`` if they are of one type, else ``None``."""
        if cls.is_uniform_type(list(specs.values())):
            return cls(kv_cache_specs=specs)
        return None


def _rebuild_uniform_type(specs: dict[str, KVCacheSpec]) -> UniformTypeKVCacheSpecs:
    return UniformTypeKVCacheSpecs(kv_cache_specs=specs)


#: What a group carries: a merged per-layer spec or a uniform-type wrapper.
GroupKVCacheSpec: TypeAlias = KVCacheSpec | UniformTypeKVCacheSpecs


def iter_layer_specs(spec: GroupKVCacheSpec) -> Iterator[KVCacheSpec]:
    """The per-layer specs of a wrapper, or the spec itself."""
    if isinstance(spec, UniformTypeKVCacheSpecs):
        yield from spec.kv_cache_specs.values()
    else:
        yield spec


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
