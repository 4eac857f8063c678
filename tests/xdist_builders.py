"""A legal builder that notes which process answered each placement (test_plugin_xdist.py)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from kvref import KVCacheConfig, KVCacheGroupSpec, PlanningConfig, ReferenceKVCacheConfigBuilder


class NotesItsProcess(ReferenceKVCacheConfigBuilder):
    """The reference, appending its process id to ``$KVREF_TEST_CALLS`` at each placement."""

    def get_kv_cache_config_from_groups(
        self, config: PlanningConfig, kv_cache_groups: Sequence[KVCacheGroupSpec], num_blocks: int
    ) -> KVCacheConfig:
        with Path(os.environ["KVREF_TEST_CALLS"]).open("a", encoding="ascii") as log:
            log.write(f"{os.getpid()}\n")
        return super().get_kv_cache_config_from_groups(config, kv_cache_groups, num_blocks)
