"""The base of every per-layer spec: page geometry, memoised per instance, equality, merge.

Import the names from :mod:`kvref.specs` (contract.md#specs).  Specs are
immutable, so what planning derives from them is computed once per instance
(see ``KVCacheSpec._MEMOISED``): the page geometry, and the tuple of compared
fields that equality and the hash use.  None of it is in the repr or the
pickled state, and ``attrs.evolve`` builds a fresh instance.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Sequence
from fractions import Fraction
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import attrs

from kvref._math import round_up
from kvref._spec_fields import MultipleOf, alignment_validator, boolean, homed, positive
from kvref.errors import IncompatibleSpecsError, SpecError

if TYPE_CHECKING:
    import torch

    from kvref.versions import Rules

__all__ = ["KVCacheSpec", "MemoryInputs"]

_EQ_FIELD_NAMES: dict[type[KVCacheSpec], tuple[str, ...]] = {}


def _eq_field_names(cls: type[KVCacheSpec]) -> tuple[str, ...]:
    names = _EQ_FIELD_NAMES.get(cls)
    if names is None:
        names = _EQ_FIELD_NAMES[cls] = tuple(f.name for f in attrs.fields(cls) if f.eq)
    return names


@homed
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


@homed
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
    #: Whether a worker gives each layer strided views of its page (raw-page kinds do not).
    has_layer_views: ClassVar[bool] = True

    block_size: int = attrs.field(validator=positive)
    dcp_sharded: bool = attrs.field(default=False, validator=boolean)
    block_stride_alignment: int | MultipleOf | None = attrs.field(
        default=None, validator=alignment_validator
    )
    is_draft: bool = attrs.field(default=False, eq=False, validator=boolean)

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
    def merge(cls, specs: Sequence[KVCacheSpec], rules: Rules | None = None) -> KVCacheSpec:
        """Merge specs of one group into one spec (base rule: all equal).

        ``rules`` are the planning rules of the vLLM release planned as
        (:attr:`kvref.PlanningConfig.rules`; ``None``: the newest release's);
        only kinds whose merge differs between releases read them.

        Raises:
            IncompatibleSpecsError: the specs cannot share one group spec.
        """
        first = specs[0]
        for spec in specs[1:]:
            if spec != first:
                raise IncompatibleSpecsError(f"cannot merge {first!r} with {spec!r}: specs differ")
        return first
