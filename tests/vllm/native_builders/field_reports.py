"""Re-creations of bugs reported from the field, each behind a vendor's gate, ``super()`` elsewhere.

- :class:`HiSparseBaseOffsetBuilder` (broken): under HiSparse, every layer of
  a multi-layer tensor bound at the tensor's base offset (a layer stride of
  0), so each later layer overwrites the earlier ones: beside HiSparse's host
  groups ``KV-HOST-DEVICE-SAFE`` must catch it on the device and
  ``KV-HOST-NO-ALIAS`` in the host pool.
- :class:`HiSparseSplitLayersBuilder` (legal): under HiSparse, every layer of
  a multi-layer tensor on a tensor of its own at the same bytes
  (``offset + i * layer_stride``): the same placement, spelled per layer.
- :class:`MambaDropsSpeculativeBlocksBuilder` (broken): beside a drafter,
  Mamba group specs re-created without the state blocks that speculative
  decoding needs (``num_speculative_blocks``), so each request's capacity is
  undercounted.  ``KV-GROUP-SPEC-MEANING`` must catch it.
- :class:`MambaKeepsSpeculativeBlocksBuilder` (legal): the same re-creation,
  keeping them.
- :class:`PageStrideLayersBuilder` (broken): on a block-compact engine
  (``BLHNC``, ``BLNHC``) whose layers are all full attention
  (``isinstance(spec, FullAttentionSpec)``), vLLM's packed multi-layer
  tensors split into one tensor per layer, each
  stepping blocks by its own page size instead of the packed block that holds
  every layer's page: block ``b`` of layer ``i`` lands on block ``b + i`` of
  layer 0.  ``KV-PLACE-NO-BLOCK-ALIAS`` must catch it.
- :class:`PackedStrideLayersBuilder` (legal): the same split, each tensor
  stepping blocks by the packed block.
"""

from __future__ import annotations

import dataclasses

from vllm.config import VllmConfig
from vllm.v1.core.kv_cache_planning import DefaultKVCacheConfigBuilder
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheSpec,
    KVCacheTensor,
    MambaSpec,
)

from tests.vendor_builders.tensor_edits import one_layer_tensors
from tests.vllm.native_builders._common import layer_specs, plain_engine, with_layer_specs

__all__ = [
    "HiSparseBaseOffsetBuilder",
    "HiSparseSplitLayersBuilder",
    "MambaDropsSpeculativeBlocksBuilder",
    "MambaKeepsSpeculativeBlocksBuilder",
    "PackedStrideLayersBuilder",
    "PageStrideLayersBuilder",
]


def _one_layer(tensor: KVCacheTensor) -> bool:
    return len(tensor.layers) < 2


class _HiSparseRebinds(DefaultKVCacheConfigBuilder):
    """vLLM's placement, its tensors bound otherwise (:meth:`rebind`) under HiSparse only."""

    def rebind(self, tensors: list[KVCacheTensor]) -> list[KVCacheTensor]:
        """The tensors the platform binds for vLLM's ``tensors``."""
        raise NotImplementedError

    def get_kv_cache_config_from_groups(
        self, vllm_config: VllmConfig, kv_cache_groups: list[KVCacheGroupSpec], num_blocks: int
    ) -> KVCacheConfig:
        """vLLM's placement; under HiSparse its tensors as :meth:`rebind` binds them."""
        config: KVCacheConfig = super().get_kv_cache_config_from_groups(
            vllm_config, kv_cache_groups, num_blocks
        )
        if vllm_config.attention_config.hisparse_config is None:
            return config
        return dataclasses.replace(config, kv_cache_tensors=self.rebind(config.kv_cache_tensors))


class HiSparseSplitLayersBuilder(_HiSparseRebinds):
    """Under HiSparse, vLLM's tensors one layer each, at the same bytes (legal)."""

    def rebind(self, tensors: list[KVCacheTensor]) -> list[KVCacheTensor]:
        """Each multi-layer tensor bound layer by layer."""
        return one_layer_tensors(tensors, _one_layer, dataclasses.replace)


