"""A platform config helper older than the prefix-cache retention interval.

:class:`RetentionDroppedBuilder` (broken) keeps vLLM's grouping and
placement, but for hybrid models (a sliding-window or Mamba layer) in the
platform's block-outermost layouts it rebuilds each config through its own
helper, which passes every field it knew of: the retention interval falls
back to the dataclass default ``None`` (dense checkpoints) whatever the
operator asked for (default 0).  vLLM's KV cache manager reads the interval
from the config, so the cache keeps other checkpoints than the operator
chose.  ``KV-PLACE-RETENTION`` must catch it.
"""

from __future__ import annotations

from vllm.config import VllmConfig
from vllm.v1.core.kv_cache_planning import DefaultKVCacheConfigBuilder
from vllm.v1.kv_cache_interface import (
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
    SlidingWindowSpec,
)

from tests.vllm.native_builders._common import layer_specs, plain_engine

__all__ = ["RetentionDroppedBuilder"]


class RetentionDroppedBuilder(DefaultKVCacheConfigBuilder):
    """vLLM's plan, re-made without the retention interval for hybrid models."""

    def get_kv_cache_config_from_groups(
        self, vllm_config: VllmConfig, kv_cache_groups: list[KVCacheGroupSpec], num_blocks: int
    ) -> KVCacheConfig:
        """vLLM's placement; hybrid models' configs lose the retention interval."""
        config = super().get_kv_cache_config_from_groups(vllm_config, kv_cache_groups, num_blocks)
        hybrid = any(
            isinstance(spec, (SlidingWindowSpec, MambaSpec))
            for group in kv_cache_groups
            for _, spec in layer_specs(group)
        )
        if not (plain_engine(vllm_config) and hybrid):
            return config
        return KVCacheConfig(
            num_blocks=config.num_blocks,
            kv_cache_tensors=config.kv_cache_tensors,
            kv_cache_groups=config.kv_cache_groups,
        )
