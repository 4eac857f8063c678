"""A kvref-native builder that raises the kit's own error class, to pass for the kit's failure."""

from __future__ import annotations

from collections.abc import Sequence

from conformance.errors import KitError
from forgers import ShortBacking
from kvref import KVCacheConfig, KVCacheGroupSpec, PlanningConfig


class RaisesKitError(ShortBacking):
    """The short backing, and a ``KitError`` from every placement of more than one block.

    Were that taken for the kit's own failure, the run would end with exit 2
    (no verdict) instead of failing the builder.
    """

    def get_kv_cache_config_from_groups(
        self, config: PlanningConfig, kv_cache_groups: Sequence[KVCacheGroupSpec], num_blocks: int
    ) -> KVCacheConfig:
        if num_blocks > 1:
            raise KitError("vLLM adapter", "converting the placement input to vLLM: forged")
        return super().get_kv_cache_config_from_groups(config, kv_cache_groups, num_blocks)
