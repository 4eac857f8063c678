"""Layout resolution: the one KV cache layout Core picks before planning (vLLM 0.33.0).

vLLM's engine core resolves the layout once, before it groups layers
(``resolve_kv_cache_layout`` in ``vllm/v1/attention/backends/utils.py``), in
this order:

1. a layout already set on the cache config wins outright (here: an explicit
   :attr:`PlanningConfig.kv_cache_layout <kvref.config.PlanningConfig.kv_cache_layout>`);
2. every worker reports the layouts all its attention backends support, most
   preferred first (:func:`kvref.backends.get_supported_kv_cache_layouts`);
   the reports must agree;
3. specs of more than one ``(H, S, page)`` shape keep only block-compact
   layouts (pages of different shapes alias one block only when it is dense);
4. specs that mix DCP-sharded and replicated slot-mapped attention and have
   more than one page size keep only block-outermost layouts (their groups are
   packed side by side);
5. the environment override ``VLLM_KV_CACHE_LAYOUT`` must be a candidate;
   else the KV connector's required layout is taken if it is a candidate,
   and dropped with a warning if not; else the first candidate.

Specs without per-layer views (HiSparse's resident and hot specs) take no part.
:meth:`PlanningConfig.with_resolved_layout
<kvref.config.PlanningConfig.with_resolved_layout>` feeds this from a config's
description of the backends, the connector and the override; planning calls it.

Deliberate differences: every failure is a
:class:`~kvref.errors.LayoutResolutionError` naming both sides (vLLM raises
``AssertionError`` for workers that disagree); the connector fallback warns
through :mod:`warnings` (vLLM logs it once).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Sequence

from kvref.axes import KVCacheLayout
from kvref.errors import LayoutResolutionError
from kvref.extra_specs import HiSparseHotSpec
from kvref.specs import AttentionSpec, CircularBufferSpec, KVCacheSpec

__all__ = ["resolve_kv_cache_layout"]


def _names(layouts: Iterable[KVCacheLayout]) -> list[str]:
    return [layout.name for layout in layouts]


def _uses_slot_mapping(spec: KVCacheSpec) -> bool:
    # vLLM: ring buffers and HiSparse hot buffers address their pages themselves.
    return not isinstance(spec, (CircularBufferSpec, HiSparseHotSpec))


def _narrow_by_specs(
    candidates: list[KVCacheLayout],
    specs: Sequence[KVCacheSpec],
    reported: Sequence[Sequence[KVCacheLayout]],
) -> list[KVCacheLayout]:
    shapes = {(s.num_page_heads, s.num_states, s.page_size_bytes) for s in specs}
    if len(shapes) > 1:
        candidates = [m for m in candidates if m.is_block_compact]
        if not candidates:
            raise LayoutResolutionError(
                f"specs of {len(shapes)} (heads, states, page bytes) shapes "
                f"{sorted(shapes)[:4]} need a block-compact layout, but the attention "
                f"backends support only {[_names(r) for r in reported]}"
            )
    sharding = {
        s.dcp_sharded for s in specs if isinstance(s, AttentionSpec) and _uses_slot_mapping(s)
    }
    pages = {s.page_size_bytes for s in specs}
    if len(sharding) > 1 and len(pages) > 1:
        candidates = [m for m in candidates if m.is_block_outermost]
        if not candidates:
            raise LayoutResolutionError(
                f"DCP-sharded and replicated (draft) attention with page sizes {sorted(pages)[:4]} "
                "needs a block-outermost layout, but the attention backends support only "
                f"{[_names(r) for r in reported]}"
            )
    return candidates


def resolve_kv_cache_layout(
    supported_layouts: Sequence[Sequence[KVCacheLayout]],
    kv_cache_specs: Iterable[KVCacheSpec] = (),
    *,
    env_layout: KVCacheLayout | None = None,
    connector_layout: KVCacheLayout | None = None,
) -> KVCacheLayout:
    """The layout vLLM 0.33.0's Core resolves when the config sets none.

    Args:
        supported_layouts: per worker, the layouts its backends support, most
            preferred first (:func:`kvref.backends.get_supported_kv_cache_layouts`).
        kv_cache_specs: every worker's per-layer specs, flattened.
        env_layout: ``VLLM_KV_CACHE_LAYOUT`` (:attr:`PlanningConfig.env_kv_cache_layout`).
        connector_layout: the KV connector's required layout
            (:attr:`PlanningConfig.kv_connector_layout`).

    Raises:
        LayoutResolutionError: no worker reports a layout, workers disagree, the
            specs need a layout no candidate is, or ``env_layout`` is not a candidate.
    """
    reported = [tuple(r) for r in supported_layouts]
    if not reported or not all(reported):
        raise LayoutResolutionError(
            f"every worker must report at least one supported KV cache layout, got "
            f"{[_names(r) for r in reported]}"
        )
    if any(r != reported[0] for r in reported[1:]):
        other = next(r for r in reported if r != reported[0])
        raise LayoutResolutionError(
            f"workers report different supported KV cache layouts: worker 0 "
            f"{_names(reported[0])} and worker {reported.index(other)} {_names(other)}; "
            "every rank must run the same attention backends"
        )
    specs = [s for s in kv_cache_specs if getattr(s, "has_layer_views", True)]
    candidates = _narrow_by_specs(list(reported[0]), specs, reported)
    if env_layout is not None:
        if env_layout not in candidates:
            raise LayoutResolutionError(
                f"VLLM_KV_CACHE_LAYOUT={env_layout.name} (PlanningConfig.env_kv_cache_layout) is "
                f"not one of the layouts the backends and specs allow: {_names(candidates)}"
            )
        return env_layout
    if connector_layout is not None:
        if connector_layout in candidates:
            return connector_layout
        warnings.warn(
            f"the KV connector's layout {connector_layout.name} "
            "(PlanningConfig.kv_connector_layout) is not one of the layouts the backends and "
            f"specs allow, {_names(candidates)}: using {candidates[0].name} (as vLLM does)",
            stacklevel=2,
        )
    return candidates[0]
