"""vLLM-native builders that write the ``VllmConfig`` they are handed (hook purity).

vLLM's Core keeps one ``VllmConfig`` across every call of its flow and
itself moves ``max_model_len`` (auto-fit) and ``num_gpu_blocks_override``
(the one-block probe) between calls; a hook that writes either plans the
next call wrong.  The kit never sees the native config, so its vLLM adapter
compares it before and after each hook: KV-GROUP-INPUT-UNCHANGED and
KV-PLACE-INPUT-UNCHANGED must name the field.
"""

from __future__ import annotations

from typing import Any

from vllm.v1.core.kv_cache_planning import DefaultKVCacheConfigBuilder
from vllm.v1.kv_cache_interface import AttentionSpec


class ShrinksModelLen(DefaultKVCacheConfigBuilder):
    """Halves ``model_config.max_model_len`` before grouping as vLLM does."""

    def get_kv_cache_groups(self, vllm_config: Any, kv_cache_spec: dict[str, Any]) -> list[Any]:
        model = vllm_config.model_config
        model.max_model_len = max(1, model.max_model_len // 2)
        return super().get_kv_cache_groups(vllm_config, kv_cache_spec)  # type: ignore[no-any-return]


class PinsBlockOverride(DefaultKVCacheConfigBuilder):
    """Keeps the block count it was asked for in ``cache_config.num_gpu_blocks_override``."""

    def get_kv_cache_config_from_groups(
        self, vllm_config: Any, kv_cache_groups: list[Any], num_blocks: int
    ) -> Any:
        vllm_config.cache_config.num_gpu_blocks_override = num_blocks
        return super().get_kv_cache_config_from_groups(vllm_config, kv_cache_groups, num_blocks)


class PinsOverrideInPoolBytes(DefaultKVCacheConfigBuilder):
    """Sets ``cache_config.num_gpu_blocks_override`` while it answers the pool-bytes hook.

    The hook answers "let Core probe" (``None``), as vLLM's default does; the
    write is its only fault.
    """

    def _get_pool_bytes_per_block(self, vllm_config: Any, kv_cache_groups: list[Any]) -> Any:
        vllm_config.cache_config.num_gpu_blocks_override = 1
        return None


class _Unreadable:
    """An object whose state cannot be read or pickled (a hostile builder's plant)."""

    def __getattribute__(self, name: str) -> Any:
        if name in ("__class__",):
            return object.__getattribute__(self, name)
        raise RuntimeError(f"no {name} here")

    def __reduce_ex__(self, protocol: Any) -> Any:
        raise RuntimeError("not pickled either")


class LeavesUnreadable(DefaultKVCacheConfigBuilder):
    """Replaces ``model_config.hf_config`` with an object no one can read, after grouping.

    The kit's comparison fails to read it: that is the hook's write, judged
    as such, never a kit error.
    """

    def get_kv_cache_groups(self, vllm_config: Any, kv_cache_spec: dict[str, Any]) -> list[Any]:
        groups = super().get_kv_cache_groups(vllm_config, kv_cache_spec)
        vars(vllm_config.model_config)["hf_config"] = _Unreadable()
        return groups  # type: ignore[no-any-return]


class AlignsEngineBlockSize(DefaultKVCacheConfigBuilder):
    """Sets ``cache_config.block_size`` to the model's attention block size before grouping.

    A platform whose kernels take the model's block size "aligns" the engine
    to it (a field report: the scheduler then sized the pool with the wrong
    block and declared a false OOM).  Gated on a model whose attention block
    differs from the engine's; ``super()`` elsewhere.
    """

    def get_kv_cache_groups(self, vllm_config: Any, kv_cache_spec: dict[str, Any]) -> list[Any]:
        cache = vllm_config.cache_config
        blocks = {s.block_size for s in kv_cache_spec.values() if isinstance(s, AttentionSpec)}
        if len(blocks) == 1 and cache.block_size not in blocks:
            cache.block_size = blocks.pop()
        return super().get_kv_cache_groups(vllm_config, kv_cache_spec)  # type: ignore[no-any-return]


class RaisesBatchedTokens(DefaultKVCacheConfigBuilder):
    """Raises ``scheduler_config.max_num_batched_tokens`` by a block while placing."""

    def get_kv_cache_config_from_groups(
        self, vllm_config: Any, kv_cache_groups: list[Any], num_blocks: int
    ) -> Any:
        scheduler = vllm_config.scheduler_config
        scheduler.max_num_batched_tokens += vllm_config.cache_config.block_size
        return super().get_kv_cache_config_from_groups(vllm_config, kv_cache_groups, num_blocks)
