"""Builders for the serving simulation's meta-tests: broken ones (one bug each) and legal variants.

vLLM's scheduler runs one manager per group, chosen by the group's *first*
per-layer spec (``generate_scheduler_kv_cache_config``), while each layer's
kernel reads and writes what the layer's own spec says.  The wrapper
builders below keep every per-layer spec as the model gave it, so every
static check passes (partition, one block size per group, bytes and meaning
of each layer's spec, placement footprints), and break only that: a group
whose layers need different retention.  ``CAUGHT_BY`` names the serving
invariant that catches each.

The regrouping builders change a group's spec itself; the static
``KV-GROUP-SPEC-MEANING`` catches those, and the simulation agrees.  The
legal variants differ from the reference yet must pass.
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


# -- dynamic only: one wrapper, two retentions ------------------------------------------


def _page(group: KVCacheGroupSpec) -> tuple[int, int]:
    spec = group.layer_spec(group.layer_names[0])
    return spec.block_size, spec.page_size_bytes


class _Wrapping(ReferenceKVCacheConfigBuilder):
    """Wraps the layers of ``first`` groups, then those of ``rest`` groups, into one group."""

    CAUGHT_BY = ""

    def first(self, spec: KVCacheSpec) -> bool:
        raise NotImplementedError

    def rest(self, spec: KVCacheSpec) -> bool:
        return type(spec) is FullAttentionSpec

    def get_kv_cache_groups(
        self, config: PlanningConfig, kv_cache_spec: Mapping[str, KVCacheSpec]
    ) -> Groups:
        groups = super().get_kv_cache_groups(config, kv_cache_spec)

        def picked(test: Any) -> list[int]:
            return [
                i
                for i, g in enumerate(groups)
                if g.layer_names and all(test(s) for _, s in g.layer_specs())
            ]

        heads, tails = picked(self.first), picked(self.rest)
        chosen = heads + tails
        # Only where the pages match, so the merged group is placeable in every layout.
        if not heads or not tails or len({_page(groups[i]) for i in chosen}) != 1:
            return groups
        layers = {n: s for i in chosen for n, s in groups[i].layer_specs()}
        merged = KVCacheGroupSpec(
            layer_names=list(layers), kv_cache_spec=UniformTypeKVCacheSpecs(kv_cache_specs=layers)
        )
        out = [g for i, g in enumerate(groups) if i not in chosen]
        out.insert(min(chosen), merged)
        return out


class SlidingFirstWrapper(_Wrapping):
    """Wraps sliding-window layers and full-attention layers into one group, windows first.

    Every layer keeps its own spec, but the scheduler's manager follows the
    first: it frees the full layers' blocks once they leave the window.
    """

    CAUGHT_BY = "KV-SERVE-ISOLATION"

    def first(self, spec: KVCacheSpec) -> bool:
        return type(spec) is SlidingWindowSpec


class RingFirstWrapper(_Wrapping):
    """Wraps ring-buffer layers and full-attention layers into one group, rings first.

    The manager holds one block per request; the full layers' kernels write
    token ``t`` through entry ``t // block_size``, which it never allocates.
    """

    CAUGHT_BY = "KV-SERVE-POOL"

    def first(self, spec: KVCacheSpec) -> bool:
        return type(spec) is CircularBufferSpec


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


#: Pass every static check and break serving.
DYNAMIC = (SlidingFirstWrapper, RingFirstWrapper)
#: Change a group spec's meaning: caught statically, and by serving.
REGROUPING = (FullAsSlidingWindow, FullAsRingBuffer, DropsSpeculativeStates)
LEGAL = (OneGroupPerLayer, WindowsAsFull)
