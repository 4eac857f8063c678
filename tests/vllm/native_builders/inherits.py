"""A vendor bug of the same invariant as one of vLLM's own defects, in another regime.

:class:`GhostLayerBuilder` (broken) calls ``super()`` and so inherits vLLM
0.33.0's pipeline-projection defect, which fails ``KV-PLACE-UNKNOWN-LAYER`` on
many pipeline examples (a worker gets a tensor for layers it does not hold).
Its own bug fails the same invariant elsewhere: on large pools (1,000 blocks
or more) whose groups all hold layers, it lists a layer that no group has in
its first device tensor (a debug slot left in).  The report must show that
failure as the builder's own, not only the inherited one, or an expectations
manifest that excuses vLLM's defect would excuse the vendor's bug too.
"""

from __future__ import annotations

import dataclasses

from vllm.config import VllmConfig
from vllm.v1.core.kv_cache_planning import DefaultKVCacheConfigBuilder
from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec

__all__ = ["GhostLayerBuilder"]

GHOST = "platform.debug.ghost"


class GhostLayerBuilder(DefaultKVCacheConfigBuilder):
    """vLLM's placement, with a ghost layer in the first device tensor of large pools."""

    def get_kv_cache_config_from_groups(
        self, vllm_config: VllmConfig, kv_cache_groups: list[KVCacheGroupSpec], num_blocks: int
    ) -> KVCacheConfig:
        """``super()``'s config; from 1,000 blocks up, tensor 0 also names :data:`GHOST`."""
        config = super().get_kv_cache_config_from_groups(vllm_config, kv_cache_groups, num_blocks)
        if num_blocks < 1000 or len(kv_cache_groups) < 3:
            return config
        if not all(g.layer_names for g in kv_cache_groups):
            return config
        tensors = list(config.kv_cache_tensors)
        for i, tensor in enumerate(tensors):
            if not tensor.host_resident:
                tensors[i] = dataclasses.replace(tensor, layers=[*tensor.layers, GHOST])
                break
        return dataclasses.replace(config, kv_cache_tensors=tensors)
