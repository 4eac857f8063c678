"""A builder vLLM's own planning tests must catch (tests/vllm/test_vllm_upstream.py, slow tier).

Loaded by qualname in the pytest subprocess that runs vLLM's tests.
"""

from __future__ import annotations

from typing import Any

from kvref.interop.vllm_builder import KvrefKVCacheConfigBuilder


class ReversedGroupsBuilder(KvrefKVCacheConfigBuilder):  # type: ignore[misc]
    """kvref's builder with its groups handed to vLLM in reverse order (group ids move)."""

    def get_kv_cache_groups(self, vllm_config: Any, kv_cache_spec: dict[str, Any]) -> list[Any]:
        """kvref's grouping, last group first."""
        return list(reversed(super().get_kv_cache_groups(vllm_config, kv_cache_spec)))
