"""vLLM-native builders that break a rule of vLLM's GPU worker.

tests/vllm/test_worker_accept_native.py judges them.  The twins of
tests/worker_builders.py, written against vLLM: each keeps vLLM's grouping
and placement and changes one thing a worker rule is about.  ``CAUGHT_BY``
names the ``KV-WORKER-*`` invariant meant to catch it, ``RELEASES`` the vLLM
releases whose worker has the rule.

- :class:`SeparateSizesBuilder`: slot 0 of every group in an allocation of
  its own, declared through ``_get_pool_bytes_per_block`` (the interface
  allows it; no GPU worker of 0.33.0 or 0.34.0 allocates it);
- :class:`LeadingScratchBuilder`, :class:`ScratchGapBuilder`: scratch before
  the layer regions, or between the last one and the others (LBNHC, LBHNC);
- :class:`PerLayerPoolsBuilder`, :class:`TrailingScratchBuilder`: layers
  stepping their own pages, or scratch after the blocks (block-outermost);
- :class:`ShiftedHeadsBuilder`: LHBNC shifted one block stride into a
  backing one segment larger: safe at the capacity, not at fewer blocks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import ClassVar

from vllm.config import VllmConfig
from vllm.v1.core.kv_cache_planning import DefaultKVCacheConfigBuilder
from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec, KVCacheTensor

from tests.vendor_builders.tensor_edits import (
    first_slot_apart,
    grown,
    last_region_past_gap,
    pools_per_layer,
)

__all__ = [
    "ALL",
    "LeadingScratchBuilder",
    "PerLayerPoolsBuilder",
    "ScratchGapBuilder",
    "SeparateSizesBuilder",
    "ShiftedHeadsBuilder",
    "TrailingScratchBuilder",
]

_LAYER_OUTER = ("LBNHC", "LBHNC")


def _host(t: KVCacheTensor) -> bool:
    return bool(getattr(t, "host_resident", False))


class _Worker(DefaultKVCacheConfigBuilder):
    CAUGHT_BY: ClassVar[str] = ""
    RELEASES: ClassVar[frozenset[str]] = frozenset({"0.34.0"})
    #: The layouts where the builder departs from vLLM's placement.
    LAYOUTS: ClassVar[tuple[str, ...]] = ()

    def get_kv_cache_config_from_groups(
        self, vllm_config: VllmConfig, kv_cache_groups: list[KVCacheGroupSpec], num_blocks: int
    ) -> KVCacheConfig:
        config = super().get_kv_cache_config_from_groups(vllm_config, kv_cache_groups, num_blocks)
        layout = vllm_config.cache_config.get_resolved_kv_cache_layout().name
        device = [t for t in config.kv_cache_tensors if not _host(t)]
        if layout not in self.LAYOUTS or not device:
            return config
        tensors = [t for t in config.kv_cache_tensors if _host(t)]
        return dataclasses.replace(
            config, kv_cache_tensors=tensors + self.change(device, num_blocks)
        )

    def change(self, device: Sequence[KVCacheTensor], num_blocks: int) -> list[KVCacheTensor]:
        raise NotImplementedError


class SeparateSizesBuilder(_Worker):
    """Every group's first layer region in a device allocation of its own (LBNHC, LBHNC)."""

    CAUGHT_BY = "KV-WORKER-ONE-BACKING"
    RELEASES = frozenset({"0.33.0", "0.34.0"})
    LAYOUTS = _LAYER_OUTER

    def change(self, device: Sequence[KVCacheTensor], num_blocks: int) -> list[KVCacheTensor]:
        slot = device[0].block_stride * num_blocks
        total = device[0].size
        if slot <= 0 or total % slot or total // slot < 3 or any(t.offset % slot for t in device):
            # Fewer than three slots give equal allocations, which no one tells apart.
            return list(device)
        return first_slot_apart(device, slot, total, dataclasses.replace)

    def _get_pool_bytes_per_block(
        self, vllm_config: VllmConfig, kv_cache_groups: list[KVCacheGroupSpec]
    ) -> int | None:
        # vLLM's placement honours num_gpu_blocks_override: divide by the blocks placed.
        placed = self.get_kv_cache_config_from_groups(vllm_config, kv_cache_groups, 1)
        return sum({t.size for t in placed.kv_cache_tensors if not _host(t)}) // placed.num_blocks


class LeadingScratchBuilder(_Worker):
    """One page per block of scratch before every layer region (LBNHC, LBHNC)."""

    CAUGHT_BY = "KV-WORKER-LAYER-REGIONS"
    LAYOUTS = _LAYER_OUTER

    def change(self, device: Sequence[KVCacheTensor], num_blocks: int) -> list[KVCacheTensor]:
        shift = num_blocks * device[0].block_stride
        return grown(device, dataclasses.replace, shift, shift)


class ScratchGapBuilder(_Worker):
    """The last layer region moved past one page per block of scratch (LBNHC, LBHNC)."""

    CAUGHT_BY = "KV-WORKER-LAYER-REGIONS"
    LAYOUTS = _LAYER_OUTER

    def change(self, device: Sequence[KVCacheTensor], num_blocks: int) -> list[KVCacheTensor]:
        return last_region_past_gap(device, num_blocks, dataclasses.replace)


class PerLayerPoolsBuilder(_Worker):
    """Every device layer a pool of its own in the one backing, stepping its page (BLHNC, BLNHC)."""

    CAUGHT_BY = "KV-WORKER-BLOCK-SEGMENTS"
    LAYOUTS = ("BLHNC", "BLNHC")

    def change(self, device: Sequence[KVCacheTensor], num_blocks: int) -> list[KVCacheTensor]:
        return pools_per_layer(device, num_blocks, KVCacheTensor)


class TrailingScratchBuilder(_Worker):
    """Half a block per block of scratch after the blocks (BLHNC, BLNHC, BHLNC)."""

    CAUGHT_BY = "KV-WORKER-BLOCK-SEGMENTS"
    LAYOUTS = ("BLHNC", "BLNHC", "BHLNC")

    def change(self, device: Sequence[KVCacheTensor], num_blocks: int) -> list[KVCacheTensor]:
        extra = num_blocks * max(1, device[0].block_stride // 2)
        return grown(device, dataclasses.replace, extra)


class ShiftedHeadsBuilder(_Worker):
    """LHBNC one block stride into a backing one ``num_blocks``-block segment larger."""

    CAUGHT_BY = "KV-WORKER-COMMITTED"
    LAYOUTS = ("LHBNC",)

    def change(self, device: Sequence[KVCacheTensor], num_blocks: int) -> list[KVCacheTensor]:
        stride = device[0].block_stride
        return grown(device, dataclasses.replace, num_blocks * stride, stride)


#: Every builder of this module.
ALL: tuple[type[_Worker], ...] = (
    SeparateSizesBuilder,
    LeadingScratchBuilder,
    ScratchGapBuilder,
    PerLayerPoolsBuilder,
    TrailingScratchBuilder,
    ShiftedHeadsBuilder,
)
