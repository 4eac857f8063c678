"""Layouts vLLM's layout resolution could pick for a model.

See contract.md#default-placement and contract.md#memory-safety and contract.md#layouts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from hypothesis import strategies as st

from conformance.generate.records import Model
from kvref.layout import (
    DEFAULT_LAYOUT_PREFERENCE,
    KVCacheLayout,
    compute_layer_kv_cache_shape_bytes,
)
from kvref.specs import CircularBufferSpec, KVCacheSpec, MambaSpec, MLAAttentionSpec

__all__ = ["allowed_layouts", "as_specs", "layouts_for"]


def as_specs(model: Model | Mapping[str, KVCacheSpec]) -> Mapping[str, KVCacheSpec]:
    """The ``layer -> spec`` mapping of a :class:`Model` or of a plain mapping."""
    return model.specs if isinstance(model, Model) else model


def allowed_layouts(model: Model | Mapping[str, KVCacheSpec]) -> tuple[KVCacheLayout, ...]:
    """Layouts vLLM's layout resolution could pick for this model, in vLLM's preference order.

    The rule (contract.md#default-placement, contract.md#memory-safety, contract.md#layouts), kept
    conservative and independent of grouping:

    - attention-free: every layout;
    - LBNHC, LBHNC, BLNHC and BLHNC always (layer-outer ones with mixed
      pages go through page-size unification; with different aligned strides
      across groups vLLM aliases block IDs, contract.md#memory-safety, a defect the kit finds);
    - LHBNC and BHLNC only for single-shape models: one ``(H, S, C)``, one
      page, no padding and no ``block_stride_alignment``;
    - a model with a ring buffer (``CircularBufferSpec``): BLHNC only, the
      one layout its backend supports (GLM-5's kpool tail too);
    - a model with Mamba states and an MLA cache whose page divides none of
      the largest: block-outer only, since layer-outer placement unifies a
      hybrid's page sizes, pads only Mamba and non-MLA attention pages, and
      refuses such an MLA page (GLM-5's kpool indexer beside KDA states);
    - a model with DeepSeek-V4's compressed MLA caches (an MLA spec of
      ``model_version`` ``deepseek_v4``): block-outer layouts only, the only
      ones DeepSeek-V4's attention and indexer backends allow.  Other
      compressed MLA caches (``tokens_per_state > 1`` without that backend,
      GLM-5's kpool indexer where no ring keeps its tail) take every layout
      the rules above allow: vLLM restricts the backend, not compression,
      and field builders place them layer-outer.
    """
    specs = list(as_specs(model).values())
    if not specs:
        return DEFAULT_LAYOUT_PREFERENCE
    # vLLM's resolution picks LBNHC/LBHNC first whatever the pages and
    # alignments: page-size unification then runs, and with different aligned
    # strides vLLM's own placement aliases block IDs (contract.md#memory-safety), which the kit
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
    if _unification_refuses(specs):
        allowed &= {KVCacheLayout.BLNHC, KVCacheLayout.BLHNC}
    if any(_deepseek_v4(s) for s in specs):
        # DeepSeek-V4's indexer backend packs its pages beside the latent's
        # inside each block: the layer dimension must sit inside the block's.
        allowed &= {KVCacheLayout.BLNHC, KVCacheLayout.BLHNC}
    return tuple(layout for layout in DEFAULT_LAYOUT_PREFERENCE if layout in allowed)


def _unification_refuses(specs: Sequence[KVCacheSpec]) -> bool:
    """Whether a hybrid's layer-outer page-size unification would refuse an MLA page."""
    if not any(isinstance(s, MambaSpec) for s in specs):
        return False
    largest = max(s.page_size_bytes for s in specs)
    return any(isinstance(s, MLAAttentionSpec) and largest % s.page_size_bytes for s in specs)


def _deepseek_v4(spec: KVCacheSpec) -> bool:
    """Whether ``spec`` is one of DeepSeek-V4's compressed-MLA-backend caches."""
    # SW-MLA caches carry the model version too.
    return getattr(spec, "model_version", None) == "deepseek_v4"


def layouts_for(model: Model | Mapping[str, KVCacheSpec]) -> st.SearchStrategy[KVCacheLayout]:
    """Generate a layout from :func:`allowed_layouts`, shrinking to vLLM's first preference.

    Never a layout vLLM's resolution would refuse for the model.
    """
    return st.sampled_from(allowed_layouts(model))
