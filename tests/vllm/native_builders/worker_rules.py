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
        out: list[KVCacheTensor] = []
        for t in device:
            for i, name in enumerate(t.layers):
                at = t.offset + i * t.layer_stride
                first = at < slot
                out.append(
                    dataclasses.replace(
                        t,
                        layers=[name],
                        size=slot if first else total - slot,
                        offset=at if first else at - slot,
                    )
                )
        return out

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
        return [
            dataclasses.replace(t, size=t.size + shift, offset=t.offset + shift) for t in device
        ]


class ScratchGapBuilder(_Worker):
    """The last layer region moved past one page per block of scratch (LBNHC, LBHNC)."""

    CAUGHT_BY = "KV-WORKER-LAYER-REGIONS"
    LAYOUTS = _LAYER_OUTER

    def change(self, device: Sequence[KVCacheTensor], num_blocks: int) -> list[KVCacheTensor]:
        last = max(t.offset + i * t.layer_stride for t in device for i in range(len(t.layers)))
        gap = num_blocks * device[0].block_stride
        out: list[KVCacheTensor] = []
        for t in device:
            starts = [t.offset + i * t.layer_stride for i in range(len(t.layers))]
            kept = [n for n, at in zip(t.layers, starts, strict=True) if at != last]
            if kept:
                out.append(dataclasses.replace(t, size=t.size + gap, layers=kept))
            out += [
                dataclasses.replace(t, size=t.size + gap, layers=[n], offset=last + gap)
                for n, at in zip(t.layers, starts, strict=True)
                if at == last
            ]
        return out


class PerLayerPoolsBuilder(_Worker):
    """Every device layer a pool of its own in the one backing, stepping its page (BLHNC, BLNHC)."""

    CAUGHT_BY = "KV-WORKER-BLOCK-SEGMENTS"
    LAYOUTS = ("BLHNC", "BLNHC")

    def change(self, device: Sequence[KVCacheTensor], num_blocks: int) -> list[KVCacheTensor]:
        placed: list[tuple[str, int, int]] = []
        offset = 0
        for t in device:
            for name in t.layers:
                # In block-outermost layouts a tensor's layers are one page apart.
                placed.append((name, t.layer_stride, offset))
                offset += num_blocks * t.layer_stride
        return [
            KVCacheTensor(
                size=offset,
                layers=[name],
                layer_stride=num_blocks * page,
                block_stride=page,
                offset=at,
            )
            for name, page, at in placed
        ]


class TrailingScratchBuilder(_Worker):
    """Half a block per block of scratch after the blocks (BLHNC, BLNHC, BHLNC)."""

    CAUGHT_BY = "KV-WORKER-BLOCK-SEGMENTS"
    LAYOUTS = ("BLHNC", "BLNHC", "BHLNC")

    def change(self, device: Sequence[KVCacheTensor], num_blocks: int) -> list[KVCacheTensor]:
        extra = num_blocks * max(1, device[0].block_stride // 2)
        return [dataclasses.replace(t, size=t.size + extra) for t in device]


class ShiftedHeadsBuilder(_Worker):
    """LHBNC one block stride into a backing one ``num_blocks``-block segment larger."""

    CAUGHT_BY = "KV-WORKER-COMMITTED"
    LAYOUTS = ("LHBNC",)

    def change(self, device: Sequence[KVCacheTensor], num_blocks: int) -> list[KVCacheTensor]:
        stride = device[0].block_stride
        return [
            dataclasses.replace(t, size=t.size + num_blocks * stride, offset=t.offset + stride)
            for t in device
        ]


#: Every builder of this module.
ALL: tuple[type[_Worker], ...] = (
    SeparateSizesBuilder,
    LeadingScratchBuilder,
    ScratchGapBuilder,
    PerLayerPoolsBuilder,
    TrailingScratchBuilder,
    ShiftedHeadsBuilder,
)
