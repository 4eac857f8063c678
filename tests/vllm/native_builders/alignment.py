"""A platform whose DMA engine addresses blocks in 4 KiB units, and a port that loses alignment.

:class:`DmaAlignedGroupsBuilder` (legal) keeps vLLM's grouping, then, in
block-outermost layouts and for groups whose spec is exactly vLLM's full or
sliding-window attention, asks the group's block strides for
``lcm(alignment, 4096)`` bytes; vLLM's placement (``super()``) then pads each
block to that.  vLLM reads ``block_stride_alignment`` only to size block
strides, so asking for more is legal (contract.md#group-spec-meaning).

:class:`DropsAlignmentBuilder` (broken) rebuilds every group spec that carries
a ``block_stride_alignment`` without it, as a port that copies the head
geometry into a fresh spec would: the backend's kernels then meet block
strides they cannot address.  ``KV-GROUP-SPEC-MEANING`` must catch it.
"""

from __future__ import annotations

import dataclasses
import math

from vllm.config import VllmConfig
from vllm.v1.core.kv_cache_planning import DefaultKVCacheConfigBuilder
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheGroupSpec,
    KVCacheSpec,
    SlidingWindowSpec,
)

from tests.vllm.native_builders._common import with_layer_specs

__all__ = ["DmaAlignedGroupsBuilder", "DropsAlignmentBuilder"]

_DMA_UNIT = 4096


class DmaAlignedGroupsBuilder(DefaultKVCacheConfigBuilder):
    """vLLM's groups, with plain attention groups' block strides aligned to the DMA unit."""

    def get_kv_cache_groups(
        self, vllm_config: VllmConfig, kv_cache_spec: dict[str, KVCacheSpec]
    ) -> list[KVCacheGroupSpec]:
        """vLLM's grouping; plain full or sliding-window groups ask for 4 KiB-aligned strides."""
        groups = super().get_kv_cache_groups(vllm_config, kv_cache_spec)
        layout = vllm_config.cache_config.get_resolved_kv_cache_layout()
        if not layout.is_block_outermost:
            return groups
        out = []
        for group in groups:
            spec = group.kv_cache_spec
            if type(spec) not in (FullAttentionSpec, SlidingWindowSpec):
                out.append(group)
                continue
            wanted = math.lcm(spec.get_block_stride_alignment(), _DMA_UNIT)
            spec = dataclasses.replace(spec, block_stride_alignment=wanted)
            out.append(dataclasses.replace(group, kv_cache_spec=spec))
        return out


class DropsAlignmentBuilder(DefaultKVCacheConfigBuilder):
    """vLLM's groups, rebuilt without the backends' block-stride alignment."""

    def get_kv_cache_groups(
        self, vllm_config: VllmConfig, kv_cache_spec: dict[str, KVCacheSpec]
    ) -> list[KVCacheGroupSpec]:
        """vLLM's grouping with every ``block_stride_alignment`` of a group spec forgotten."""
        groups = super().get_kv_cache_groups(vllm_config, kv_cache_spec)
        return [with_layer_specs(group, _unaligned) for group in groups]


def _unaligned(spec: KVCacheSpec) -> KVCacheSpec:
    if spec.block_stride_alignment is None:
        return spec
    return dataclasses.replace(spec, block_stride_alignment=None)