class HiSparseBaseOffsetBuilder(_HiSparseRebinds):
    """Every layer of a multi-layer tensor bound at the tensor's base offset (broken)."""

    def rebind(self, tensors: list[KVCacheTensor]) -> list[KVCacheTensor]:
        """No layer of a tensor steps past its base offset."""
        return [
            dataclasses.replace(tensor, layer_stride=0) if len(tensor.layers) > 1 else tensor
            for tensor in tensors
        ]


class MambaKeepsSpeculativeBlocksBuilder(DefaultKVCacheConfigBuilder):
    """Mamba group specs that keep speculative state blocks, re-created (legal)."""

    def speculative_blocks(self, spec: MambaSpec) -> int:
        """The state blocks a request keeps for speculative decoding."""
        return int(spec.num_speculative_blocks)

    def get_kv_cache_groups(
        self, vllm_config: VllmConfig, kv_cache_spec: dict[str, KVCacheSpec]
    ) -> list[KVCacheGroupSpec]:
        """vLLM's grouping; Mamba specs that keep speculative state blocks rebuilt."""
        groups: list[KVCacheGroupSpec] = super().get_kv_cache_groups(vllm_config, kv_cache_spec)
        return [with_layer_specs(group, self._rebuilt) for group in groups]

    def _rebuilt(self, spec: KVCacheSpec) -> KVCacheSpec:
        # The platform's gate: state caches served beside a drafter.
        if not isinstance(spec, MambaSpec) or spec.num_speculative_blocks == 0:
            return spec
        return dataclasses.replace(spec, num_speculative_blocks=self.speculative_blocks(spec))


class MambaDropsSpeculativeBlocksBuilder(MambaKeepsSpeculativeBlocksBuilder):
    """Mamba specs re-created without their speculative state blocks (broken)."""

    def speculative_blocks(self, spec: MambaSpec) -> int:
        """None: the drafter's state blocks forgotten."""
        return 0


class PackedStrideLayersBuilder(DefaultKVCacheConfigBuilder):
    """Full-attention engines: vLLM's packed tensors one layer each, packed block kept (legal)."""

    def block_stride(self, tensor: KVCacheTensor, page: int) -> int:
        """The bytes a split layer's tensor steps per block: the packed block."""
        return int(tensor.block_stride)

    def get_kv_cache_config_from_groups(
        self, vllm_config: VllmConfig, kv_cache_groups: list[KVCacheGroupSpec], num_blocks: int
    ) -> KVCacheConfig:
        """vLLM's placement; where the gate opens, each multi-layer tensor split by layer."""
        config: KVCacheConfig = super().get_kv_cache_config_from_groups(
            vllm_config, kv_cache_groups, num_blocks
        )
        specs = {name: spec for group in kv_cache_groups for name, spec in layer_specs(group)}
        # The platform's gate: its full-attention kernels bind one tensor per
        # layer, on engines whose blocks hold every layer's page side by side
        # as one run of bytes (a block-compact layout: under BHLNC a layer's
        # page is strided through the block and cannot stand alone).
        if (
            not plain_engine(vllm_config)
            or not vllm_config.cache_config.get_resolved_kv_cache_layout().is_block_compact
            or not specs
            or not all(isinstance(spec, FullAttentionSpec) for spec in specs.values())
        ):
            return config
        tensors = one_layer_tensors(
            config.kv_cache_tensors,
            _one_layer,
            dataclasses.replace,
            block_stride=lambda t: self.block_stride(t, int(specs[t.layers[0]].page_size_bytes)),
        )
        return dataclasses.replace(config, kv_cache_tensors=tensors)


class PageStrideLayersBuilder(PackedStrideLayersBuilder):
    """The same split, each layer's tensor stepping blocks by its page size (broken)."""

    def block_stride(self, tensor: KVCacheTensor, page: int) -> int:
        """The layer's page size: right for one layer a block, wrong for a packed block."""
        return page
