"""A platform builder for DeepSeek-V4-style models: one shared tuple per decoder layer.

DeepSeek-V4 keeps up to five caches per decoder layer ``<stem>`` (e.g.
``model.layers.7.attn``; MTP draft layers ``model.layers.N.mtp_block.attn``):

========================================  ======================================  =========
layer                                     spec                                    table
========================================  ======================================  =========
``<stem>``                                compressed MLA latent, ``tokens_per_``  compressed
                                          ``state`` 4 (CSA) or 128 (HCA)
``<stem>.indexer.k_cache``                the indexer's compressed fp8 key        compressed
``<stem>.swa_cache``                      sliding-window MLA (window 128)         window
``<stem>.compressor.state_cache``         the compressor's fp32 state (SW-MLA)    state
``<stem>.indexer.compressor.state_cache`` the indexer compressor's state          state
========================================  ======================================  =========

The sparse-attention kernels of this (fictional) platform read one decoder
layer's caches of one block table from a single base pointer: the caches of
a decoder layer sit side by side (a *shared tuple*: latent then indexer key;
compressor state then indexer-compressor state) and a group's slot is its
tuples back to back, target layers first, then the MTP draft tuples (so the
target's offsets do not move when speculative decoding is switched on).
One block table per kind and block size: the compressed caches, the window
caches, and the compressor states of each block size.

Everything else (layer-outer layouts, host-resident layers, HiSparse, a
model-declared grouping, the hybrid manager disabled, other models) is the
reference's: the builder calls ``super()``.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvref import (
    KVCacheGroupSpec,
    KVCacheSpec,
    MLAAttentionSpec,
    PlanningConfig,
    SlidingWindowMLASpec,
    UniformTypeKVCacheSpecs,
)
from vendor_builders.deepseek_v4_names import TABLES, CacheLayer, parse_cache
from vendor_builders.slots import (
    GRANULE,
    DraftsAfterTargets,
    FamilyGroups,
    SlotPlan,
    SlotPoolBuilder,
    pack,
    side_by_side,
    specialised,
    tuples_by_stem,
)

__all__ = ["DeepSeekV4Builder", "parse_layer"]


def _fits(table: str, spec: KVCacheSpec) -> bool:
    if table == "compressed":
        # V4 compresses both the latent and the indexer key; an uncompressed
        # MLA cache is a V3-style layer this builder leaves to the default.
        return isinstance(spec, MLAAttentionSpec) and spec.tokens_per_state_value > 1
    return isinstance(spec, SlidingWindowMLASpec)


def parse_layer(name: str, spec: KVCacheSpec) -> CacheLayer | None:
    """The DeepSeek-V4 cache ``name`` holds, or ``None`` when it is not one."""
    return parse_cache(name, spec, _fits)


class DeepSeekV4Builder(DraftsAfterTargets, FamilyGroups, SlotPoolBuilder):
    """Shared-tuple grouping and placement for DeepSeek-V4-style models; the reference otherwise."""

    # -- grouping (the hook is FamilyGroups') ---------------------------------
    def _parse(self, name: str, spec: KVCacheSpec) -> CacheLayer | None:
        return parse_layer(name, spec)

    def _is_model(self, layers: list[CacheLayer]) -> bool:
        # A window-only model has nothing compressed to pack.
        return any(layer.role == "latent" for layer in layers)

    def _family_groups(self, layers: list[CacheLayer]) -> list[KVCacheGroupSpec]:
        """One group per (table, block size): compressed, window, compressor states."""
        tables: dict[tuple[int, int, bool], list[CacheLayer]] = {}
        for layer in layers:
            kind = TABLES.index(layer.table)
            tables.setdefault((kind, layer.spec.block_size, layer.spec.dcp_sharded), []).append(
                layer
            )
        groups = []
        for key in sorted(tables):
            members = sorted(tables[key], key=lambda c: (c.draft, c.index, c.key[3]))
            groups.append(
                KVCacheGroupSpec(
                    layer_names=[c.name for c in members],
                    # Per-layer specs: a draft layer keeps its draft flag, and
                    # CSA and HCA latents their own pages.
                    kv_cache_spec=UniformTypeKVCacheSpecs(
                        kv_cache_specs={c.name: c.spec for c in members}
                    ),
                )
            )
        return groups

    # -- placement (the hooks are SlotPoolBuilder's, the tuple starts DraftsAfterTargets') --
    def _slot_plan(
        self, config: PlanningConfig, groups: Sequence[KVCacheGroupSpec]
    ) -> SlotPlan | None:
        """Offsets of every cache, or ``None`` when the groups are not this platform's."""
        # Host-resident groups only come with host_resident_layers (not specialised).
        if not specialised(config) or not any(g.layer_names for g in groups):
            return None
        keys: dict[str, tuple[str, int, bool, int]] = {}
        for group in groups:
            for name in group.layer_names:
                layer = parse_layer(name, group.layer_spec(name))
                if layer is None:
                    return None
                keys[name] = layer.key
        placed: list[tuple[str, int, KVCacheSpec]] = []
        for group in groups:
            tuples = tuples_by_stem(group, keys)
            for t, start in zip(tuples, self._tuple_starts(tuples), strict=True):
                placed += side_by_side(t.members, start)
        return pack(placed, granule=GRANULE)
