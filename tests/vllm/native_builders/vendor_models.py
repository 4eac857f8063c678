"""A vendor's models module with its own vLLM spec class, and a builder that gates on it.

The models module is evaluated in the kit's models child, never in the
judging process (docs/trust.md); its models cross as ``kvref-models/1`` data,
the vendor's class by name.  :class:`GatesOnItsClass` raises unless every
layer of that class reaches it as an instance of :class:`AcmeSlotSpec`
itself, with its own field, as vLLM would hand it; what it saw goes to
``KVREF_SEEN_SPECS``.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import torch
from vllm.v1.core.kv_cache_planning import DefaultKVCacheConfigBuilder
from vllm.v1.kv_cache_interface import FullAttentionSpec


@dataclasses.dataclass(frozen=True, kw_only=True)
class AcmeSlotSpec(FullAttentionSpec):
    """The vendor's full-attention class, with a field of its own (vLLM's page)."""

    acme_slot: int = 0


_FIELDS: dict[str, Any] = {
    "block_size": 16,
    "num_kv_heads": 2,
    "head_size": 64,
    "dtype": torch.bfloat16,
}

#: Two decoder layers in the vendor's class, one in vLLM's.
MODELS = [
    {
        "model.layers.0.self_attn.attn": AcmeSlotSpec(**_FIELDS, acme_slot=5),
        "model.layers.1.self_attn.attn": AcmeSlotSpec(**_FIELDS, acme_slot=5),
        "model.layers.2.self_attn.attn": FullAttentionSpec(**_FIELDS),
    }
]


class GatesOnItsClass(DefaultKVCacheConfigBuilder):
    """vLLM's default builder that refuses a vendor layer not handed as its own class."""

    def get_kv_cache_groups(self, vllm_config: Any, kv_cache_spec: dict[str, Any]) -> list[Any]:
        seen = []
        for name, spec in kv_cache_spec.items():
            if type(spec).__name__ == "AcmeSlotSpec":
                if type(spec) is not AcmeSlotSpec or spec.acme_slot != 5:
                    raise TypeError(f"{name}: {type(spec)!r} is not the vendor's class")
                seen.append(f"{name} AcmeSlotSpec {spec.acme_slot}")
        path = os.environ.get("KVREF_SEEN_SPECS")
        if path and seen:
            with open(path, "a", encoding="utf-8") as f:
                f.write("\n".join(seen) + "\n")
        return super().get_kv_cache_groups(vllm_config, kv_cache_spec)
