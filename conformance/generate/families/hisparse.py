"""HiSparse-served sparse-MLA models: DeepSeek-V3.2(-Exp) and index-group variants, offloaded.

vLLM 0.33.0's HiSparse (``v1/hisparse/``) serves DeepSeek Sparse Attention
models (DeepSeek-V3.2-Exp and DeepSeek-V3.2, whose layers vLLM's
``deepseek_v2.py`` reports as a sparse MLA latent plus a lightning-indexer
key cache) with the sparse-MLA source KV in a pinned host pool: only the
indexer, a resident window and a per-request hot buffer stay on the device.
Models whose sparse layers share one indexer per *index group* (vLLM's
``mla/index_group.py``: the group's first layer is its leader) are drawn
too.  Only the layer count is small; the shapes are the published ones.
"""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import strategies as st

from conformance.check.geometry import round_up
from conformance.generate.families.extras import ExtendedModel, ModelExtras
from conformance.generate.families.sparse_mla import v32_attention, v32_indexer
from conformance.generate.records import Model
from conformance.generate.sampled_from_cache import pick
from conformance.generate.specs import rarely
from kvref.config import HiSparseConfig
from kvref.specs import KVCacheSpec

__all__ = ["hisparse_models"]

#: DeepSeek-V3.2's ``index_topk``.
_INDEX_TOPK = 2048


@st.composite
def _settings(draw: st.DrawFn) -> HiSparseConfig:
    query = 1 + pick(draw, [0, 1, 3]) if rarely(draw) else 1
    rows = None
    if rarely(draw):
        # An explicit hot buffer between the decode queries' top-k and the int16 limit.
        rows = draw(st.integers(query * _INDEX_TOPK, min(2**15, (query + 2) * _INDEX_TOPK)))
    return HiSparseConfig(
        index_topk=_INDEX_TOPK,
        max_decode_query_len=query,
        device_buffer_size=rows,
        shared_host_pool=rarely(draw),
    )


@st.composite
def _hisparse_models(draw: st.DrawFn, max_layers: int) -> Model:
    layers = draw(st.integers(1, max(1, min(6, max_layers // 2))))
    fp8 = draw(st.booleans())
    block = pick(draw, [64, 16, 128])
    # Index groups of 1 (DeepSeek-V3.2: every layer has its indexer) or 2 layers.
    group = 1 if not rarely(draw) else 2
    width = round_up(_INDEX_TOPK + 16 - 1, 128) if rarely(draw) else None
    specs: dict[str, KVCacheSpec] = {}
    # DeepSeek-V3.2's latent and indexer caches (sparse_mla), the latent with
    # the top-k buffer width HiSparse may give it.
    for i in range(layers):
        leader = group > 1 and i % group == 0
        specs[f"model.layers.{i}.self_attn.attn"] = v32_attention(
            fp8, block, False, leader, topk_buffer_width=width
        )
        if i % group == 0:
            specs[f"model.layers.{i}.self_attn.indexer.k_cache"] = v32_indexer(block, 1, False)
    settings = draw(_settings())
    return ExtendedModel(
        specs,
        f"DeepSeek-V3.2-like sparse MLA served with HiSparse "
        f"({'fp8_ds_mla' if fp8 else 'bf16'}, block {block}, index groups of {group}): "
        f"{layers} layers",
        num_hidden_layers=layers,
        extras=ModelExtras(hisparse=settings, host_pool_slack=draw(st.integers(0, 2))),
    )


def hisparse_models(*, max_layers: int = 64) -> st.SearchStrategy[Model]:
    """DeepSeek-V3.2-style sparse MLA (1-6 layers) served with HiSparse.

    Per layer a 576-wide MLA latent (bf16, or ``fp8_ds_mla`` with 656-byte
    states; ``cache_role`` SPARSE) and, per index group, the lightning
    indexer's fp8 key cache (``cache_role`` INDEXER, 132 bytes per token),
    one block size.  Rarely index groups of two layers (leader first), a
    ``topk_buffer_width``, speculative decode queries, an explicit hot buffer
    or a shared host pool.  The problem's config turns HiSparse on
    (:func:`~conformance.generate.families.extras.apply_model_extras`).
    """
    return _hisparse_models(max_layers)


FAMILIES: dict[str, Callable[..., st.SearchStrategy[Model]]] = {"hisparse": hisparse_models}
