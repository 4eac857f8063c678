"""A vLLM builder for DeepSeek-V4-style models: its own grouping and shared-tuple placement.

DeepSeek-V4 keeps up to five caches per decoder layer ``<stem>``
(``model.layers.7.attn``; MTP draft layers ``model.layers.N.mtp_block.attn``):

========================================  ==========================================  ==========
layer                                     vLLM spec                                   table
========================================  ==========================================  ==========
``<stem>``                                ``MLAAttentionSpec``, tokens_per_state > 1  compressed
``<stem>.indexer.k_cache``                ``MLAAttentionSpec``, tokens_per_state > 1  compressed
``<stem>.swa_cache``                      ``SlidingWindowMLASpec``                    window
``<stem>.compressor.state_cache``         ``SlidingWindowMLASpec``                    state
``<stem>.indexer.compressor.state_cache`` ``SlidingWindowMLASpec``                    state
========================================  ==========================================  ==========

The (fictional) platform's sparse kernels read one decoder layer's caches
of one table from a single base pointer, so a decoder layer's caches of a
table sit side by side (a *shared tuple*) and a group's block is its tuples
back to back, target layers first, then the MTP draft tuples (the target's
offsets do not move when speculative decoding is switched on).  Grouping is
therefore the platform's too: one block table per (table, block size,
window), where vLLM's default gives every sliding-window cache a table of
its own.  Every group starts at byte 0 of a block (groups overlay: a block ID
belongs to one group at a time), blocks are rounded up to a 512-byte granule
and every alignment, and the builder answers ``_get_pool_bytes_per_block``
with that block for the groups it places.

The gate: every cache must be exactly one of the two vLLM classes above
under a V4 name, the latent present (a window-only model has nothing to
pack), the INDEXER cache role absent (V3.2 and GLM-5 indexers carry it; V4's
compressed key does not), and :func:`~._common.plain_engine`.  Everything else
is vLLM's default builder.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from vllm.config import VllmConfig
from vllm.v1.kv_cache_interface import (
    KVCacheGroupSpec,
    KVCacheSpec,
    MLAAttentionSpec,
    SlidingWindowMLASpec,
    SparseCacheRole,
    UniformTypeKVCacheSpecs,
)

from tests.vendor_builders.deepseek_v4_names import TABLES, CacheLayer, parse_cache
from tests.vendor_builders.slots import DraftsAfterTargets, family_layers, side_by_side
from tests.vllm.native_builders._common import (
    SlotPlan,
    SlotPoolBuilder,
    layer_specs,
    pack,
    plain_engine,
)

__all__ = ["GRANULE", "CacheTuple", "DeepSeekV4TupleBuilder", "parse_v4"]

#: Every block is rounded up to this.
GRANULE = 512


def _fits(table: str, spec: KVCacheSpec) -> bool:
    if table == "compressed":
        # An uncompressed latent is a V3-style layer, an INDEXER key a V3.2
        # or GLM-5 one: neither is read by V4's kernels.
        return (
            type(spec) is MLAAttentionSpec
            and isinstance(spec.tokens_per_state, int)
            and spec.tokens_per_state > 1
            and spec.cache_role is not SparseCacheRole.INDEXER
        )
    return type(spec) is SlidingWindowMLASpec


def parse_v4(name: str, spec: KVCacheSpec) -> CacheLayer | None:
    """The DeepSeek-V4 cache ``name`` holds, or ``None`` when it is not one."""
    return parse_cache(name, spec, _fits)


@dataclass(frozen=True)
class CacheTuple:
    """The caches of one decoder layer in one group, in slot order."""

    draft: bool
    members: tuple[CacheLayer, ...]

    @property
    def nbytes(self) -> int:
        """Bytes of the tuple: its members' pages back to back."""
        return sum(c.spec.page_size_bytes for c in self.members)


def _tuples(caches: Sequence[CacheLayer]) -> list[CacheTuple]:
    by_stem: dict[str, list[CacheLayer]] = {}
    for cache in sorted(caches, key=lambda c: c.order):
        by_stem.setdefault(cache.stem, []).append(cache)
    return [CacheTuple(draft=c[0].draft, members=tuple(c)) for c in by_stem.values()]


class DeepSeekV4TupleBuilder(DraftsAfterTargets, SlotPoolBuilder):
    """Per-table groups and shared-tuple blocks for DeepSeek-V4 models; vLLM's default otherwise."""

    # -- grouping ------------------------------------------------------------
    def get_kv_cache_groups(
        self, vllm_config: VllmConfig, kv_cache_spec: dict[str, KVCacheSpec]
    ) -> list[KVCacheGroupSpec]:
        """One group per (table, block size, DCP sharding, window) for V4 models."""
        caches = self._model_caches(vllm_config, kv_cache_spec)
        if caches is None:
            return super().get_kv_cache_groups(vllm_config, kv_cache_spec)
        tables: dict[tuple[int, int, bool, int], list[CacheLayer]] = {}
        for cache in caches:
            window = getattr(cache.spec, "sliding_window", 0) or 0
            key = (
                TABLES.index(cache.table),
                cache.spec.block_size,
                cache.spec.dcp_sharded,
                window,
            )
            tables.setdefault(key, []).append(cache)
        groups = []
        for key in sorted(tables):
            members = sorted(tables[key], key=lambda c: c.order)
            # Per-layer specs: drafts keep their flag, CSA and HCA latents their pages.
            spec = UniformTypeKVCacheSpecs.from_specs({c.name: c.spec for c in members})
            if spec is None:
                return super().get_kv_cache_groups(vllm_config, kv_cache_spec)
            groups.append(KVCacheGroupSpec([c.name for c in members], spec))
        return groups

    def _model_caches(
        self, vllm_config: VllmConfig, specs: dict[str, KVCacheSpec]
    ) -> list[CacheLayer] | None:
        if not specs or not plain_engine(vllm_config):
            return None
        return family_layers(
            specs, parse_v4, lambda caches: any(c.role == "latent" for c in caches)
        )

    # -- placement (the hooks are SlotPoolBuilder's, the tuple starts DraftsAfterTargets') --
    def _slot_plan(
        self, vllm_config: VllmConfig, groups: Sequence[KVCacheGroupSpec]
    ) -> SlotPlan | None:
        """Offsets of every cache, or ``None`` when the groups are not this platform's."""
        if not plain_engine(vllm_config) or not any(g.layer_names for g in groups):
            return None
        placed: list[tuple[str, int, KVCacheSpec]] = []
        for group in groups:
            parsed = [parse_v4(name, spec) for name, spec in layer_specs(group)]
            caches = [c for c in parsed if c is not None]
            if len(caches) < len(parsed):
                return None
            tuples = _tuples(caches)
            for t, start in zip(tuples, self._tuple_starts(tuples), strict=True):
                placed += side_by_side([(c.name, c.spec) for c in t.members], start)
        return pack(placed, granule=GRANULE)
