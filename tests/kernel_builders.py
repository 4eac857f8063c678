"""Builders whose plans a worker misreads through its kernel views (KV-DEV-KERNEL-VIEWS).

Each differs from the reference only where the config describes attention
backends whose kernels take blocks smaller than the cache block, so the
worker splits every cache block into kernel blocks (contract.md#kernel-views).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import attrs
from vendor_builders.tensor_edits import one_layer_tensors

from conformance.check.observations import CallResult, PlacementObservation
from kvref import (
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheTensor,
    PlanningConfig,
    ReferenceKVCacheConfigBuilder,
)
from kvref.kernel_blocks import KernelTensorGeometry, kernel_tensor_geometries
from kvref.layout import KVCacheLayout
from kvref.specs import (
    AttentionSpec,
    KVCacheSpec,
    MambaSpec,
    UniformTypeKVCacheSpecs,
)

__all__ = ["KernelSizeMisfit", "PackedSingleLayers", "PaddedDenseRead", "UnpackedSingleLayers"]

_BLOCK_OUTER = frozenset({KVCacheLayout.BLNHC, KVCacheLayout.BLHNC, KVCacheLayout.BHLNC})


def _split_attention(spec: KVCacheSpec) -> bool:
    return isinstance(spec, AttentionSpec) and not isinstance(spec, MambaSpec)


def _map_specs(
    spec: KVCacheSpec | UniformTypeKVCacheSpecs, change: Mapping[str, int]
) -> KVCacheSpec | UniformTypeKVCacheSpecs:
    if isinstance(spec, UniformTypeKVCacheSpecs):
        inner = {n: _map_specs(s, change) for n, s in spec.kv_cache_specs.items()}
        return attrs.evolve(spec, kv_cache_specs=inner, **change)
    if not _split_attention(spec):
        return spec
    return attrs.evolve(spec, **change)  # type: ignore[arg-type]


class _BackendGroups(ReferenceKVCacheConfigBuilder):
    """Changes each of the reference's groups, only where the config describes backends."""

    def change_group(self, group: KVCacheGroupSpec) -> KVCacheGroupSpec:
        raise NotImplementedError

    def get_kv_cache_groups(
        self, config: PlanningConfig, kv_cache_spec: Mapping[str, KVCacheSpec]
    ) -> list[KVCacheGroupSpec]:
        groups = super().get_kv_cache_groups(config, kv_cache_spec)
        if not config.attention_backends:
            return groups
        return [self.change_group(group) for group in groups]


def _single_layers(
    result: KVCacheConfig,
    layer_stride: Callable[[KVCacheTensor], int],
    keep: Callable[[KVCacheTensor], bool],
) -> KVCacheConfig:
    """``result`` with each tensor ``keep`` does not keep split into one tensor per layer.

    Each one-layer tensor records ``layer_stride(t)``, a stride it never steps.
    """
    tensors = one_layer_tensors(
        result.kv_cache_tensors, keep, attrs.evolve, layer_stride=layer_stride
    )
    return attrs.evolve(result, kv_cache_tensors=tensors)


class PaddedDenseRead(_BackendGroups):
    """Pads every attention group's page by 64 bytes when the backends split its blocks.

    On paper the pages only grow (a group spec may pad), and every stride
    steps the padded page; but a worker splitting a block reads it as one
    dense page of kernel blocks, so each kernel block after the first would
    straddle the padding: vLLM's worker refuses the plan.
    """

    def change_group(self, group: KVCacheGroupSpec) -> KVCacheGroupSpec:
        spec = group.kv_cache_spec
        layer = spec if not isinstance(spec, UniformTypeKVCacheSpecs) else None
        if layer is None or not _split_attention(layer):
            return group
        padded = attrs.evolve(layer, page_size_padded=layer.page_size_bytes + 64)  # type: ignore[call-arg]
        return attrs.evolve(group, kv_cache_spec=padded)


