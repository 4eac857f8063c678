"""A platform builder for GLM-5-style hybrids: linear-attention states on the sparse-MLA slots.

A GLM-5-style model has three KDA linear-attention layers (``MambaSpec``,
``mamba_type`` ``LINEAR``: ``model.layers.{i}.self_attn``) per indexed
sparse-MLA layer, which keeps three caches (``model.layers.{i}.self_attn``
plus ``.attn``, the MLA latent; ``.indexer.k_cache``, the indexer's key with
``tokens_per_state`` > 1; ``.indexer.tail_cache``, the indexer's ring).
An MTP draft layer, when speculating, carries the three sparse caches.

This (fictional) platform recycles a block ID freed by one table for
another without re-formatting it, so every table uses one grid: slot ``k``
of a block starts at the same byte in every group, and is as wide as the
widest ``k``-th entry of any table.  The sparse tuple of the ``k``-th indexed
layer (latent, then indexer key) sits at slot ``k`` of the sparse table, its
tail ring at slot ``k`` of the ring table, and the KDA layers are dealt into
groups as wide as the sparse table, KDA layer ``j`` of each group on slot
``j``: the state of one group lies on the MLA slots of another.  That is
legal: a block ID belongs to one group at a time
(contract.md#memory-safety, cross-group aliasing); inside one group no two
slots overlap, because each slot is as wide as anything placed on it.  A
block is never wider than all the caches' pages together (the grid shares,
it does not pad to the widest page; contract.md#placement-backing).

Everything else is the reference's (``super()``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from kvref import (
    CircularBufferSpec,
    KVCacheGroupSpec,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    PlanningConfig,
    UniformTypeKVCacheSpecs,
)
from vendor_builders.slots import (
    GRANULE,
    FamilyGroups,
    SlotPlan,
    SlotPoolBuilder,
    pack,
    round_up,
    side_by_side,
    specialised,
)

__all__ = ["GLM5Builder", "parse_layer"]

_LAYER = re.compile(
    r"^(?P<stem>.+?\.(?P<index>\d+)\.self_attn)"
    r"(?:\.(?P<role>attn|indexer\.k_cache|indexer\.tail_cache))?$"
)
#: The group kind of each role and the cache's rank inside its slot.
_ROLES: dict[str, tuple[str, int]] = {
    "state": ("kda", 0),
    "attn": ("sparse", 0),
    "indexer.k_cache": ("sparse", 1),
    "indexer.tail_cache": ("ring", 0),
}


@dataclass(frozen=True)
class GLMLayer:
    """One cache of a GLM-5 decoder layer, as this builder reads its name and spec."""

    name: str
    index: int
    draft: bool
    role: str
    spec: KVCacheSpec

    @property
    def kind(self) -> str:
        """``kda``, ``sparse`` or ``ring``: the table the cache belongs to."""
        return _ROLES[self.role][0]


def _role_fits(role: str, spec: KVCacheSpec) -> bool:
    if role == "state":
        return isinstance(spec, MambaSpec) and spec.mamba_type == "LINEAR"
    if role == "indexer.tail_cache":
        return isinstance(spec, CircularBufferSpec)
    # The latent stores every token; the indexer key compresses several into one state.
    compressed = isinstance(spec, MLAAttentionSpec) and spec.tokens_per_state_value > 1
    return isinstance(spec, MLAAttentionSpec) and compressed == (role == "indexer.k_cache")


def parse_layer(name: str, spec: KVCacheSpec) -> GLMLayer | None:
    """The GLM-5 cache ``name`` holds, or ``None`` when it is not one."""
    match = _LAYER.match(name)
    role = (match["role"] or "state") if match is not None else ""
    if match is None or not _role_fits(role, spec):
        return None
    return GLMLayer(name=name, index=int(match["index"]), draft=spec.is_draft, role=role, spec=spec)


def _order(layer: GLMLayer) -> tuple[bool, int, int]:
    return layer.draft, layer.index, _ROLES[layer.role][1]


class GLM5Builder(FamilyGroups, SlotPoolBuilder):
    """One slot grid for every table of a GLM-5-style model; the reference otherwise."""

    # -- grouping (the hook is FamilyGroups') ---------------------------------
    def _parse(self, name: str, spec: KVCacheSpec) -> GLMLayer | None:
        return parse_layer(name, spec)

    def _is_model(self, layers: list[GLMLayer]) -> bool:
        kinds = {layer.kind for layer in layers}
        blocks = {c.spec.block_size for c in layers if c.kind == "sparse"}
        # Not a stage without both halves, nor a sparse table of two block sizes.
        return {"kda", "sparse"} <= kinds and len(blocks) == 1

    def _family_groups(self, layers: list[GLMLayer]) -> list[KVCacheGroupSpec]:
        """The sparse table, the ring table, then KDA groups as wide as the sparse table."""
        by_kind: dict[str, list[GLMLayer]] = {"sparse": [], "ring": [], "kda": []}
        for layer in sorted(layers, key=_order):
            by_kind[layer.kind].append(layer)
        groups = [self._group(by_kind[kind]) for kind in ("sparse", "ring") if by_kind[kind]]
        width = max(1, sum(1 for c in by_kind["sparse"] if c.role == "attn"))
        # KDA layers of one spec share a table; a table never mixes state formats.
        states: dict[KVCacheSpec, list[GLMLayer]] = {}
        for layer in by_kind["kda"]:
            states.setdefault(layer.spec, []).append(layer)
        for same in states.values():
            for first in range(0, len(same), width):
                chunk = same[first : first + width]
                names = [c.name for c in chunk]
                groups.append(KVCacheGroupSpec(layer_names=names, kv_cache_spec=chunk[0].spec))
        return groups

    @staticmethod
    def _group(layers: Sequence[GLMLayer]) -> KVCacheGroupSpec:
        return KVCacheGroupSpec(
            layer_names=[c.name for c in layers],
            kv_cache_spec=UniformTypeKVCacheSpecs(kv_cache_specs={c.name: c.spec for c in layers}),
        )

    # -- placement (the hooks are SlotPlanBuilder's) ---------------------------
    def _slot_plan(
        self, config: PlanningConfig, groups: Sequence[KVCacheGroupSpec]
    ) -> SlotPlan | None:
        """Slots of every group on one grid, or ``None`` when the groups are not this platform's."""
        # Host-resident groups only come with host_resident_layers (not specialised).
        if not specialised(config):
            return None
        tables: list[list[list[tuple[str, KVCacheSpec]]]] = []
        for group in groups:
            parsed = [parse_layer(n, group.layer_spec(n)) for n in group.layer_names]
            layers = [p for p in parsed if p is not None]
            if len(layers) < len(parsed) or len({p.kind for p in layers}) > 1:
                return None
            tables.append(self._slots(layers))
        slots = max((len(table) for table in tables), default=0)
        if not slots:
            return None
        # Slot k is as wide as the widest k-th entry of any table.
        starts = [0]
        for k in range(slots):
            width = max(sum(s.page_size_bytes for _, s in t[k]) for t in tables if k < len(t))
            starts.append(starts[-1] + round_up(width, GRANULE))
        placed = [
            cache
            for table in tables
            for k, slot in enumerate(table)
            for cache in side_by_side(slot, starts[k])
        ]
        return pack(placed, granule=GRANULE)

    @staticmethod
    def _slots(layers: Sequence[GLMLayer]) -> list[list[tuple[str, KVCacheSpec]]]:
        """A group's slots in grid order: one per decoder layer (latent and key share one)."""
        slots: dict[tuple[bool, int], list[tuple[str, KVCacheSpec]]] = {}
        for layer in sorted(layers, key=_order):
            slots.setdefault((layer.draft, layer.index), []).append((layer.name, layer.spec))
        return list(slots.values())
