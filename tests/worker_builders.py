"""Builders that break a rule of vLLM's GPU worker, each where vLLM's releases differ.

Each starts from the reference and changes one thing a worker rule is
about (tests/kit/check/test_worker_accept.py proves the kit's verdict under both
releases).  ``CAUGHT_BY`` names the ``KV-WORKER-*`` invariant meant to
catch it; ``RELEASES`` the vLLM releases whose worker has the rule, the
others accepting the placement (the invariant is not applicable there).
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
from vendor_builders.tensor_edits import grown, last_region_past_gap, pools_per_layer

from kvref import KVCacheConfig, KVCacheGroupSpec, PlanningConfig, ReferenceKVCacheConfigBuilder
from kvref.records import KVCacheTensor

__all__ = [
    "ALL",
    "LeadingScratch",
    "PerLayerPools",
    "ScratchGap",
    "ShiftedHeads",
    "TrailingScratch",
]

_LAYER_OUTER = ("LBNHC", "LBHNC")
_BLOCK_OUTER = ("BLHNC", "BLNHC", "BHLNC")


class _Worker(ReferenceKVCacheConfigBuilder):
    CAUGHT_BY = ""
    RELEASES: frozenset[str] = frozenset({"0.34.0"})
    #: The layouts where the builder departs from the reference.
    LAYOUTS: tuple[str, ...] = ()

    def get_kv_cache_config_from_groups(
        self, config: PlanningConfig, kv_cache_groups: Sequence[KVCacheGroupSpec], num_blocks: int
    ) -> KVCacheConfig:
        result = super().get_kv_cache_config_from_groups(config, kv_cache_groups, num_blocks)
        if config.kv_cache_layout.name not in self.LAYOUTS or not result.device_tensors:
            return result
        return self.change(result, num_blocks)

    def change(self, result: KVCacheConfig, num_blocks: int) -> KVCacheConfig:
        raise NotImplementedError


def _device_changed(result: KVCacheConfig, device: Sequence[KVCacheTensor]) -> KVCacheConfig:
    """``result`` with its device tensors replaced (host tensors kept, first)."""
    return attrs.evolve(result, kv_cache_tensors=[*result.host_tensors, *device])


class LeadingScratch(_Worker):
    """Leaves one page per block of scratch before every layer region (LBNHC, LBHNC).

    Every page keeps its bytes relative to the others and the backing grows
    linearly, so vLLM 0.33.0's worker runs it; vLLM 0.34.0's pads layer
    regions that must tile the backing from byte 0.
    """

    CAUGHT_BY = "KV-WORKER-LAYER-REGIONS"
    LAYOUTS = _LAYER_OUTER

    def change(self, result: KVCacheConfig, num_blocks: int) -> KVCacheConfig:
        shift = num_blocks * result.device_tensors[0].block_stride
        return _device_changed(result, grown(result.device_tensors, attrs.evolve, shift, shift))


class ScratchGap(_Worker):
    """Moves the last layer region past one page per block of scratch (LBNHC, LBHNC).

    The moved pages use bytes past where the regions before them end, so
    they no longer tile the backing: vLLM 0.34.0's worker would pad the
    regions apart and drop the trailing bytes the pages are in.
    """

    CAUGHT_BY = "KV-WORKER-LAYER-REGIONS"
    LAYOUTS = _LAYER_OUTER

    def change(self, result: KVCacheConfig, num_blocks: int) -> KVCacheConfig:
        moved = last_region_past_gap(result.device_tensors, num_blocks, attrs.evolve)
        return _device_changed(result, moved)


class PerLayerPools(_Worker):
    """Gives every device layer a pool of its own in the one backing (BLHNC, BLNHC).

    Each layer steps its own page over ``num_blocks`` blocks, as layer-outer
    layouts do, inside a block-outermost layout: vLLM 0.34.0's worker cuts
    such a backing by one block stride and refuses layers of different pages.
    The interface's ``KV-PLACE-BLOCK-STRIDE`` refuses it under every release
    too (block-outermost tensors step the whole block).
    """

    CAUGHT_BY = "KV-WORKER-BLOCK-SEGMENTS"
    # BHLNC interleaves a block's heads over its layers: no page of its own to pool.
    LAYOUTS = ("BLHNC", "BLNHC")

    def change(self, result: KVCacheConfig, num_blocks: int) -> KVCacheConfig:
        pools = pools_per_layer(result.device_tensors, num_blocks, KVCacheTensor)
        return _device_changed(result, pools)


class TrailingScratch(_Worker):
    """Adds half a block per block of scratch after the blocks (BLHNC, BLNHC, BHLNC).

    Tensors keep stepping the reference's block, so the backing is no longer
    a whole number of ``num_blocks``-block segments, which vLLM 0.34.0's
    worker refuses.  The interface's ``KV-PLACE-BLOCK-STRIDE`` refuses it
    under every release too (the tensors no longer step the backing / N).
    """

    CAUGHT_BY = "KV-WORKER-BLOCK-SEGMENTS"
    LAYOUTS = _BLOCK_OUTER

    def change(self, result: KVCacheConfig, num_blocks: int) -> KVCacheConfig:
        block = result.device_tensors[0].block_stride
        extra = num_blocks * max(1, block // 2)
        return _device_changed(result, grown(result.device_tensors, attrs.evolve, extra))


class ShiftedHeads(_Worker):
    """Starts every device tensor one block stride into a backing one segment larger (LHBNC).

    Safe for the ``num_blocks`` it is asked for: every page stays in the
    backing and none meets another.  But vLLM 0.34.0 cuts an LHBNC backing
    into ``num_blocks``-block segments, one per layer and head, and commits
    only a prefix of each: shifted by a block, the last committed block of
    every head lies past its segment's committed bytes.
    """

    CAUGHT_BY = "KV-WORKER-COMMITTED"
    LAYOUTS = ("LHBNC",)

    def change(self, result: KVCacheConfig, num_blocks: int) -> KVCacheConfig:
        stride = result.device_tensors[0].block_stride
        shifted = grown(result.device_tensors, attrs.evolve, num_blocks * stride, stride)
        return _device_changed(result, shifted)


#: Every builder of this module.
ALL: tuple[type[_Worker], ...] = (
    LeadingScratch,
    ScratchGap,
    PerLayerPools,
    TrailingScratch,
    ShiftedHeads,
)