class KernelSizeMisfit(_BackendGroups):
    """Grows every attention group's block size by 8 tokens when backends are described.

    The kernel block sizes the backends take (16 tokens and up) then divide
    no group's block size, so the worker has no kernel block to read it in.
    """

    def change_group(self, group: KVCacheGroupSpec) -> KVCacheGroupSpec:
        block = group.kv_cache_spec.block_size
        return attrs.evolve(
            group, kv_cache_spec=_map_specs(group.kv_cache_spec, {"block_size": block + 8})
        )


class UnpackedSingleLayers(ReferenceKVCacheConfigBuilder):
    """One tensor per layer in block-outermost layouts, whose layer stride is the block stride.

    A one-layer tensor never steps its layer stride, so on paper any value
    does (tests/legal_builders.py's SplitTensors keeps the reference's).  But
    the worker tells block-outermost packing by a block stride larger than
    the layer stride: with the two equal it takes the group as layer-outer,
    splits its blocks and refuses, since a block holds other layers' pages.
    """

    def get_kv_cache_config_from_groups(
        self, config: PlanningConfig, kv_cache_groups: Sequence[KVCacheGroupSpec], num_blocks: int
    ) -> KVCacheConfig:
        result = super().get_kv_cache_config_from_groups(config, kv_cache_groups, num_blocks)
        if config.kv_cache_layout not in _BLOCK_OUTER - {KVCacheLayout.BHLNC}:
            return result
        return _single_layers(result, lambda t: t.block_stride, lambda t: t.host_resident)


class PackedSingleLayers(ReferenceKVCacheConfigBuilder):
    """One tensor per layer in layer-compact layouts, whose layer stride is half the block stride.

    The mirror of :class:`UnpackedSingleLayers`: the unused layer stride now
    sits below the block stride, so the worker takes the group as packed
    (block-outermost), never splits it group-wide, and at bind time finds a
    backend that needs smaller kernel blocks than a packed token cache can
    be split into: vLLM refuses to bind it, where it splits the reference's
    layer-outer plan.
    """

    def get_kv_cache_config_from_groups(
        self, config: PlanningConfig, kv_cache_groups: Sequence[KVCacheGroupSpec], num_blocks: int
    ) -> KVCacheConfig:
        result = super().get_kv_cache_config_from_groups(config, kv_cache_groups, num_blocks)
        if config.kv_cache_layout.is_block_outermost or not config.attention_backends:
            return result
        return _single_layers(
            result, lambda t: t.block_stride // 2, lambda t: t.host_resident or t.block_stride < 2
        )


# -- hand-made observations of the reference's plan (tests/extensions/device/test_kernel_view*.py)


def reference_placement(
    config: PlanningConfig, specs: dict[str, KVCacheSpec], num_blocks: int
) -> PlacementObservation:
    """The placement observation of the reference grouping and placing ``specs``."""
    reference = ReferenceKVCacheConfigBuilder()
    groups = reference.get_kv_cache_groups(config, specs)
    plan = reference.get_kv_cache_config_from_groups(config, groups, num_blocks)
    ok = CallResult(hook="get_kv_cache_config_from_groups", value=plan)
    return PlacementObservation(
        config=config,
        specs=specs,
        groups=tuple(groups),
        groups_source="builder",
        num_blocks=num_blocks,
        results={num_blocks: ok},
        repeat=ok,
        fresh=ok,
        mutations=(),
        pool_bytes=None,
        empty=ok,
    )


def misstepped_geometries(
    *args: object, **kwargs: object
) -> tuple[KernelTensorGeometry | None, ...]:
    """The worker's kernel views, each stepping kernel blocks by half a kernel page."""
    out = kernel_tensor_geometries(*args, **kwargs)  # type: ignore[arg-type]
    return tuple(
        None
        if g is None
        else attrs.evolve(g, strides=(g.strides[0], g.strides[1] // 2, *g.strides[2:]))
        for g in out
    )
