"""The DeepSeek-V3.2 tuple builder with a planted bug in ``_get_pool_bytes_per_block``.

Meant invariant: ``KV-PLACE-POOL-BYTES`` (contract.md#pool-bytes-hook: when
the hook answers, the answer equals the device bytes one block takes).

The placement rounds every block up to the platform's 4 KiB DMA granule,
but the hook answers the tuples' own bytes, before the rounding (it was
written when the granule was 1).  Core then sizes the pool with a block
smaller than the one the placement allocates, so it plans more blocks than
memory holds (``KV-CORE-MEMORY`` sees that consequence in the Core flow).
A DeepSeek-V3.2 block is a multiple of 4 KiB only by accident, so every
V3.2 model in a block-outermost layout the kit draws reaches the bug; for
every other model the hook returns ``None`` as the correct builder does.
"""

from __future__ import annotations

from vllm.config import VllmConfig
from vllm.v1.kv_cache_interface import KVCacheGroupSpec

from tests.vllm.native_builders.deepseek_v32 import DeepSeekV32TupleBuilder

__all__ = ["DeepSeekV32PoolBytesBugBuilder"]


class DeepSeekV32PoolBytesBugBuilder(DeepSeekV32TupleBuilder):
    """:class:`DeepSeekV32TupleBuilder` whose pool-bytes answer forgets the granule."""

    def _get_pool_bytes_per_block(
        self, vllm_config: VllmConfig, kv_cache_groups: list[KVCacheGroupSpec]
    ) -> int | None:
        plan = self._slot_plan(vllm_config, kv_cache_groups)
        if plan is None:
            return None
        # The bug: the farthest page end, not the granule-rounded block placed.
        return max(plan.offsets[n] + plan.pages[n] for n in plan.offsets)
