"""A builder whose gate the built-in families never open: its helper module is never entered."""

from __future__ import annotations

from collections.abc import Mapping

from kvref import KVCacheGroupSpec, PlanningConfig
from kvref.specs import KVCacheSpec
from reach_pkg.helper import acme_page
from reach_pkg.kv import MARKER, AcmeBuilder


class GatedBuilder(AcmeBuilder):
    """Checks the fused page of the vendor's mixers first; the parent's grouping otherwise."""

    def get_kv_cache_groups(
        self, config: PlanningConfig, kv_cache_spec: Mapping[str, KVCacheSpec]
    ) -> list[KVCacheGroupSpec]:
        mixers = [s.page_size_bytes for n, s in kv_cache_spec.items() if MARKER in n]
        if mixers and acme_page(mixers) > 2**30:
            raise ValueError("Acme tuples over 1 GiB are not served")
        return super().get_kv_cache_groups(config, kv_cache_spec)
