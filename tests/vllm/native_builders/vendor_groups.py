"""A vLLM-native builder whose grouping answers with the vendor's own spec class (legal).

A vendor may subclass vLLM's spec classes; vLLM plans a subclass whose page
is its base's exactly as the base.  The kit carries the class to its own
process by name only and back to the builder's worker as the vendor's
class, so vLLM's Core in the kit plans it, and the builder's later hooks
see their own class.  Before, the kit stopped with an internal error.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from vllm.v1.core.kv_cache_planning import DefaultKVCacheConfigBuilder
from vllm.v1.kv_cache_interface import FullAttentionSpec


@dataclasses.dataclass(frozen=True, kw_only=True)
class AcmeFullSpec(FullAttentionSpec):
    """The vendor's full-attention class: vLLM's page, the vendor's name."""


class AcmeTypedGroupsBuilder(DefaultKVCacheConfigBuilder):
    """vLLM's grouping, each full-attention group spec re-typed as :class:`AcmeFullSpec`."""

    def get_kv_cache_groups(self, vllm_config: Any, kv_cache_spec: dict[str, Any]) -> list[Any]:
        groups = super().get_kv_cache_groups(vllm_config, kv_cache_spec)
        for group in groups:
            spec = group.kv_cache_spec
            if type(spec) is FullAttentionSpec:
                values = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec) if f.init}
                group.kv_cache_spec = AcmeFullSpec(**values)
        return groups  # type: ignore[no-any-return]
