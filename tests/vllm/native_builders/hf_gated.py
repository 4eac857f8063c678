"""A vLLM-native builder whose specialised path opens only for the model vLLM says it serves.

Its gate reads what vLLM shows of the model beside the specs, as platform
builders do: ``model_config.use_mla`` and ``hf_config.model_type`` (DeepSeek
Sparse Attention: DeepSeek-V3.2 or GLM-5's ``glm_moe_dsa``).  Behind it sits
a planted bug: the backing is one page short of what the last block needs
(``KV-PLACE-BACKING-SIZE``).
A kit that shows every model as a Llama never opens the gate.
"""

from __future__ import annotations

from typing import Any

from vllm.v1.core.kv_cache_planning import DefaultKVCacheConfigBuilder

_DSA_MODELS = ("deepseek_v32", "glm_moe_dsa")


def dsa(vllm_config: Any) -> bool:
    """Whether vLLM describes a DeepSeek Sparse Attention model."""
    model = vllm_config.model_config
    return bool(model.use_mla and model.hf_config.model_type in _DSA_MODELS)


class DSAShortBackingBuilder(DefaultKVCacheConfigBuilder):
    """vLLM's placement, but for DSA models every backing is 4096 bytes short."""

    def get_kv_cache_config_from_groups(
        self, vllm_config: Any, kv_cache_groups: list[Any], num_blocks: int
    ) -> Any:
        placed = super().get_kv_cache_config_from_groups(vllm_config, kv_cache_groups, num_blocks)
        if dsa(vllm_config):
            for tensor in placed.kv_cache_tensors:
                tensor.size -= 4096
        return placed
