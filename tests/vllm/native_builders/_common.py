"""Gates and per-block arithmetic shared by the vLLM-native platform builders.

A platform's own layouts only make sense where its kernels run them, so each
builder first asks :func:`plain_engine`: a block-outermost layout (every
tensor steps one whole block per block, so a builder chooses only byte
offsets inside a block), the hybrid KV cache manager on (with it off vLLM
promotes local layers to full attention and the per-kind tables are gone), no
HiSparse (it owns grouping and a host pool) and no model-declared grouping
(the model then owns its groups, ``SupportsKVCacheGrouping``).  Everything
else goes to vLLM's default builder.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from vllm.config import VllmConfig
from vllm.v1.core.kv_cache_planning import DefaultKVCacheConfigBuilder
from vllm.v1.kv_cache_interface import (
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheSpec,
    KVCacheTensor,
    UniformTypeKVCacheSpecs,
)

__all__ = [
    "SlotPlan",
    "SlotPlanBuilder",
    "SlotPoolBuilder",
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


def round_up(value: int, multiple: int) -> int:
    """The smallest multiple of ``multiple`` that is at least ``value``."""
    return -(-value // multiple) * multiple


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


@dataclass(frozen=True)
class SlotPlan:
    """Where every cache sits inside a block, and the bytes one block takes.

    Attributes:
        offsets: layer name to its byte offset inside a block.
        pages: layer name to its page (the bytes it owns per block).
        bytes_per_block: the block stride of every tensor.
    """

    offsets: Mapping[str, int]
    pages: Mapping[str, int]
    bytes_per_block: int

    def tensors(self, num_blocks: int) -> list[KVCacheTensor]:
        """One single-layer tensor per cache, all on one backing of ``num_blocks`` blocks."""
        size = self.bytes_per_block * num_blocks
        return [
            KVCacheTensor(
                size=size,
                layers=[name],
                layer_stride=self.pages[name],
                block_stride=self.bytes_per_block,
                offset=offset,
            )
            for name, offset in self.offsets.items()
        ]


def pack(placed: Iterable[tuple[str, int, KVCacheSpec]], *, granule: int) -> SlotPlan:
    """A slot plan from ``(name, offset, spec)``: the block covers the farthest page.

    The block stride is the farthest page end rounded up to ``granule`` and
    to every layer's ``block_stride_alignment``, so every block of every
    tensor starts where the platform's DMA engine and the kernels want it.
    """
    offsets: dict[str, int] = {}
    pages: dict[str, int] = {}
    end = 0
    alignment = granule
    for name, offset, spec in placed:
        offsets[name] = offset
        pages[name] = spec.page_size_bytes
        end = max(end, offset + spec.page_size_bytes)
        alignment = math.lcm(alignment, spec.get_block_stride_alignment())
    return SlotPlan(offsets=offsets, pages=pages, bytes_per_block=round_up(end, alignment))


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
        """The tensors of ``plan`` for ``num_blocks`` blocks."""
        return plan.tensors(num_blocks)

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
