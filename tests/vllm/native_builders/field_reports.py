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
"""

from __future__ import annotations

import dataclasses

from vllm.config import VllmConfig
from vllm.v1.core.kv_cache_planning import DefaultKVCacheConfigBuilder
from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec, KVCacheSpec, MambaSpec

from tests.vllm.native_builders._common import with_layer_specs

__all__ = [
    "HiSparseBaseOffsetBuilder",
    "HiSparseSplitLayersBuilder",
    "MambaDropsSpeculativeBlocksBuilder",
    "MambaKeepsSpeculativeBlocksBuilder",
]


class HiSparseSplitLayersBuilder(DefaultKVCacheConfigBuilder):
    """Under HiSparse, vLLM's tensors one layer each, at the same bytes (legal)."""

    def get_kv_cache_config_from_groups(
        self, vllm_config: VllmConfig, kv_cache_groups: list[KVCacheGroupSpec], num_blocks: int
    ) -> KVCacheConfig:
        """vLLM's placement; under HiSparse each multi-layer tensor bound layer by layer."""
        config: KVCacheConfig = super().get_kv_cache_config_from_groups(
            vllm_config, kv_cache_groups, num_blocks
        )
        if vllm_config.attention_config.hisparse_config is None:
            return config
        tensors = []
        for tensor in config.kv_cache_tensors:
            if len(tensor.layers) < 2:
                tensors.append(tensor)
                continue
            tensors.extend(
                dataclasses.replace(
                    tensor, layers=[name], offset=tensor.offset + i * tensor.layer_stride
                )
                for i, name in enumerate(tensor.layers)
            )
        return dataclasses.replace(config, kv_cache_tensors=tensors)


class HiSparseBaseOffsetBuilder(DefaultKVCacheConfigBuilder):
    """Every layer of a multi-layer tensor bound at the tensor's base offset (broken)."""

    def get_kv_cache_config_from_groups(
        self, vllm_config: VllmConfig, kv_cache_groups: list[KVCacheGroupSpec], num_blocks: int
    ) -> KVCacheConfig:
        """vLLM's placement; under HiSparse no layer of a tensor steps past its base offset."""
        config: KVCacheConfig = super().get_kv_cache_config_from_groups(
            vllm_config, kv_cache_groups, num_blocks
        )
        if vllm_config.attention_config.hisparse_config is None:
            return config
        tensors = [
            dataclasses.replace(tensor, layer_stride=0) if len(tensor.layers) > 1 else tensor
            for tensor in config.kv_cache_tensors
        ]
        return dataclasses.replace(config, kv_cache_tensors=tensors)


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
