"""A platform whose DMA descriptor addresses at most eight layers: long tensors are cut in chunks.

vLLM's block-outermost placement gives each run of same-spec layers one
tensor whose layers sit ``layer_stride`` apart inside every block.  This
platform's descriptor names at most :data:`SLOTS` layers, so the builder
cuts every longer tensor of plain full attention into chunks of that many
layers, on the same backing.  It does so only where a layer's page is one
run inside a block (``is_block_compact``: BLHNC, BLNHC): in BHLNC the heads
of all a tensor's layers interleave, so the head stride depends on how many
layers the tensor holds, and a chunk would move every page.

:class:`DescriptorChunksBuilder` (legal) starts chunk ``c`` at
``offset + c * SLOTS * layer_stride``: every layer keeps the address vLLM
gave it (contract.md#placement-tensors: layer ``l`` of a tensor sits at
``offset + l * layer_stride``), so the plan's bytes are vLLM's exactly.

:class:`StaleChunkOffsetBuilder` (broken) keeps the tensor's offset for
every chunk, so layer ``SLOTS + l`` lands on layer ``l`` in every block.
``KV-PLACE-NO-LAYER-OVERLAP`` must catch it wherever it places, inside
vLLM's own Core flow and on the profiling path too.
"""

from __future__ import annotations

import dataclasses

from vllm.config import VllmConfig
from vllm.v1.core.kv_cache_planning import DefaultKVCacheConfigBuilder
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheTensor,
)

from tests.vllm.native_builders._common import layer_spec, plain_engine

__all__ = ["SLOTS", "DescriptorChunksBuilder", "StaleChunkOffsetBuilder"]

#: Layers one DMA descriptor names.
SLOTS = 8


def _full_attention(groups: list[KVCacheGroupSpec], tensor: KVCacheTensor) -> bool:
    owner = next((g for g in groups if tensor.layers and tensor.layers[0] in g.layer_names), None)
    return owner is not None and type(layer_spec(owner, tensor.layers[0])) is FullAttentionSpec


class DescriptorChunksBuilder(DefaultKVCacheConfigBuilder):
    """vLLM's plan, long full-attention tensors cut into descriptor-sized chunks."""

    #: Whether a chunk starts at its first layer's address (False: the bug).
    advance_offsets = True

    def get_kv_cache_config_from_groups(
        self, vllm_config: VllmConfig, kv_cache_groups: list[KVCacheGroupSpec], num_blocks: int
    ) -> KVCacheConfig:
        """vLLM's placement; in block-outermost layouts, tensors of at most :data:`SLOTS` layers."""
        config = super().get_kv_cache_config_from_groups(vllm_config, kv_cache_groups, num_blocks)
        layout = vllm_config.cache_config.get_resolved_kv_cache_layout()
        if not (plain_engine(vllm_config) and layout.is_block_compact):
            return config
        groups = list(config.kv_cache_groups)
        tensors: list[KVCacheTensor] = []
        for tensor in config.kv_cache_tensors:
            if (
                tensor.host_resident
                or len(tensor.layers) <= SLOTS
                or not _full_attention(groups, tensor)
            ):
                tensors.append(tensor)
                continue
            for first in range(0, len(tensor.layers), SLOTS):
                shift = first * tensor.layer_stride if self.advance_offsets else 0
                tensors.append(
                    dataclasses.replace(
                        tensor,
                        layers=list(tensor.layers[first : first + SLOTS]),
                        offset=tensor.offset + shift,
                    )
                )
        return dataclasses.replace(config, kv_cache_tensors=tensors)


class StaleChunkOffsetBuilder(DescriptorChunksBuilder):
    """Chunks that all start at the tensor's offset: later chunks overwrite the first."""

    advance_offsets = False
