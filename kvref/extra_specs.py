"""Spec kinds outside ordinary attention: hidden states and HiSparse's device caches.

- :class:`HiddenStateCacheSpec` marks the layers ``extract_hidden_states``
  stores hidden states in; it is an MLA spec that grouping sets apart
  (contract.md#hidden-state-alignment).
- :class:`HiSparseHotSpec` and :class:`HiSparseResidentSpec` are the device
  caches HiSparse derives from its sparse-MLA source layers
  (contract.md#hisparse).  They are raw pages: no heads, states or dtype,
  and a worker hands every layer the whole backing instead of a per-layer
  view (``has_layer_views`` is false).

Like every kvref spec they are frozen attrs classes whose bad fields raise
:class:`~kvref.errors.SpecError` naming the field and the value.
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol

import attrs

from kvref._math import cdiv
from kvref.errors import SpecError
from kvref.specs import KVCacheSpec, MLAAttentionSpec, dtype_size

__all__ = ["HiSparseHotSpec", "HiSparseResidentSpec", "HiddenStateCacheSpec"]


class _Lengths(Protocol):
    """The planning figures HiSparse's resident cache reads."""

    @property
    def max_model_len(self) -> int:
        """Longest request, in tokens."""

    @property
    def max_in_flight_tokens(self) -> int:
        """Tokens in flight per request."""


@attrs.frozen(kw_only=True)
class HiddenStateCacheSpec(MLAAttentionSpec):
    """A hidden-state cache layer (vLLM ``HiddenStateCacheSpec``, an MLA marker).

    Planned as MLA where all layers share one group (uniform or uniform
    type); otherwise each hidden-state layer gets a group of its own, with a
    block size and padded page aligned to the other groups' common page.
    """

    kind: ClassVar[str] = "hidden_state"

    @property
    def bytes_per_token(self) -> int:
        """``num_kv_heads * head_size * sizeof(dtype)``: what one token stores."""
        return self.num_kv_heads * self.head_size * dtype_size(self.dtype)


def _positive(inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise SpecError(f"{type(inst).__name__}.{attribute.name}={value!r} must be a positive int")


@attrs.frozen(kw_only=True)
class _RawPageSpec(KVCacheSpec):
    """A page of ``page_size`` raw bytes per block, with no per-layer views."""

    #: A worker gives each layer the raw backing, not a strided view.
    has_layer_views: ClassVar[bool] = False
    #: Blocks are per request, never shared through the prefix cache.
    prefix_cacheable: ClassVar[bool] = False

    page_size: int = attrs.field(validator=_positive)

    def get_num_kernel_states(self, kernel_block_size: int) -> int:
        """One state: the page is opaque."""
        return 1

    @property
    def num_states(self) -> int:
        """One state per block (``S = 1``)."""
        return 1

    @property
    def state_content_size_bytes(self) -> int:
        """The whole page (``C = page_size``)."""
        return self.page_size


@attrs.frozen(kw_only=True)
class HiSparseHotSpec(_RawPageSpec):
    """HiSparse's per-request hot buffer on the device (vLLM ``HiSparseHotSpec``).

    Attributes:
        page_size: bytes per block (the source layers' common page).
        blocks_per_request: blocks every request holds, ``cdiv(device_buffer_size, block_size)``.
    """

    kind: ClassVar[str] = "hisparse_hot"

    blocks_per_request: int = attrs.field(validator=_positive)

    def max_memory_usage_bytes(self, config: _Lengths) -> int:
        """``blocks_per_request * page_size``, whatever the length."""
        return self.blocks_per_request * self.page_size


@attrs.frozen(kw_only=True)
class HiSparseResidentSpec(_RawPageSpec):
    """HiSparse's reclaimable device pages of host-backed KV (vLLM ``HiSparseResidentSpec``).

    Attributes:
        page_size: bytes per block (the source layers' common page).
    """

    kind: ClassVar[str] = "hisparse_resident"

    def max_memory_usage_bytes(self, config: _Lengths) -> int:
        """``cdiv(min(I, max_model_len), block_size) * page_size``: the admission window."""
        tokens = min(config.max_in_flight_tokens, config.max_model_len)
        return cdiv(tokens, self.block_size) * self.page_size
