"""A platform descriptor whose 32-bit fast path is signed: fields between 2 and 4 GiB wrap.

:class:`SignedFastPathBuilder` (broken) keeps vLLM's grouping and placement
and writes every device tensor's offset and strides through the platform's
descriptor, which takes values under 4 GiB through a signed 32-bit field
(the top bit is lost) and larger ones through a 64-bit field (right).  Only
plans with a stride or offset in ``[2**31, 2**32)`` break: one layer's run
in a layer-outer layout is ``num_blocks x page``, between 2 and 4 GiB on
any GPU with tens of GiB, and the layers after it then alias earlier
blocks.  ``KV-PLACE-NO-BLOCK-ALIAS`` must catch it.
"""

from __future__ import annotations

import dataclasses

from vllm.config import VllmConfig
from vllm.v1.core.kv_cache_planning import DefaultKVCacheConfigBuilder
from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec

__all__ = ["SignedFastPathBuilder"]


def _descriptor_field(value: int) -> int:
    return value & 0x7FFFFFFF if 1 << 31 <= value < 1 << 32 else value


class SignedFastPathBuilder(DefaultKVCacheConfigBuilder):
    """vLLM's plan, with offsets and strides as the signed fast path stores them."""

    def get_kv_cache_config_from_groups(
        self, vllm_config: VllmConfig, kv_cache_groups: list[KVCacheGroupSpec], num_blocks: int
    ) -> KVCacheConfig:
        """vLLM's placement; device fields between 2 and 4 GiB lose their top bit."""
        config = super().get_kv_cache_config_from_groups(vllm_config, kv_cache_groups, num_blocks)
        tensors = [
            t
            if t.host_resident
            else dataclasses.replace(
                t,
                offset=_descriptor_field(t.offset),
                layer_stride=_descriptor_field(t.layer_stride),
                block_stride=_descriptor_field(t.block_stride),
            )
            for t in config.kv_cache_tensors
        ]
        return dataclasses.replace(config, kv_cache_tensors=tensors)
