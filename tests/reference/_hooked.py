"""Throwaway builders for the reference tests: the reference with one hook or both replaced.

A test that needs a builder which drops a layer, returns garbage or records
its calls passes the replacement hooks to :func:`hooked` instead of writing
out a subclass with both hooks' signatures.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from kvref import PlanningConfig, ReferenceKVCacheConfigBuilder
from kvref.records import KVCacheConfig, KVCacheGroupSpec
from kvref.specs import KVCacheSpec

#: Replaces ``get_kv_cache_groups``; gets the builder first, to ask the reference's own answer.
GroupsHook = Callable[
    [ReferenceKVCacheConfigBuilder, PlanningConfig, Mapping[str, KVCacheSpec]],
    list[KVCacheGroupSpec],
]
#: Replaces ``get_kv_cache_config_from_groups``; gets the builder first, as :data:`GroupsHook`.
PlaceHook = Callable[
    [ReferenceKVCacheConfigBuilder, PlanningConfig, Sequence[KVCacheGroupSpec], int],
    KVCacheConfig,
]


def hooked(
    groups: GroupsHook | None = None, place: PlaceHook | None = None
) -> type[ReferenceKVCacheConfigBuilder]:
    """A subclass of the reference whose hooks are ``groups`` and ``place``, where given.

    A hook not given is the reference's.  The reference's own answer is
    ``ReferenceKVCacheConfigBuilder.get_kv_cache_groups(builder, ...)`` inside a hook.
    """

    class Hooked(ReferenceKVCacheConfigBuilder):
        def get_kv_cache_groups(
            self, config: PlanningConfig, kv_cache_spec: Mapping[str, KVCacheSpec]
        ) -> list[KVCacheGroupSpec]:
            if groups is None:
                return super().get_kv_cache_groups(config, kv_cache_spec)
            return groups(self, config, kv_cache_spec)

        def get_kv_cache_config_from_groups(
            self,
            config: PlanningConfig,
            kv_cache_groups: Sequence[KVCacheGroupSpec],
            num_blocks: int,
        ) -> KVCacheConfig:
            if place is None:
                return super().get_kv_cache_config_from_groups(config, kv_cache_groups, num_blocks)
            return place(self, config, kv_cache_groups, num_blocks)

    return Hooked
