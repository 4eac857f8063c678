"""Tiny purpose-built builders for the verdict, report and CLI tests.

Unlike ``broken_builders`` these do not break one promise each: they make
the kit's *front ends* meet a situation (nothing judgeable, a colourful
error, a slow run to interrupt) and the tests check what the kit says.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from kvref import KVCacheConfig, KVCacheGroupSpec, PlanningConfig, ReferenceKVCacheConfigBuilder
from kvref.specs import KVCacheSpec


class PlacementAlwaysRaises(ReferenceKVCacheConfigBuilder):
    """Groups like the reference, but placement raises on every input.

    No placement invariant can be judged on any example: every one must be
    INCONCLUSIVE (or FAIL), never PASS.
    """

    def get_kv_cache_config_from_groups(
        self, config: PlanningConfig, kv_cache_groups: Sequence[KVCacheGroupSpec], num_blocks: int
    ) -> KVCacheConfig:
        raise RuntimeError("placement is not implemented yet")


class ColourfulError(ReferenceKVCacheConfigBuilder):
    """Grouping raises with ANSI colours, a NUL and other control characters in the message."""

    MESSAGE = "\x1b[31mboom\x1b[0m \x00nul \x07bell \x1b]0;title\x07 \ud800 tail"

    def get_kv_cache_groups(
        self, config: PlanningConfig, kv_cache_spec: Mapping[str, KVCacheSpec]
    ) -> list[KVCacheGroupSpec]:
        raise RuntimeError(self.MESSAGE)


class Slow(ReferenceKVCacheConfigBuilder):
    """The reference, a quarter second slower per grouping call (a run to interrupt)."""

    def get_kv_cache_groups(
        self, config: PlanningConfig, kv_cache_spec: Mapping[str, KVCacheSpec]
    ) -> list[KVCacheGroupSpec]:
        time.sleep(0.25)
        return super().get_kv_cache_groups(config, kv_cache_spec)


class GroupingRaisesOnHiSparse(ReferenceKVCacheConfigBuilder):
    """Groups like the reference, but raises on every example that turns HiSparse on.

    The HiSparse invariants do not apply to the other examples, and this
    builder's own failures leave every example they apply to unjudged: they
    must be INCONCLUSIVE, never NOT APPLICABLE.
    """

    def get_kv_cache_groups(
        self, config: PlanningConfig, kv_cache_spec: Mapping[str, KVCacheSpec]
    ) -> list[KVCacheGroupSpec]:
        if config.hisparse is not None:
            raise RuntimeError("HiSparse is not supported yet")
        return super().get_kv_cache_groups(config, kv_cache_spec)
