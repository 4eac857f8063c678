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

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kvref import (
    KVCacheGroupSpec,
    KVCacheSpec,
    MLAAttentionSpec,
    PlanningConfig,
    SlidingWindowMLASpec,
    UniformTypeKVCacheSpecs,
)
from vendor_builders.slots import (
    GRANULE,
    CacheTuple,
    SlotPlan,
    SlotPlanBuilder,
    lay_out,
    pack,
    side_by_side,
    specialised,
    tuples_by_stem,
)

__all__ = ["DeepSeekV4Builder", "parse_layer"]

_LAYER = re.compile(
    r"^(?P<stem>.+?\.(?P<index>\d+)\.(?:mtp_block\.)?attn)"
    r"(?:\.(?P<role>indexer\.k_cache|swa_cache|compressor\.state_cache"
    r"|indexer\.compressor\.state_cache))?$"
)
#: Rank of each cache inside its decoder layer's tuple, and the table it lives in.
_ROLES: dict[str, tuple[int, str]] = {
    "latent": (0, "compressed"),
    "indexer.k_cache": (1, "compressed"),
    "swa_cache": (0, "window"),
    "compressor.state_cache": (0, "state"),
    "indexer.compressor.state_cache": (1, "state"),
}
_TABLES = ("compressed", "window", "state")


@dataclass(frozen=True)
class CacheLayer:
    """One cache of a DeepSeek-V4 decoder layer, as this builder reads its name and spec."""

    name: str
    stem: str
    index: int
    draft: bool
    role: str
    spec: KVCacheSpec

    @property
    def table(self) -> str:
        """The block table (group kind) the cache belongs to."""
        return _ROLES[self.role][1]

    @property
    def key(self) -> tuple[str, int, bool, int]:
        """``(stem, index, draft, rank)`` for :func:`~vendor_builders.slots.tuples_by_stem`."""
        return self.stem, self.index, self.draft, _ROLES[self.role][0]


def _fits(role: str, spec: KVCacheSpec) -> bool:
    if _ROLES[role][1] == "compressed":
        # V4 compresses both the latent and the indexer key; an uncompressed
        # MLA cache is a V3-style layer this builder leaves to the default.
        return isinstance(spec, MLAAttentionSpec) and spec.tokens_per_state_value > 1
    return isinstance(spec, SlidingWindowMLASpec)


def parse_layer(name: str, spec: KVCacheSpec) -> CacheLayer | None:
    """The DeepSeek-V4 cache ``name`` holds, or ``None`` when it is not one."""
    match = _LAYER.match(name)
    role = (match["role"] or "latent") if match is not None else ""
    if match is None or not _fits(role, spec):
        return None
    return CacheLayer(
        name=name,
        stem=match["stem"],
        index=int(match["index"]),
        draft=spec.is_draft,
        role=role,
        spec=spec,
    )


class DeepSeekV4Builder(SlotPlanBuilder):
    """Shared-tuple grouping and placement for DeepSeek-V4-style models; the reference otherwise."""

    # -- grouping ------------------------------------------------------------
    def get_kv_cache_groups(
        self, config: PlanningConfig, kv_cache_spec: Mapping[str, KVCacheSpec]
    ) -> list[KVCacheGroupSpec]:
        """One group per (table, block size): compressed, window, compressor states."""
        layers = self._model_layers(config, kv_cache_spec)
        if layers is None:
            return super().get_kv_cache_groups(config, kv_cache_spec)
        tables: dict[tuple[int, int, bool], list[CacheLayer]] = {}
        for layer in layers:
            kind = _TABLES.index(layer.table)
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

    def _model_layers(
        self, config: PlanningConfig, specs: Mapping[str, KVCacheSpec]
    ) -> list[CacheLayer] | None:
        if not specialised(config) or not specs:
            return None
        layers = [parse_layer(name, spec) for name, spec in specs.items()]
        if any(layer is None for layer in layers):
            return None
        found = [layer for layer in layers if layer is not None]
        # A window-only model has nothing compressed to pack.
        return found if any(layer.role == "latent" for layer in found) else None

    # -- placement (the hooks are SlotPlanBuilder's) ---------------------------
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

    def _tuple_starts(self, tuples: Sequence[CacheTuple]) -> list[int]:
        """Target tuples back to back from byte 0, then the draft tuples after them."""
        targets = [t for t in tuples if not t.draft]
        drafts = [t for t in tuples if t.draft]
        starts = lay_out(targets, 0)
        return starts + lay_out(drafts, self._draft_start(targets, starts))

    def _draft_start(self, targets: Sequence[CacheTuple], starts: Sequence[int]) -> int:
        """Where the MTP tuples start: right after the last target tuple."""
        return starts[-1] + targets[-1].nbytes if targets else 0
