"""Core's second sizing step under vLLM 0.34.0's extensible KV cache (contract.md#core-flow).

With the extensible KV cache Core first plans a *capacity* of ``N`` blocks
(:func:`kvref.plan_kv_cache`, unchanged).  After warmup every rank measures
how many blocks its free memory holds; Core takes the smallest count ``N'``
(never above ``N``), fits ``max_model_len`` again when it was auto-fitted,
and lowers every config to ``N'`` in place of planning again: the builder is
not asked for a new placement, only (through the pool-bytes probe) for its
bytes per block.  vLLM's ``finalize_extensible_kv_cache`` and
``shrink_kv_cache_configs`` (``v1/core/kv_cache_planning.py``) do this; vLLM
0.33.0 has neither, and these functions refuse a config planned as it.

The shrunk configs keep the capacity's offsets and strides: only each
device tensor's ``size`` becomes ``N' * size // N`` (host tensors keep
theirs), so a layer-outer config no longer describes a self-consistent
placement (its later layers start past the shrunk size).  The worker keeps
addressing the reservation; the sizes say how much of it is committed.

One deliberate difference: when the admission re-check refuses ``N'``, vLLM
has already scaled the tensors of the config it refuses (its records are
mutable) but not lowered its ``num_blocks``; kvref's records are frozen, so
it returns new configs and, on refusal, raises with every input unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from kvref.builder import KVCacheConfigBuilder
from kvref.config import PlanningConfig
from kvref.errors import ConfigError, InsufficientMemoryError, UnsupportedError
from kvref.planning import (
    BuilderLike,
    _estimate_max_model_len,
    _insufficient,
    fresh_builder,
    max_memory_usage_bytes_from_groups,
    pool_bytes_per_block_from_builder,
)
from kvref.records import KVCacheConfig

__all__ = ["FinalizedKVCache", "finalize_extensible_kv_cache", "shrink_kv_cache_configs"]


@attrs.frozen(kw_only=True)
class FinalizedKVCache:
    """What Core settles after warmup: the lowered configs, block count and length.

    Attributes:
        configs: every worker's config at ``num_blocks``.
        num_blocks: ``N'``, the smallest measured count (at most the capacity).
        max_model_len: the length served (fitted again when auto-fitting).
    """

    configs: tuple[KVCacheConfig, ...]
    num_blocks: int
    max_model_len: int


def _require_extensible(config: PlanningConfig) -> None:
    if not config.rules.extensible_kv_cache:
        raise UnsupportedError(
            f"PlanningConfig.vllm_version={config.vllm_version}: vLLM {config.vllm_version} "
            "has no extensible KV cache (Core plans the final block count at once); "
            "plan as vLLM 0.34.0 or later"
        )


def _check_admission(
    builder: KVCacheConfigBuilder, config: PlanningConfig, config_at: KVCacheConfig, blocks: int
) -> None:
    """Core's admission check at ``blocks`` blocks, the null block held back."""
    groups = list(config_at.kv_cache_groups)
    bpb = pool_bytes_per_block_from_builder(builder, config, groups)
    available = (blocks - 1) * bpb
    needed = max_memory_usage_bytes_from_groups(config, groups, bpb)
    if available <= 0:
        raise InsufficientMemoryError(
            f"no available memory for the cache blocks after warmup: {blocks} block(s) of "
            f"{bpb} bytes leave nothing beside the null block",
            max_model_len=config.max_model_len,
            needed_bytes=needed,
            available_bytes=0,
            estimated_max_model_len=0,
        )
    if needed > available:
        estimated = _estimate_max_model_len(builder, config, groups, bpb, available)
        raise _insufficient(config, needed, available, estimated)


