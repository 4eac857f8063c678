"""The builder interface (contract.md#the-builder-interface) and the reference builder.

``KVCacheConfigBuilder`` mirrors vLLM's experimental interface (the same in 0.33.0 and 0.34.0) with
:class:`~kvref.config.PlanningConfig` in place of ``VllmConfig``.  Core (see
:mod:`kvref.planning`) creates a fresh builder for every phase, so builders
must be stateless and deterministic.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence

from kvref.config import PlanningConfig, SupportsKVCacheGrouping
from kvref.errors import ConfigError, GroupingError
from kvref.grouping import get_kv_cache_groups
from kvref.partition import check_exact_partition, check_wrapped_layers
from kvref.placement import get_kv_cache_config_from_groups
from kvref.records import KVCacheConfig, KVCacheGroupSpec
from kvref.specs import KVCacheSpec

__all__ = ["KVCacheConfigBuilder", "ReferenceKVCacheConfigBuilder"]


class KVCacheConfigBuilder(ABC):
    """Splits layers into KV cache groups and places them for an exact block count.

    Contract (contract.md#the-builder-interface): groups partition the input layers; placement
    returns exactly ``num_blocks`` blocks with one device backing of ``bytes_per_block *
    num_blocks`` bytes, memory-safe pages, and the groups echoed unchanged; both hooks are pure
    functions of their arguments.
    """

    @abstractmethod
    def get_kv_cache_groups(
        self, config: PlanningConfig, kv_cache_spec: Mapping[str, KVCacheSpec]
    ) -> list[KVCacheGroupSpec]:
        """Split ``kv_cache_spec`` (layer name to spec) into groups."""

    @abstractmethod
    def get_kv_cache_config_from_groups(
        self,
        config: PlanningConfig,
        kv_cache_groups: Sequence[KVCacheGroupSpec],
        num_blocks: int,
    ) -> KVCacheConfig:
        """Place ``kv_cache_groups`` into tensors for exactly ``num_blocks`` blocks."""

    def _get_pool_bytes_per_block(
        self, config: PlanningConfig, kv_cache_groups: Sequence[KVCacheGroupSpec]
    ) -> int | None:
        """Device bytes one block ID takes across all allocations; ``None``: Core probes."""
        return None


class ReferenceKVCacheConfigBuilder(KVCacheConfigBuilder):
    """The default grouping and placement of ``config.vllm_version``, with the contract's fixes.

    See contract.md#deliberate-differences.

    Usable as a platform's fallback builder.  It never reads
    ``num_gpu_blocks_override``: placement returns exactly the blocks asked for.
    """

    def get_kv_cache_groups(
        self, config: PlanningConfig, kv_cache_spec: Mapping[str, KVCacheSpec]
    ) -> list[KVCacheGroupSpec]:
        """The model's declared grouping if it has one, else the default grouping.

        A model-declared grouping (``config.model_kv_cache_grouping``, vLLM's
        ``SupportsKVCacheGrouping``) gets a copy of the specs and its result
        must partition the layers, as Core checks; the caller's mapping is
        never mutated.

        Raises:
            ConfigError: a model-declared grouping is combined with HiSparse,
                which owns its own grouping (vLLM: ``ValueError``).
            PartitionError: the declared groups do not partition the layers.
            GroupingError: the declared grouping returned something that is not
                a list of groups; or the default grouping fails (see
                :func:`kvref.grouping.get_kv_cache_groups`).
        """
        hook = config.model_kv_cache_grouping
        if hook is None:
            return get_kv_cache_groups(config, kv_cache_spec)
        if config.hisparse is not None:
            raise ConfigError(
                f"PlanningConfig.model_kv_cache_grouping={hook!r} cannot be combined with "
                "HiSparse (PlanningConfig.hisparse), which owns its own KV cache grouping; "
                "remove one of them"
            )
        specs = dict(kv_cache_spec)
        if isinstance(hook, SupportsKVCacheGrouping):
            groups = hook.get_kv_cache_groups(config, specs)
        else:
            groups = hook(config, specs)
        if not isinstance(groups, (list, tuple)):
            raise GroupingError(
                f"PlanningConfig.model_kv_cache_grouping={hook!r} returned {groups!r}, "
                "not a list of KVCacheGroupSpec"
            )
        groups = list(groups)
        check_exact_partition(groups, list(kv_cache_spec))
        check_wrapped_layers(groups)
        return groups

    def get_kv_cache_config_from_groups(
        self,
        config: PlanningConfig,
        kv_cache_groups: Sequence[KVCacheGroupSpec],
        num_blocks: int,
    ) -> KVCacheConfig:
        """Default placement (contract.md#default-placement) for exactly ``num_blocks`` blocks."""
        return get_kv_cache_config_from_groups(config, kv_cache_groups, num_blocks)
