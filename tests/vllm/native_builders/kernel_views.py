"""vLLM-native builders read through the worker's kernel views (KV-DEV-KERNEL-VIEWS).

Both split every device tensor of a block-outermost layout (BLNHC, BLHNC)
into one tensor per layer, each page keeping its bytes; they differ only in
the layer stride of those one-layer tensors, a stride no view of the plan
steps (contract.md#kernel-views).

- :class:`OneLayerTensorsBuilder` (legal) keeps vLLM's layer stride, one
  page, below the block stride: the worker sees block-outermost packing and
  never splits the blocks.
- :class:`UnpackedOneLayerTensorsBuilder`, meant invariant
  ``KV-DEV-KERNEL-VIEWS``: it sets the layer stride to the block stride, so
  the worker takes each tensor as layer-outer and, where the backends take
  kernel blocks below the cache block, refuses to split blocks that hold
  other layers' pages.
- :class:`SqueezedOneLayerTensorsBuilder`, meant invariant
  ``KV-DEV-KERNEL-VIEWS``: its mirror in layer-compact layouts (LBNHC,
  LBHNC), one tensor per layer whose layer stride is half its block stride:
  the worker takes each tensor as packed, never splits its blocks
  group-wide, and at bind time refuses a backend whose kernel blocks are
  smaller than the block (``map_kv_cache_to_kernel_blocks``), where it
  splits vLLM's own plan.
"""

from __future__ import annotations

import dataclasses

from vllm.config import VllmConfig
from vllm.v1.core.kv_cache_planning import DefaultKVCacheConfigBuilder
from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec, KVCacheTensor

from tests.vendor_builders.tensor_edits import one_layer_tensors

__all__ = [
    "OneLayerTensorsBuilder",
    "SqueezedOneLayerTensorsBuilder",
    "UnpackedOneLayerTensorsBuilder",
]

_BLOCK_OUTER = frozenset({"BLNHC", "BLHNC"})


class OneLayerTensorsBuilder(DefaultKVCacheConfigBuilder):
    """One tensor per layer in block-outermost layouts; every stride stays vLLM's."""

    #: The layouts whose tensors are split.
    layouts = _BLOCK_OUTER

    def _layer_stride(self, tensor: KVCacheTensor) -> int:
        return tensor.layer_stride

    def get_kv_cache_config_from_groups(
        self, vllm_config: VllmConfig, kv_cache_groups: list[KVCacheGroupSpec], num_blocks: int
    ) -> KVCacheConfig:
        config = super().get_kv_cache_config_from_groups(vllm_config, kv_cache_groups, num_blocks)
        layout = vllm_config.cache_config.get_resolved_kv_cache_layout()
        if layout.name not in self.layouts:
            return config
        tensors = one_layer_tensors(
            config.kv_cache_tensors,
            lambda t: getattr(t, "host_resident", False) or len(t.layers) < 2,
            dataclasses.replace,
            layer_stride=self._layer_stride,
        )
        return dataclasses.replace(config, kv_cache_tensors=tensors)


class UnpackedOneLayerTensorsBuilder(OneLayerTensorsBuilder):
    """As :class:`OneLayerTensorsBuilder`, each one-layer tensor's layer stride its block stride.

    The bug: a one-layer tensor "has no layer stride", so the platform fills
    in the block stride; vLLM's worker reads ``block_stride > layer_stride``
    as the sign of block-outermost packing.
    """

    def _layer_stride(self, tensor: KVCacheTensor) -> int:
        return tensor.block_stride


class SqueezedOneLayerTensorsBuilder(OneLayerTensorsBuilder):
    """One tensor per layer in layer-compact layouts, each layer stride half its block stride.

    The bug: a one-layer tensor "has no layer stride", so the platform writes
    any positive value; vLLM's worker reads ``block_stride > layer_stride`` as
    block-outermost packing and then cannot bind a backend's smaller kernel
    blocks.
    """

    layouts = frozenset({"LBNHC", "LBHNC"})

    def _layer_stride(self, tensor: KVCacheTensor) -> int:
        return max(1, tensor.block_stride // 2)