def shrink_kv_cache_configs(
    config: PlanningConfig,
    configs: Sequence[KVCacheConfig],
    num_blocks: int,
    builder: BuilderLike = None,
) -> list[KVCacheConfig]:
    """``configs`` lowered to ``num_blocks`` blocks (vLLM 0.34.0 ``shrink_kv_cache_configs``).

    Each device tensor's ``size`` becomes ``num_blocks * size // config.num_blocks``;
    host tensors, offsets and strides are unchanged.  A config with groups is
    admitted again: ``(num_blocks - 1)`` times the builder's pool bytes per block
    must hold one request at ``config.max_model_len``.

    Args:
        config: the planning config (at the length served).
        configs: the capacity's configs (one per worker; not modified).
        num_blocks: ``N'``, at most every config's ``num_blocks``.
        builder: whose pool bytes per block the re-check uses (an instance, a
            class, or ``None`` for the builder ``config`` selects).

    Raises:
        UnsupportedError: ``config`` plans as vLLM 0.33.0 (no extensible KV cache).
        ConfigError: ``num_blocks`` is not an int in ``[0, N]`` for some config.
        InsufficientMemoryError: one request no longer fits on some worker (the
            inputs are unchanged; vLLM leaves that config's tensors scaled).
    """
    _require_extensible(config)
    if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 0:
        raise ConfigError(f"num_blocks={num_blocks!r} must be an int >= 0")
    chosen = fresh_builder(builder, config)
    shrunk = []
    for index, placed in enumerate(configs):
        if num_blocks > placed.num_blocks:
            raise ConfigError(
                f"num_blocks={num_blocks} is above config {index}'s capacity of "
                f"{placed.num_blocks} blocks: the extensible KV cache only shrinks"
            )
        tensors = [
            t if t.host_resident else attrs.evolve(t, size=num_blocks * t.size // placed.num_blocks)
            for t in placed.kv_cache_tensors
        ]
        if placed.kv_cache_groups:
            _check_admission(chosen, config, placed, num_blocks)
        shrunk.append(attrs.evolve(placed, kv_cache_tensors=tensors, num_blocks=num_blocks))
    return shrunk


def _refit(
    builder: KVCacheConfigBuilder,
    config: PlanningConfig,
    configs: Sequence[KVCacheConfig],
    num_blocks: int,
) -> PlanningConfig:
    """``config`` with the longest length every worker's measured memory serves."""
    fitted = config.max_model_len
    worst = 0
    for index, placed in enumerate(configs):
        groups = list(placed.kv_cache_groups)
        if not groups:
            continue
        bpb = pool_bytes_per_block_from_builder(builder, config, groups)
        available = (num_blocks - 1) * bpb
        length = _estimate_max_model_len(builder, config, groups, bpb, available)
        if length < fitted:
            fitted, worst = length, index
    if fitted <= 0:
        raise InsufficientMemoryError(
            f"cannot auto-fit max_model_len after warmup: not even one token fits in "
            f"{num_blocks} block(s) on worker {worst}",
            max_model_len=1,
            needed_bytes=0,
            available_bytes=0,
            estimated_max_model_len=0,
        )
    return config.with_max_model_len(fitted)


def finalize_extensible_kv_cache(
    config: PlanningConfig,
    configs: Sequence[KVCacheConfig],
    measured_num_blocks: Sequence[int | None],
    builder: BuilderLike = None,
) -> FinalizedKVCache:
    """Settle the block count from the ranks' measurements (vLLM 0.34.0).

    ``N' = min(measured, N)``, where ``N`` is the capacity (the smallest
    ``num_blocks`` of ``configs``) and ranks that measured nothing (``None``)
    are left out; with no measurement ``N`` stays.  When
    ``config.auto_fit_max_model_len`` the length is fitted again to ``(N' - 1)``
    pool blocks per worker; then every config is shrunk to ``N'``
    (:func:`shrink_kv_cache_configs`).

    Args:
        config: the planning config, at the length the capacity was planned for
            (``config.with_max_model_len(plan.max_model_len)``).
        configs: the capacity's configs, one per worker.
        measured_num_blocks: each rank's measured block count.
        builder: as for :func:`shrink_kv_cache_configs`.

    Raises:
        UnsupportedError: ``config`` plans as vLLM 0.33.0.
        ConfigError: no config, or a measured count that is not an int >= 0.
        InsufficientMemoryError: the re-fit finds no length, or the re-check fails.
    """
    _require_extensible(config)
    if not configs:
        raise ConfigError("configs=[] has no worker")
    for index, value in enumerate(measured_num_blocks):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 0
        ):
            raise ConfigError(f"measured_num_blocks[{index}]={value!r} must be an int >= 0 or None")
    capacity = min(c.num_blocks for c in configs)
    num_blocks = min((m for m in measured_num_blocks if m is not None), default=capacity)
    num_blocks = min(num_blocks, capacity)
    chosen = fresh_builder(builder, config)
    if config.auto_fit_max_model_len:
        config = _refit(chosen, config, configs, num_blocks)
    shrunk = shrink_kv_cache_configs(config, configs, num_blocks, chosen)
    return FinalizedKVCache(
        configs=tuple(shrunk), num_blocks=num_blocks, max_model_len=config.max_model_len
    )
