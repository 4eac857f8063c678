"""Builders for the serving simulation's meta-tests: broken ones (one bug each) and legal variants.

The broken builders keep every static promise the kit checks (partition,
block size per group, bytes per token and ``(H, C)`` per layer, placement
footprints) and break what only a request stream shows: the group's spec
decides what vLLM's manager keeps and allocates, the layer's own spec what
its kernel reads and writes.  ``CAUGHT_BY`` names the serving invariant that
catches each.  The legal variants differ from the reference yet must pass.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from kvref import (
    CircularBufferSpec,
    FullAttentionSpec,
    KVCacheGroupSpec,
    MambaSpec,
    PlanningConfig,
    ReferenceKVCacheConfigBuilder,
    SlidingWindowSpec,
    UniformTypeKVCacheSpecs,
)
from kvref.specs import KVCacheSpec

Groups = list[KVCacheGroupSpec]


def _recast(spec: KVCacheSpec, target: type[KVCacheSpec], **extra: Any) -> KVCacheSpec:
    fields = {
        a.name: getattr(spec, a.name)
        for a in attrs.fields(target)
        if a.init and hasattr(spec, a.name)
    }
    fields.update(extra)
    return target(**fields)


def _rewrite(groups: Groups, change: Any) -> Groups:
    """Apply ``change(spec) -> spec | None`` to every group's spec (per layer in a wrapper)."""
    out = []
    for group in groups:
        spec = group.kv_cache_spec
        changed = group
        if isinstance(spec, UniformTypeKVCacheSpecs):
            layers = {n: change(s) or s for n, s in spec.kv_cache_specs.items()}
            if layers != dict(spec.kv_cache_specs):
                wrapper = UniformTypeKVCacheSpecs(kv_cache_specs=layers)
                changed = attrs.evolve(group, kv_cache_spec=wrapper)
        else:
            new = change(spec)
            if new is not None:
                changed = attrs.evolve(group, kv_cache_spec=new)
        out.append(changed)
    return out


class _Regrouping(ReferenceKVCacheConfigBuilder):
    CAUGHT_BY = ""

    def change(self, spec: KVCacheSpec) -> KVCacheSpec | None:
        raise NotImplementedError

    def get_kv_cache_groups(
        self, config: PlanningConfig, kv_cache_spec: Mapping[str, KVCacheSpec]
    ) -> Groups:
        return _rewrite(super().get_kv_cache_groups(config, kv_cache_spec), self.change)


class FullAsSlidingWindow(_Regrouping):
    """Groups full-attention layers under a sliding window of one block: same pages, fewer blocks.

    The manager frees every block before the window while the layers still
    read all their tokens, so a request reads blocks other requests now hold.
    """

    CAUGHT_BY = "KV-SERVE-ISOLATION"

    def change(self, spec: KVCacheSpec) -> KVCacheSpec | None:
        if type(spec) is not FullAttentionSpec:
            return None
        return _recast(spec, SlidingWindowSpec, sliding_window=spec.block_size)


class FullAsRingBuffer(_Regrouping):
    """Groups full-attention layers under a ring-buffer spec: one block per request.

    The kernel writes token ``t`` through block-table entry ``t // block_size``,
    which the manager never allocates once a request outgrows one block.
    """

    CAUGHT_BY = "KV-SERVE-POOL"

    def change(self, spec: KVCacheSpec) -> KVCacheSpec | None:
        if type(spec) is not FullAttentionSpec:
            return None
        return _recast(spec, CircularBufferSpec)


class DropsSpeculativeStates(_Regrouping):
    """Groups Mamba layers under a spec without their speculative state blocks.

    The kernel writes the draft states after the running state; the manager
    holds no block there.
    """

    CAUGHT_BY = "KV-SERVE-POOL"

    def change(self, spec: KVCacheSpec) -> KVCacheSpec | None:
        if not isinstance(spec, MambaSpec) or not spec.num_speculative_blocks:
            return None
        return attrs.evolve(spec, num_speculative_blocks=0)


# -- legal variants ---------------------------------------------------------------------


class OneGroupPerLayer(ReferenceKVCacheConfigBuilder):
    """Every layer in a group of its own: all groups alias one page per block, legally."""

    def get_kv_cache_groups(
        self, config: PlanningConfig, kv_cache_spec: Mapping[str, KVCacheSpec]
    ) -> Groups:
        groups = super().get_kv_cache_groups(config, kv_cache_spec)
        out = []
        for g in groups:
            for name in g.layer_names:
                out.append(attrs.evolve(g, layer_names=[name], kv_cache_spec=g.layer_spec(name)))
        return out


class WindowsAsFull(_Regrouping):
    """Keeps sliding-window layers' every block (as vLLM's promotion does): more than they read."""

    def change(self, spec: KVCacheSpec) -> KVCacheSpec | None:
        if type(spec) is not SlidingWindowSpec:
            return None
        return _recast(spec, FullAttentionSpec)


BROKEN = (FullAsSlidingWindow, FullAsRingBuffer, DropsSpeculativeStates)
LEGAL = (OneGroupPerLayer, WindowsAsFull)
