"""A platform that builds on kvref's builder and specialises MLA models only.

:class:`KvrefMLAGranuleBuilder` (legal) is a subclass of kvref's vLLM-native
builder (``kvref.interop.vllm_builder.KvrefKVCacheConfigBuilder``): its MLA
kernels read whole 4 KiB granules, so where every device layer of a
placement is an uncompressed MLA cache (one token a state), on a
block-outermost layout without HiSparse, it rounds one block's bytes up to
the granule (where the layers' block-stride alignments divide it) and steps
the blocks by it; everything else, grouping included, is ``super()``, that
is kvref's reference.  Core probes a one-block placement (the builder
declares no pool bytes), so the padding is budgeted.

:class:`KvrefMLAShortBackingBuilder` (broken) pads the block stride the same
way but keeps the backing of the unpadded bytes: the last blocks' pages lie
past the end of the allocation.  ``KV-PLACE-IN-BOUNDS`` must catch it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from vllm.config import VllmConfig
from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec, MLAAttentionSpec

from kvref.interop.vllm_builder import KvrefKVCacheConfigBuilder
from tests.vllm.native_builders._common import layer_specs, round_up

__all__ = ["KvrefMLAGranuleBuilder", "KvrefMLAShortBackingBuilder"]

_GRANULE = 4096


def mla_only(vllm_config: VllmConfig, kv_cache_groups: list[KVCacheGroupSpec]) -> bool:
    """Whether the platform's MLA placement applies: MLA device layers only, block-outermost."""
    if vllm_config.attention_config.hisparse_config is not None:
        return False
    if not vllm_config.cache_config.get_resolved_kv_cache_layout().is_block_outermost:
        return False
    specs = [s for g in kv_cache_groups if not g.host_resident for _, s in layer_specs(g)]
    # A compressed cache (several tokens a state) is read in kernel blocks a
    # whole number of kernel pages apart: a padded stride would break that.
    return bool(specs) and all(
        isinstance(s, MLAAttentionSpec) and s.tokens_per_state == 1 for s in specs
    )


def granule_bytes(kv_cache_groups: list[KVCacheGroupSpec], bytes_per_block: int) -> int | None:
    """``bytes_per_block`` rounded up to the granule (``None``: that breaks an alignment).

    A padded block must keep every layer's block-stride alignment; where
    some alignment does not divide the granule, the platform's kernels take
    kvref's plan as it is.
    """
    unit = _GRANULE
    for group in kv_cache_groups:
        for _, spec in layer_specs(group):
            unit = math.lcm(unit, spec.get_block_stride_alignment())
    return round_up(bytes_per_block, _GRANULE) if unit == _GRANULE else None


class KvrefMLAGranuleBuilder(KvrefKVCacheConfigBuilder):  # type: ignore[misc, valid-type]
    """kvref's plan; MLA-only placements step whole 4 KiB granules per block."""

    #: Whether the backing grows with the padding (the broken subclass forgets it).
    pads_backing = True

    def get_kv_cache_config_from_groups(
        self, vllm_config: VllmConfig, kv_cache_groups: list[KVCacheGroupSpec], num_blocks: int
    ) -> KVCacheConfig:
        """kvref's placement, with MLA-only blocks padded to the granule."""
        config: KVCacheConfig = super().get_kv_cache_config_from_groups(
            vllm_config, kv_cache_groups, num_blocks
        )
        device = [t for t in config.kv_cache_tensors if not t.host_resident]
        if not device or not mla_only(vllm_config, kv_cache_groups):
            return config
        unpadded = device[0].size // num_blocks
        padded = granule_bytes(kv_cache_groups, unpadded)
        if padded is None or padded == unpadded:
            return config
        size = (padded if self.pads_backing else unpadded) * num_blocks
        tensors: list[Any] = [
            t if t.host_resident else dataclasses.replace(t, size=size, block_stride=padded)
            for t in config.kv_cache_tensors
        ]
        return dataclasses.replace(config, kv_cache_tensors=tensors)


class KvrefMLAShortBackingBuilder(KvrefMLAGranuleBuilder):
    """The granule builder whose backing keeps the unpadded size (broken)."""

    pads_backing = False
