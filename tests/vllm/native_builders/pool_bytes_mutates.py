"""A pool-bytes answer that compacts the caller's group list in place (broken).

:class:`CompactsGroupsBuilder` answers ``_get_pool_bytes_per_block`` with
vLLM's own figure, but first drops, in place, the groups a pipeline stage
holds no layer of.  vLLM's Core hands that same list on to placement and to
the KV cache manager, so the stage's config has fewer groups than the global
grouping and group IDs no longer match across workers
(contract.md#hook-purity: a hook leaves the groups it is given unchanged).
``KV-PLACE-INPUT-UNCHANGED`` must catch it.
"""

from __future__ import annotations

from vllm.config import VllmConfig
from vllm.v1.core.kv_cache_planning import DefaultKVCacheConfigBuilder
from vllm.v1.kv_cache_interface import KVCacheGroupSpec

__all__ = ["CompactsGroupsBuilder"]


class CompactsGroupsBuilder(DefaultKVCacheConfigBuilder):
    """vLLM's pool-bytes answer, after dropping the caller's empty groups in place."""

    def _get_pool_bytes_per_block(
        self, vllm_config: VllmConfig, kv_cache_groups: list[KVCacheGroupSpec]
    ) -> int | None:
        """``super()``'s answer; the list it was given loses its empty groups."""
        kv_cache_groups[:] = [g for g in kv_cache_groups if g.layer_names]
        return super()._get_pool_bytes_per_block(vllm_config, kv_cache_groups)
