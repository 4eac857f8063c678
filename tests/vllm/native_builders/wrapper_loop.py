"""A vendor placement that still walks a uniform-type group's spec map, as vLLM 0.33.0 did.

vLLM 0.33.0's default placement took a group's layers from its
``UniformTypeKVCacheSpecs`` wrapper (the whole model's layers of that group)
instead of the group's ``layer_names`` (the worker's), so a pipeline stage
whose projection of the group is empty got a tensor for layers it does not
hold (vLLM issue 54711).  0.34.0's default walks ``layer_names``.
:class:`WrapperLoopBuilder` is a vendor placement written against 0.33.0 that
kept the loop: under 0.33.0 its failure is vLLM's own defect (its parent
fails it too); under 0.34.0 it is the vendor's own finding.
"""

from __future__ import annotations

import dataclasses

from vllm.config import VllmConfig
from vllm.v1.core.kv_cache_planning import DefaultKVCacheConfigBuilder
from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec, UniformTypeKVCacheSpecs

__all__ = ["WrapperLoopBuilder"]


class WrapperLoopBuilder(DefaultKVCacheConfigBuilder):
    """Places every layer a uniform-type group's wrapper names, held by this worker or not."""

    def get_kv_cache_config_from_groups(
        self, vllm_config: VllmConfig, kv_cache_groups: list[KVCacheGroupSpec], num_blocks: int
    ) -> KVCacheConfig:
        """``super()``'s placement of the groups with their wrapper's layers."""
        walked = [
            dataclasses.replace(g, layer_names=list(g.kv_cache_spec.kv_cache_specs))
            if isinstance(g.kv_cache_spec, UniformTypeKVCacheSpecs)
            else g
            for g in kv_cache_groups
        ]
        config = super().get_kv_cache_config_from_groups(vllm_config, walked, num_blocks)
        # The groups Core handed in are what the config must echo.
        return dataclasses.replace(config, kv_cache_groups=kv_cache_groups)
