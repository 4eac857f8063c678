"""A platform whose copy engine moves whole 4 KiB granules: every block's device bytes padded.

:class:`Padded4KiBBuilder` (legal) keeps vLLM's grouping and placement and
rounds the bytes of one block ID up to a 4 KiB boundary, then up to the
common block-stride alignment of the device layers, so that
block-outermost tensors may step the padded block.  Pages and layer-outer
strides stay where vLLM put them: only the backing grows
(contract.md#placement-backing: the backing may exceed the pages, within the size
bound; contract.md#pool-bytes-hook: Core probes a one-block placement, so
the padding is budgeted).  HiSparse is left to vLLM: there Core budgets
the pure bytes per block without probing, so a padded backing would take
memory Core never admitted.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import ClassVar

from vllm.config import VllmConfig
from vllm.v1.core.kv_cache_planning import DefaultKVCacheConfigBuilder
from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec

from tests.vllm.native_builders._common import layer_specs, round_up

__all__ = ["Padded4KiBBuilder"]

_GRANULE = 4096


class Padded4KiBBuilder(DefaultKVCacheConfigBuilder):
    """vLLM's plan with each block's device bytes padded to the copy engine's granule."""

    #: vLLM 0.34.0's worker drops a layer-outer backing's bytes after the last
    #: layer region, so Core's one-block probe (padding included) plans the
    #: capacity with more bytes per block than the worker's segments take
    #: (tests/vllm/test_worker_accept_native.py).
    #: In a layout neither block-compact nor block-outermost (LHBNC) that worker
    #: cuts the backing into segments of ``num_blocks x block_stride`` and
    #: refuses a backing that is not a whole number of them
    #: (``ExtensibleKVCache._segments``, vllm/v1/worker/extensible_kv_cache.py):
    #: the padded backing is not, wherever the padded block is not a multiple
    #: of the page (seen at seed 1: 15 MLA pages of 1,152 B, 17,280 B padded
    #: to 20,480 B a block).
    WORKER_REFUSED: ClassVar[Mapping[str, frozenset[str]]] = {
        "0.34.0": frozenset({"KV-WORKER-POOL-BYTES", "KV-WORKER-BLOCK-SEGMENTS"})
    }

    def get_kv_cache_config_from_groups(
        self, vllm_config: VllmConfig, kv_cache_groups: list[KVCacheGroupSpec], num_blocks: int
    ) -> KVCacheConfig:
        """vLLM's placement on a backing of ``padded bytes per block x num_blocks``."""
        config = super().get_kv_cache_config_from_groups(vllm_config, kv_cache_groups, num_blocks)
        device = [t for t in config.kv_cache_tensors if not t.host_resident]
        if not device or vllm_config.attention_config.hisparse_config is not None:
            return config
        padded = round_up(device[0].size // num_blocks, _GRANULE)
        outermost = vllm_config.cache_config.get_resolved_kv_cache_layout().is_block_outermost
        if outermost:
            # A block-outermost tensor steps the whole padded block, which must keep
            # every device layer's block-stride alignment.
            unit = 1
            for group in kv_cache_groups:
                for _, spec in layer_specs(group):
                    unit = math.lcm(unit, spec.get_block_stride_alignment())
            padded = round_up(padded, unit)
        tensors = [
            t
            if t.host_resident
            else dataclasses.replace(
                t, size=padded * num_blocks, block_stride=padded if outermost else t.block_stride
            )
            for t in config.kv_cache_tensors
        ]
        return dataclasses.replace(config, kv_cache_tensors=tensors)
