"""A vLLM-native builder that breaks vLLM's "a fresh instance per call" (KV-CALL-FRESH)."""

from __future__ import annotations

from typing import Any

from vllm.v1.core.kv_cache_planning import DefaultKVCacheConfigBuilder


class SingletonBuilder(DefaultKVCacheConfigBuilder):
    """Hands out one shared instance, so resolution never gives a fresh one.

    vLLM resolves the platform's builder afresh for every engine, because
    builders are stateless; a vendor that caches its builder breaks engines
    with different configs in one process.  KV-CALL-FRESH must catch it.
    """

    _shared: SingletonBuilder | None = None

    def __new__(cls, *args: Any, **kwargs: Any) -> SingletonBuilder:
        if cls._shared is None:
            cls._shared = super().__new__(cls)
        return cls._shared
