"""Gates and per-block arithmetic shared by the vLLM-native platform builders.

A platform's own layouts only make sense where its kernels run them, so each
builder first asks :func:`plain_engine`: a block-outermost layout (every
tensor steps one whole block per block, so a builder chooses only byte
offsets inside a block), the hybrid KV cache manager on (with it off vLLM
promotes local layers to full attention and the per-kind tables are gone), no
HiSparse (it owns grouping and a host pool) and no model-declared grouping
(the model then owns its groups, ``SupportsKVCacheGrouping``).  Everything
else goes to vLLM's default builder.

The per-block arithmetic (:class:`SlotPlan`, :func:`pack`, :func:`round_up`)
is not about the form: it is tests/vendor_builders/slots.py's, which the
kvref-native builders use too; only the tensors and configs here are vLLM's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from vllm.config import VllmConfig
from vllm.v1.core.kv_cache_planning import DefaultKVCacheConfigBuilder
from vllm.v1.kv_cache_interface import (
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheSpec,
    KVCacheTensor,
    UniformTypeKVCacheSpecs,
)

from tests.vendor_builders.slots import SlotPlan, pack, round_up

#: What a grouping hook takes and returns.
Specs = dict[str, KVCacheSpec]
Groups = list[KVCacheGroupSpec]

__all__ = [
    "Groups",
    "PlainEngineGroups",
    "SlotPlan",
    "SlotPlanBuilder",
    "SlotPoolBuilder",
    "Specs",
    "layer_spec",
    "layer_specs",
    "pack",
    "plain_engine",
    "round_down",
    "round_up",
    "slot_config",
    "usable_block_count",
    "with_layer_specs",
]


def round_down(value: int, multiple: int) -> int:
    """The largest multiple of ``multiple`` that is at most ``value``."""
    return value // multiple * multiple


def plain_engine(vllm_config: VllmConfig) -> bool:
    """Whether the platform's own layouts apply to this engine at all (see the module doc)."""
    layout = vllm_config.cache_config.get_resolved_kv_cache_layout()
    return (
        layout.is_block_outermost
        and not vllm_config.scheduler_config.disable_hybrid_kv_cache_manager
        and vllm_config.attention_config.hisparse_config is None
        and not vllm_config.model_config.supports_kv_cache_grouping
    )


def layer_spec(group: KVCacheGroupSpec, name: str) -> KVCacheSpec:
    """The per-layer spec of ``name`` in ``group`` (a plain group spec is every layer's)."""
    spec = group.kv_cache_spec
    if isinstance(spec, UniformTypeKVCacheSpecs):
        return spec.kv_cache_specs[name]
    return spec


def layer_specs(group: KVCacheGroupSpec) -> list[tuple[str, KVCacheSpec]]:
    """``(name, per-layer spec)`` of the layers the group names, in its order.

    Only the names count: a pipeline worker's projection of a uniform-type
    group may keep a wrapper that still lists other workers' layers.
    """
    return [(name, layer_spec(group, name)) for name in group.layer_names]


def usable_block_count(num_blocks: object) -> bool:
    """Whether ``num_blocks`` is a block count a platform placement answers itself.

    Anything else (not an int, or under one block) is left to vLLM's default,
    whose answer (or error) for it is the one Core expects.
    """
    return type(num_blocks) is int and num_blocks >= 1


def slot_config(
    vllm_config: VllmConfig,
    groups: Sequence[KVCacheGroupSpec],
    tensors: list[KVCacheTensor],
    num_blocks: int,
) -> KVCacheConfig:
    """The ``KVCacheConfig`` of a platform placement: exactly ``num_blocks``, the groups echoed."""
    return KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=tensors,
        kv_cache_groups=list(groups),
        prefix_cache_retention_interval=vllm_config.cache_config.prefix_cache_retention_interval,
    )


class PlainEngineGroups(DefaultKVCacheConfigBuilder):
    """vLLM's groups, changed by :meth:`regroup` where :func:`plain_engine` says the platform's."""

    def regroup(self, vllm_config: VllmConfig, kv_cache_spec: Specs, groups: Groups) -> Groups:
        """The platform's groups for vLLM's ``groups``."""
        raise NotImplementedError

    def get_kv_cache_groups(
        self, vllm_config: VllmConfig, kv_cache_spec: dict[str, KVCacheSpec]
    ) -> list[KVCacheGroupSpec]:
        """vLLM's grouping; on the platform's engines as :meth:`regroup` changes it."""
        groups: list[KVCacheGroupSpec] = super().get_kv_cache_groups(vllm_config, kv_cache_spec)
        if not plain_engine(vllm_config):
            return groups
        return self.regroup(vllm_config, kv_cache_spec, groups)


class SlotPlanBuilder(DefaultKVCacheConfigBuilder):
    """The placement of a builder that lays the groups it owns out as a :class:`SlotPlan`.

    A subclass says, in :meth:`_slot_plan`, where each cache sits in a block
    of the groups it owns; other groups, and a block count that is not
    :func:`usable_block_count`, go to vLLM's default.
    """

    def _slot_plan(
        self, vllm_config: VllmConfig, groups: Sequence[KVCacheGroupSpec]
    ) -> SlotPlan | None:
        """Offsets of every cache, or ``None`` when the groups are not this platform's."""
        raise NotImplementedError

    def _tensors(self, plan: SlotPlan, num_blocks: int) -> list[KVCacheTensor]:
        """The tensors of ``plan`` for ``num_blocks`` blocks, as vLLM's tensors."""
        return plan.tensors(num_blocks, KVCacheTensor)

    def get_kv_cache_config_from_groups(
        self, vllm_config: VllmConfig, kv_cache_groups: list[KVCacheGroupSpec], num_blocks: int
    ) -> KVCacheConfig:
        """The platform's slot plan for the groups it owns; vLLM's default otherwise."""
        plan = self._slot_plan(vllm_config, kv_cache_groups)
        if plan is None or not usable_block_count(num_blocks):
            return super().get_kv_cache_config_from_groups(vllm_config, kv_cache_groups, num_blocks)
        return slot_config(
            vllm_config, kv_cache_groups, self._tensors(plan, num_blocks), num_blocks
        )


class SlotPoolBuilder(SlotPlanBuilder):
    """A :class:`SlotPlanBuilder` that also answers ``_get_pool_bytes_per_block`` with its block."""

    def _get_pool_bytes_per_block(
        self, vllm_config: VllmConfig, kv_cache_groups: list[KVCacheGroupSpec]
    ) -> int | None:
        """The slot plan's block for groups it places; ``None`` (Core probes) otherwise."""
        plan = self._slot_plan(vllm_config, kv_cache_groups)
        return None if plan is None else plan.bytes_per_block


def with_layer_specs(
    group: KVCacheGroupSpec, change: Callable[[KVCacheSpec], KVCacheSpec]
) -> KVCacheGroupSpec:
    """``group`` with ``change(spec)`` applied to every layer spec (a uniform wrapper's too)."""
    spec = group.kv_cache_spec
    if isinstance(spec, UniformTypeKVCacheSpecs):
        inner = {name: change(s) for name, s in spec.kv_cache_specs.items()}
        wrapper = dataclasses.replace(spec, kv_cache_specs=inner)
        return dataclasses.replace(group, kv_cache_spec=wrapper)
    return dataclasses.replace(group, kv_cache_spec=change(spec))
