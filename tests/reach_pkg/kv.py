"""A builder that specialises on a shape the kit's built-in families never produce."""

from __future__ import annotations

from collections.abc import Mapping

from kvref import KVCacheGroupSpec, PlanningConfig, ReferenceKVCacheConfigBuilder
from kvref.specs import KVCacheSpec

#: A layer-name marker only this vendor's own models carry.
MARKER = ".acme_mixer."


class AcmeBuilder(ReferenceKVCacheConfigBuilder):
    """Groups the vendor's own mixer layers itself; everything else is the reference's."""

    def get_kv_cache_groups(
        self, config: PlanningConfig, kv_cache_spec: Mapping[str, KVCacheSpec]
    ) -> list[KVCacheGroupSpec]:
        if any(MARKER in name for name in kv_cache_spec):
            return self._acme_groups(config, kv_cache_spec)
        return super().get_kv_cache_groups(config, kv_cache_spec)

    def _acme_groups(
        self, config: PlanningConfig, kv_cache_spec: Mapping[str, KVCacheSpec]
    ) -> list[KVCacheGroupSpec]:
        mixers = {n: s for n, s in kv_cache_spec.items() if MARKER in n}
        others = {n: s for n, s in kv_cache_spec.items() if MARKER not in n}
        groups = super().get_kv_cache_groups(config, others) if others else []
        groups += super().get_kv_cache_groups(config, mixers)
        return groups
