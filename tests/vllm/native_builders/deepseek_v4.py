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

import re
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

from tests.vllm.native_builders._common import (
    SlotPlan,
    SlotPoolBuilder,
    layer_specs,
    pack,
    plain_engine,
)

__all__ = ["GRANULE", "CacheTuple", "DeepSeekV4TupleBuilder", "V4Cache", "parse_v4"]

#: Every block is rounded up to this.
GRANULE = 512

_LAYER = re.compile(
    r"^(?P<stem>.+?\.(?P<index>\d+)\.(?:mtp_block\.)?attn)"
    r"(?:\.(?P<role>indexer\.k_cache|swa_cache|compressor\.state_cache"
    r"|indexer\.compressor\.state_cache))?$"
)
#: Each role's table and its rank inside the decoder layer's tuple.
_ROLES: dict[str, tuple[str, int]] = {
    "latent": ("compressed", 0),
    "indexer.k_cache": ("compressed", 1),
    "swa_cache": ("window", 0),
    "compressor.state_cache": ("state", 0),
    "indexer.compressor.state_cache": ("state", 1),
}
_TABLES = ("compressed", "window", "state")


@dataclass(frozen=True)
class V4Cache:
    """One cache of a DeepSeek-V4 decoder layer, as the builder reads its name and spec."""

    name: str
    stem: str
    index: int
    draft: bool
    role: str
    spec: KVCacheSpec

    @property
    def table(self) -> str:
        """The block table (group kind) the cache belongs to."""
        return _ROLES[self.role][0]

    @property
    def order(self) -> tuple[bool, int, int]:
        """Target layers by index first, then drafts; the tuple rank last."""
        return self.draft, self.index, _ROLES[self.role][1]


def _fits(role: str, spec: KVCacheSpec) -> bool:
    if _ROLES[role][0] == "compressed":
        # An uncompressed latent is a V3-style layer, an INDEXER key a V3.2
        # or GLM-5 one: neither is read by V4's kernels.
        return (
            type(spec) is MLAAttentionSpec
            and isinstance(spec.tokens_per_state, int)
            and spec.tokens_per_state > 1
            and spec.cache_role is not SparseCacheRole.INDEXER
        )
    return type(spec) is SlidingWindowMLASpec


def parse_v4(name: str, spec: KVCacheSpec) -> V4Cache | None:
    """The DeepSeek-V4 cache ``name`` holds, or ``None`` when it is not one."""
    match = _LAYER.match(name)
    role = (match["role"] or "latent") if match is not None else ""
    if match is None or not _fits(role, spec):
        return None
    return V4Cache(
        name=name,
        stem=match["stem"],
        index=int(match["index"]),
        draft=spec.is_draft,
        role=role,
        spec=spec,
    )


@dataclass(frozen=True)
class CacheTuple:
    """The caches of one decoder layer in one group, in slot order."""

    draft: bool
    members: tuple[V4Cache, ...]

    @property
    def nbytes(self) -> int:
        """Bytes of the tuple: its members' pages back to back."""
        return sum(c.spec.page_size_bytes for c in self.members)


def _tuples(caches: Sequence[V4Cache]) -> list[CacheTuple]:
    by_stem: dict[str, list[V4Cache]] = {}
    for cache in sorted(caches, key=lambda c: c.order):
        by_stem.setdefault(cache.stem, []).append(cache)
    return [CacheTuple(draft=c[0].draft, members=tuple(c)) for c in by_stem.values()]


class DeepSeekV4TupleBuilder(SlotPoolBuilder):
    """Per-table groups and shared-tuple blocks for DeepSeek-V4 models; vLLM's default otherwise."""

    # -- grouping ------------------------------------------------------------
    def get_kv_cache_groups(
        self, vllm_config: VllmConfig, kv_cache_spec: dict[str, KVCacheSpec]
    ) -> list[KVCacheGroupSpec]:
        """One group per (table, block size, DCP sharding, window) for V4 models."""
        caches = self._model_caches(vllm_config, kv_cache_spec)
        if caches is None:
            return super().get_kv_cache_groups(vllm_config, kv_cache_spec)
        tables: dict[tuple[int, int, bool, int], list[V4Cache]] = {}
        for cache in caches:
            window = getattr(cache.spec, "sliding_window", 0) or 0
            key = (
                _TABLES.index(cache.table),
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
    ) -> list[V4Cache] | None:
        if not specs or not plain_engine(vllm_config):
            return None
        parsed = [parse_v4(name, spec) for name, spec in specs.items()]
        caches = [c for c in parsed if c is not None]
        if len(caches) < len(parsed) or not any(c.role == "latent" for c in caches):
            return None
        return caches

    # -- placement (the hooks are SlotPoolBuilder's) ----------------------------
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
                offset = start
                for cache in t.members:
                    placed.append((cache.name, offset, cache.spec))
                    offset += cache.spec.page_size_bytes
        return pack(placed, granule=GRANULE)

    def _tuple_starts(self, tuples: Sequence[CacheTuple]) -> list[int]:
        """Target tuples back to back from byte 0, then the draft tuples after them."""
        targets = [t for t in tuples if not t.draft]
        drafts = [t for t in tuples if t.draft]
        starts = _back_to_back(targets, 0)
        return starts + _back_to_back(drafts, self._draft_start(targets, starts))

    def _draft_start(self, targets: Sequence[CacheTuple], starts: Sequence[int]) -> int:
        """Where the MTP tuples start: right after the last target tuple."""
        return starts[-1] + targets[-1].nbytes if targets else 0


def _back_to_back(tuples: Sequence[CacheTuple], start: int) -> list[int]:
    starts = []
    for t in tuples:
        starts.append(start)
        start += t.nbytes
    return starts
