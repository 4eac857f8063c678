"""The recurrent-state spec kind (``MambaSpec``): one state per request, not per token.

Import it from :mod:`kvref.specs` (contract.md#spec-kinds).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction
from typing import TYPE_CHECKING, ClassVar

import attrs

from kvref._math import round_up
from kvref._spec_base import KVCacheSpec, MemoryInputs
from kvref._spec_fields import (
    boolean,
    dtype_size,
    homed,
    is_int,
    is_torch_dtype,
    non_negative,
    optional_positive,
    positive,
    to_dtype,
)
from kvref.errors import SpecError

if TYPE_CHECKING:
    import torch

__all__ = ["MambaSpec"]


def _convert_shapes(value: object) -> tuple[tuple[int, ...], ...]:
    if not isinstance(value, (list, tuple)) or not value:
        raise SpecError(f"MambaSpec.shapes={value!r} must be a non-empty sequence of shapes")
    out: list[tuple[int, ...]] = []
    for shape in value:
        if not isinstance(shape, (list, tuple)) or not all(is_int(d) and d > 0 for d in shape):
            raise SpecError(
                f"MambaSpec.shapes={value!r}: shape {shape!r} must be a sequence of positive ints"
            )
        out.append(tuple(shape))
    return tuple(out)


def _convert_dtypes(value: object) -> tuple[torch.dtype, ...]:
    if isinstance(value, str) or is_torch_dtype(value) or not isinstance(value, (list, tuple)):
        raise SpecError(f"MambaSpec.dtypes={value!r} must be a sequence of dtypes")
    return tuple(to_dtype(v, "MambaSpec.dtypes") for v in value)


@homed
@attrs.frozen(kw_only=True, eq=False)
class MambaSpec(KVCacheSpec):
    """A recurrent state layer (vLLM ``MambaSpec``): one state per request, not per token.

    The page is ``Σ round_up(prod(shape_i) * sizeof(dtype_i), state_alignment)``
    or ``page_size_padded``, which must then be a multiple of ``state_alignment``
    (vLLM 0.34.0's field; 1, the default, is vLLM 0.33.0's page).
    """

    kind: ClassVar[str] = "mamba"

    shapes: tuple[tuple[int, ...], ...] = attrs.field(converter=_convert_shapes)
    dtypes: tuple[torch.dtype, ...] = attrs.field(converter=_convert_dtypes)
    state_alignment: int = attrs.field(default=1, validator=positive)
    page_size_padded: int | None = attrs.field(default=None, validator=optional_positive)
    mamba_type: str = attrs.field(default="MAMBA2")
    mamba_cache_mode: str = attrs.field(default="none")
    num_speculative_blocks: int = attrs.field(default=0, validator=non_negative)
    num_prefill_checkpoint_blocks: int = attrs.field(default=0, validator=non_negative)
    prefill_checkpoint_alignment: int | None = attrs.field(
        default=None, validator=optional_positive
    )
    num_heads: int = attrs.field(default=1, validator=positive)
    tokens_per_state: int = attrs.field(default=-1)
    tp_replicated: bool = attrs.field(default=False, validator=boolean)

    def __attrs_post_init__(self) -> None:
        if len(self.shapes) != len(self.dtypes):
            raise SpecError(
                f"MambaSpec: {len(self.shapes)} shapes but {len(self.dtypes)} dtypes "
                f"(shapes={self.shapes!r}, dtypes={self.dtypes!r})"
            )
        if not is_int(self.tokens_per_state):
            raise SpecError(f"MambaSpec.tokens_per_state={self.tokens_per_state!r} must be an int")
        padded = self.page_size_padded
        if padded is not None and padded % self.state_alignment:
            # vLLM 0.34.0 asserts this at construction.
            raise SpecError(
                f"MambaSpec.page_size_padded={padded} must be a multiple of "
                f"MambaSpec.state_alignment={self.state_alignment}"
            )
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
        """``Σ round_up(prod(shape_i) * sizeof(dtype_i), state_alignment)``."""
        return sum(
            round_up(math.prod(shape) * dtype_size(dtype), self.state_alignment)
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
        """Every spec is Mamba with the same extra blocks, alignments, page and replication."""
        return all(
            isinstance(s, MambaSpec)
            and s.num_speculative_blocks == self.num_speculative_blocks
            and s.num_prefill_checkpoint_blocks == self.num_prefill_checkpoint_blocks
            and s.prefill_checkpoint_alignment == self.prefill_checkpoint_alignment
            and s.page_size_bytes == self.page_size_bytes
            and s.state_alignment == self.state_alignment
            and s.tp_replicated == self.tp_replicated
            for s in specs
        )
