"""A builder whose own code is its placement hook only: grouping never runs it."""

from __future__ import annotations

from collections.abc import Sequence

from kvref import KVCacheConfig, KVCacheGroupSpec, PlanningConfig, ReferenceKVCacheConfigBuilder


class PlacementOnlyBuilder(ReferenceKVCacheConfigBuilder):
    """The reference, with a placement hook of its own that changes nothing."""

    def get_kv_cache_config_from_groups(
        self, config: PlanningConfig, kv_cache_groups: Sequence[KVCacheGroupSpec], num_blocks: int
    ) -> KVCacheConfig:
        return super().get_kv_cache_config_from_groups(config, kv_cache_groups, num_blocks)
