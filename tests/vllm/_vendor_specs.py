"""A vendor's own vLLM spec subclass and a vLLM-native builder that records what it is given."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from vllm.v1.core.kv_cache_planning import DefaultKVCacheConfigBuilder
from vllm.v1.kv_cache_interface import MLAAttentionSpec


@dataclasses.dataclass(frozen=True, kw_only=True)
class AcmeMLASpec(MLAAttentionSpec):
    """A vendor's MLA latent with a vendor-only field (the page is vLLM's)."""

    acme_slot: int = 0


class RecordingBuilder(DefaultKVCacheConfigBuilder):
    """vLLM's default builder that records the config and the specs each grouping call sees."""

    seen: ClassVar[list[dict[str, Any]]] = []

    def get_kv_cache_groups(self, vllm_config: Any, kv_cache_spec: dict[str, Any]) -> Any:
        model = vllm_config.model_config
        spec_config = vllm_config.speculative_config
        draft = getattr(spec_config, "draft_model_config", None)
        type(self).seen.append(
            {
                "num_hidden_layers": model.hf_config.num_hidden_layers,
                "total_layers": model.get_total_num_hidden_layers(),
                "nextn": getattr(model.hf_config, "num_nextn_predict_layers", None),
                "method": getattr(spec_config, "method", None),
                "tokens": getattr(spec_config, "num_speculative_tokens", None),
                "multi_mtp": spec_config.use_multi_module_mtp() if spec_config else None,
                "block_drop": spec_config.use_eagle_block_drop() if spec_config else None,
                "draft_layers": draft.get_total_num_hidden_layers() if draft else None,
                "specs": dict(kv_cache_spec),
            }
        )
        return super().get_kv_cache_groups(vllm_config, kv_cache_spec)
