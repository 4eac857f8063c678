"""A legal builder that notes which process answered each placement (test_plugin_xdist.py)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Sequence
from pathlib import Path

from kvref import KVCacheConfig, KVCacheGroupSpec, PlanningConfig, ReferenceKVCacheConfigBuilder

#: This process's mark: a PID alone no longer tells processes apart, since each
#: builder worker may run in a PID namespace of its own (where it is PID 2).
_PROCESS = uuid.uuid4().hex


class NotesItsProcess(ReferenceKVCacheConfigBuilder):
    """The reference, appending its process's mark to ``$KVREF_TEST_CALLS`` at each placement."""

    def get_kv_cache_config_from_groups(
        self, config: PlanningConfig, kv_cache_groups: Sequence[KVCacheGroupSpec], num_blocks: int
    ) -> KVCacheConfig:
        with Path(os.environ["KVREF_TEST_CALLS"]).open("a", encoding="ascii") as log:
            log.write(f"{_PROCESS}\n")
        return super().get_kv_cache_config_from_groups(config, kv_cache_groups, num_blocks)
