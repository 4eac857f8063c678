"""A vLLM builder for DeepSeek-V3.2-style sparse MLA: latent and indexer key side by side.

A DeepSeek-V3.2 decoder layer ``model.layers.{i}.self_attn`` keeps two
caches: ``.attn``, the MLA latent (``cache_role`` SPARSE), and
``.indexer.k_cache``, the lightning indexer's fp8 key (``cache_role``
INDEXER).  Neither compresses tokens (``tokens_per_state`` 1).

This (fictional) platform's sparse kernel fetches a decoder layer's latent
and key with one DMA descriptor, so every block holds, per decoder layer, a
*tuple* (latent, then key) and the tuples back to back, target layers by
index, MTP draft layers last.  The DMA engine moves whole 4 KiB granules: a
block is rounded up to one.  vLLM's default packs the same bytes with no
granule, so its one-block probe would give a different block size than the
platform allocates; the builder therefore answers
``_get_pool_bytes_per_block`` itself for the models it places, and returns
``None`` ("Core probes") for every other model, whose placement is vLLM's.

The gate is strict, because a near miss is a different kernel: every layer
of the groups must be exactly vLLM's ``MLAAttentionSpec`` (no vendor
subclass, no ``SlidingWindowMLASpec``, no state layer), with one token per
state, and every decoder layer must have both its latent (role SPARSE) and
its key (role INDEXER) in the groups handed over.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from vllm.config import VllmConfig
from vllm.v1.kv_cache_interface import (
    KVCacheGroupSpec,
    KVCacheSpec,
    MLAAttentionSpec,
    SparseCacheRole,
)

from tests.vllm.native_builders._common import (
    SlotPlan,
    SlotPoolBuilder,
    layer_specs,
    pack,
    plain_engine,
)

__all__ = ["GRANULE", "DeepSeekV32TupleBuilder", "v32_key"]

#: The DMA granule every block is rounded up to.
GRANULE = 4096

_LAYER = re.compile(r"^(?P<stem>.+?\.(?P<index>\d+)\.self_attn)\.(?P<role>attn|indexer\.k_cache)$")
#: The cache role each name must carry, and its rank inside the tuple.
_ROLES: dict[str, tuple[SparseCacheRole, int]] = {
    "attn": (SparseCacheRole.SPARSE, 0),
    "indexer.k_cache": (SparseCacheRole.INDEXER, 1),
}


def v32_key(name: str, spec: KVCacheSpec) -> tuple[str, bool, int, int] | None:
    """``(stem, draft, decoder index, rank)`` of a V3.2 cache, or ``None`` when it is not one."""
    match = _LAYER.match(name)
    # Exact class: a subclass could change the page or the kernel that reads it.
    if match is None or type(spec) is not MLAAttentionSpec:
        return None
    role, rank = _ROLES[match["role"]]
    if spec.cache_role is not role or spec.tokens_per_state != 1:
        return None
    return match["stem"], spec.is_draft, int(match["index"]), rank


class DeepSeekV32TupleBuilder(SlotPoolBuilder):
    """Per-decoder-layer (latent, key) tuples on a 4 KiB granule; vLLM's default otherwise."""

    def _slot_plan(
        self, vllm_config: VllmConfig, groups: Sequence[KVCacheGroupSpec]
    ) -> SlotPlan | None:
        """Offsets of every cache, or ``None`` when the groups are not this platform's."""
        if not plain_engine(vllm_config) or not any(g.layer_names for g in groups):
            return None
        keys: dict[str, tuple[str, bool, int, int]] = {}
        for group in groups:
            for name, spec in layer_specs(group):
                key = v32_key(name, spec)
                if key is None:
                    return None
                keys[name] = key
        # Both caches of every decoder layer, or the tuples are not the kernel's.
        ranks: dict[str, set[int]] = {}
        for stem, _, _, rank in keys.values():
            ranks.setdefault(stem, set()).add(rank)
        if any(r != {0, 1} for r in ranks.values()):
            return None
        placed: list[tuple[str, int, KVCacheSpec]] = []
        for group in groups:
            # Every group starts at byte 0: a block ID is one group's at a time.
            offset = 0
            for name, spec in sorted(layer_specs(group), key=lambda m: keys[m[0]][1:]):
                placed.append((name, offset, spec))
                offset += spec.page_size_bytes
        return pack(placed, granule=self._granule())

    def _granule(self) -> int:
        return GRANULE
