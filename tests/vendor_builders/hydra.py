"""A platform builder for Acme's (made-up) "Hydra" models: a global and a local head per layer.

A Hydra decoder layer ``model.layers.{i}.hydra`` has two attention caches of
one block size: ``.kv``, full attention, and ``.local``, a sliding window
with fewer heads.  No built-in family of the kit produces these names, so
only the vendor's own models (``--models``) reach this builder's
specialisation.

Acme's fused Hydra kernel reads both caches of a decoder layer from one base
pointer, so the builder allocates the local cache as full attention (the
window recorded, as vLLM does when it promotes local layers) and keeps every
decoder layer's pair side by side in one block table: one shared tuple
``(kv, local)`` per decoder layer, draft layers last.  Other models and
layer-outer layouts are the reference's (``super()``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import attrs

from kvref import (
    FullAttentionSpec,
    KVCacheGroupSpec,
    KVCacheSpec,
    PlanningConfig,
    SlidingWindowSpec,
    UniformTypeKVCacheSpecs,
)
from vendor_builders.slots import (
    GRANULE,
    SlotPlan,
    SlotPlanBuilder,
    lay_out,
    pack,
    side_by_side,
    specialised,
    tuples_by_stem,
)

__all__ = ["HydraBuilder", "hydra_key"]

_LAYER = re.compile(r"^(?P<stem>.+?\.(?P<index>\d+)\.hydra)\.(?P<role>kv|local)$")
_RANK = {"kv": 0, "local": 1}


def hydra_key(name: str, spec: KVCacheSpec) -> tuple[str, int, bool, int] | None:
    """``(stem, index, draft, rank)`` of a Hydra cache, or ``None`` when ``name`` is not one."""
    match = _LAYER.match(name)
    if match is None or type(spec) not in (FullAttentionSpec, SlidingWindowSpec):
        return None
    return match["stem"], int(match["index"]), spec.is_draft, _RANK[match["role"]]


def _promoted(spec: KVCacheSpec) -> KVCacheSpec:
    """A local layer as full attention with its window recorded; a global one as it is."""
    if not isinstance(spec, SlidingWindowSpec):
        return spec
    fields = {
        f.name: getattr(spec, f.name)
        for f in attrs.fields(FullAttentionSpec)
        if f.init and hasattr(spec, f.name)
    }
    return FullAttentionSpec(**fields)


class HydraBuilder(SlotPlanBuilder):
    """One block table of ``(kv, local)`` tuples for Hydra models; the reference otherwise."""

    def get_kv_cache_groups(
        self, config: PlanningConfig, kv_cache_spec: Mapping[str, KVCacheSpec]
    ) -> list[KVCacheGroupSpec]:
        """Every Hydra cache in one table, local caches promoted; else the reference's groups."""
        keys = {n: k for n, s in kv_cache_spec.items() if (k := hydra_key(n, s)) is not None}
        sizes = {(s.block_size, s.dcp_sharded) for s in kv_cache_spec.values()}
        # One block table needs one block size; anything not Hydra is the reference's.
        if not specialised(config) or not keys or len(keys) < len(kv_cache_spec) or len(sizes) != 1:
            return super().get_kv_cache_groups(config, kv_cache_spec)
        names = sorted(keys, key=lambda n: (keys[n][2], keys[n][1], keys[n][3]))
        specs = {n: _promoted(kv_cache_spec[n]) for n in names}
        return [
            KVCacheGroupSpec(
                layer_names=names, kv_cache_spec=UniformTypeKVCacheSpecs(kv_cache_specs=specs)
            )
        ]

    # -- placement (the hook is SlotPlanBuilder's; Core probes the block stride) --
    def _slot_plan(
        self, config: PlanningConfig, groups: Sequence[KVCacheGroupSpec]
    ) -> SlotPlan | None:
        """The tuples of the one Hydra table, back to back in every block."""
        names = [n for g in groups for n in g.layer_names]
        if not specialised(config) or len(groups) != 1 or not names:
            return None
        (group,) = groups
        keys = {n: hydra_key(n, group.layer_spec(n)) for n in names}
        known = {n: k for n, k in keys.items() if k is not None}
        if len(known) < len(keys):
            return None
        tuples = tuples_by_stem(group, known)
        starts = lay_out(tuples, 0)
        placed = [
            cache
            for t, start in zip(tuples, starts, strict=True)
            for cache in side_by_side(t.members, start)
        ]
        return pack(placed, granule=GRANULE)
