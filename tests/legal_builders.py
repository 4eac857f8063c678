"""Legal builders that differ from the reference: the kit must keep passing them.

Each one makes a choice the contract allows but the reference does not make,
in the area of one class of issue 13, so a check that is stricter than the
contract shows up as a false alarm here (tests/test_power.py).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import attrs

from kvref import (
    KVCacheConfig,
    KVCacheGroupSpec,
    PlanningConfig,
    ReferenceKVCacheConfigBuilder,
)
from kvref.errors import KVRefError
from kvref.layout import compute_layout_strides
from kvref.placement import _spec_buckets
from kvref.records import KVCacheTensor
from kvref.specs import KVCacheSpec, UniformTypeKVCacheSpecs, iter_layer_specs

__all__ = [
    "ALL",
    "AlwaysPromotes",
    "DisjointRegions",
    "PadsTwice",
    "Padded4KiB",
    "SeparateAllocations",
    "SortedGroups",
    "SplitTensors",
]


class SplitTensors(ReferenceKVCacheConfigBuilder):
    """One tensor per layer, device and host, wherever the layout allows it.

    Classes 1, 2 and 5: every page keeps its bytes, but tensors, offsets and
    the layer strides of one-layer tensors differ from the reference's, also
    for the groups Core projects to a pipeline stage.  BHLNC interleaves the
    heads of a tensor's layers, so its tensors stay whole.
    """

    def get_kv_cache_config_from_groups(
        self, config: PlanningConfig, kv_cache_groups: Sequence[KVCacheGroupSpec], num_blocks: int
    ) -> KVCacheConfig:
        result = super().get_kv_cache_config_from_groups(config, kv_cache_groups, num_blocks)
        tensors = []
        for t in result.kv_cache_tensors:
            if config.kv_cache_layout.name == "BHLNC" and not t.host_resident:
                tensors.append(t)
                continue
            tensors += [
                attrs.evolve(t, layers=[name], offset=t.offset + i * t.layer_stride)
                for i, name in enumerate(t.layers)
            ]
        return attrs.evolve(result, kv_cache_tensors=tensors)


class Padded4KiB(ReferenceKVCacheConfigBuilder):
    """Rounds every block's device bytes up to a 4 KiB boundary (and its alignments).

    Classes 5 and 7: the backing grows to ``round_up(bytes_per_block, 4096) x
    num_blocks`` and block-outermost tensors step that many bytes per block;
    pages and layer-outer strides stay where the contract puts them.  With few
    small layers the padding dwarfs the pages, which is legal.  Not under
    HiSparse: there Core budgets the pure bytes per block instead of probing
    placement (contract.md#hisparse), so a padded backing would overrun the
    memory Core admitted, which KV-CORE-MEMORY reports.
    """

    def get_kv_cache_config_from_groups(
        self, config: PlanningConfig, kv_cache_groups: Sequence[KVCacheGroupSpec], num_blocks: int
    ) -> KVCacheConfig:
        result = super().get_kv_cache_config_from_groups(config, kv_cache_groups, num_blocks)
        device = [t for t in result.kv_cache_tensors if not t.host_resident]
        if not device or config.hisparse is not None:
            return result
        bpb = device[0].size // num_blocks
        outermost = config.kv_cache_layout.is_block_outermost
        # Block-outermost blocks step the whole block: keep every layer's alignment too.
        unit = 4096
        if outermost:
            for g in kv_cache_groups:
                for spec in iter_layer_specs(g.kv_cache_spec):
                    unit = math.lcm(unit, spec.get_block_stride_alignment())
        padded = -(-bpb // unit) * unit
        tensors = [
            t
            if t.host_resident
            else attrs.evolve(
                t,
                size=padded * num_blocks,
                block_stride=padded if outermost else t.block_stride,
            )
            for t in result.kv_cache_tensors
        ]
        return attrs.evolve(result, kv_cache_tensors=tensors)


class AlwaysPromotes(ReferenceKVCacheConfigBuilder):
    """Allocates sliding-window and chunked layers as full attention, as vLLM does without
    the hybrid manager, keeping their windows; plain grouping where promotion fails.

    Class 3: legal promotions change the spec kind and the memory a request
    takes, never what the layer computes.
    """

    def get_kv_cache_groups(
        self, config: PlanningConfig, kv_cache_spec: Mapping[str, KVCacheSpec]
    ) -> list[KVCacheGroupSpec]:
        promoted = attrs.evolve(config, disable_hybrid_kv_cache_manager=True)
        trial = dict(kv_cache_spec)
        try:
            groups = super().get_kv_cache_groups(promoted, trial)
        except (KVRefError, ValueError, AssertionError):
            return super().get_kv_cache_groups(config, kv_cache_spec)
        return groups


class SortedGroups(ReferenceKVCacheConfigBuilder):
    """Orders the groups by their first layer's name (a deterministic order of its own).

    Class 4: any order that does not follow string hashing is legal.
    """

    def get_kv_cache_groups(
        self, config: PlanningConfig, kv_cache_spec: Mapping[str, KVCacheSpec]
    ) -> list[KVCacheGroupSpec]:
        groups = super().get_kv_cache_groups(config, kv_cache_spec)
        return sorted(groups, key=lambda g: g.layer_names[0])


class DisjointRegions(ReferenceKVCacheConfigBuilder):
    """Gives each of two layer-outer device groups its own region of the one backing.

    Issue 23: every layer steps its own aligned page, ``round_up(page,
    alignment)``, even where the two groups' pitches differ; nothing of one
    group overlaps the other, so no two block IDs alias and the reference's
    common stride is not required (contract.md#page-pitch).  A block costs
    the sum of both groups' pages, less than twice the reference's only
    where the pitches differ (equal pitches would cost exactly twice, the
    waste the kit warns about, and need no region of their own): so groups
    whose layers all share one pitch, three groups or more (and HiSparse,
    block-outermost layouts) place as the reference; host groups keep the
    reference's host tensors.
    The backing stays linear in the block count, so Core's probe learns it.
    """

    def get_kv_cache_config_from_groups(
        self, config: PlanningConfig, kv_cache_groups: Sequence[KVCacheGroupSpec], num_blocks: int
    ) -> KVCacheConfig:
        result = super().get_kv_cache_config_from_groups(config, kv_cache_groups, num_blocks)
        layout = config.kv_cache_layout
        # Device groups only: host groups keep the reference's host tensors and
        # must not change the device backing (contract.md#host-residency).
        populated = [g for g in kv_cache_groups if g.layer_names and not g.host_resident]
        if (
            layout.name not in ("LBHNC", "LBNHC")
            or config.hisparse is not None
            or len(populated) != 2
            or len({s.block_stride for g in populated for s in iter_layer_specs(g.kv_cache_spec)})
            < 2
        ):
            return result
        placed: list[tuple[list[str], int, int, int]] = []
        offset = 0
        for group in populated:
            for spec, names in _spec_buckets(group):
                layer_stride, block_stride, *_ = compute_layout_strides(
                    spec,
                    num_blocks,
                    len(names),
                    layout,
                    fixed=(None, spec.block_stride, None, None, None),
                )
                placed.append((names, layer_stride, block_stride, offset))
                offset += len(names) * layer_stride
        tensors = [t for t in result.kv_cache_tensors if t.host_resident]
        tensors += [
            KVCacheTensor(size=offset, layers=n, layer_stride=ls, block_stride=bs, offset=o)
            for n, ls, bs, o in placed
        ]
        return attrs.evolve(result, kv_cache_tensors=tensors)


class SeparateAllocations(ReferenceKVCacheConfigBuilder):
    """Places the first layer slot of every group in a device allocation of its own.

    Issue 23, several allocations: vLLM's Core allows them when
    ``_get_pool_bytes_per_block`` declares the bytes one block ID takes
    across all of them (contract.md#pool-bytes-hook), as this builder does.
    In layer-outer layouts the reference overlays every group's ``j``-th
    layer in slot ``j`` of one backing; here slot 0 (every group's first
    layer) is one allocation and the other slots another, every layer its
    own tensor with the reference's strides, so a block takes exactly the
    reference's bytes, split over two allocations.  The kit tells
    allocations apart by their sizes, so with two slots (two equal
    allocations), one slot, HiSparse or block-outermost layouts it places as
    the reference.  Not in :data:`ALL` yet: the profiling path judges its
    placement without the hook's answer, and the device checks allocate one
    backing (tests/test_allocations.py says what passes).
    """

    def get_kv_cache_config_from_groups(
        self, config: PlanningConfig, kv_cache_groups: Sequence[KVCacheGroupSpec], num_blocks: int
    ) -> KVCacheConfig:
        result = super().get_kv_cache_config_from_groups(config, kv_cache_groups, num_blocks)
        device = result.device_tensors
        if config.kv_cache_layout.name not in ("LBHNC", "LBNHC") or not device:
            return result
        slot = device[0].block_stride * num_blocks
        total = device[0].size
        # Every layer one slot: the reference's common pitch with layers a slot apart.
        if slot <= 0 or any(
            t.block_stride * num_blocks != slot
            or t.offset % slot
            or (len(t.layers) > 1 and t.layer_stride != slot)
            for t in device
        ):
            return result
        if total // slot < 3 or total % slot:
            return result
        tensors = [t for t in result.kv_cache_tensors if t.host_resident]
        for t in device:
            for i, name in enumerate(t.layers):
                at = t.offset + i * t.layer_stride
                first = at < slot
                tensors.append(
                    attrs.evolve(
                        t,
                        layers=[name],
                        size=slot if first else total - slot,
                        offset=at if first else at - slot,
                    )
                )
        return attrs.evolve(result, kv_cache_tensors=tensors)

    def _get_pool_bytes_per_block(
        self, config: PlanningConfig, kv_cache_groups: Sequence[KVCacheGroupSpec]
    ) -> int | None:
        # One block placed: every device allocation once, each its bytes per block.
        placed = self.get_kv_cache_config_from_groups(
            attrs.evolve(config, num_gpu_blocks_override=None), kv_cache_groups, 1
        )
        return sum({t.size for t in placed.device_tensors})


class PadsTwice(ReferenceKVCacheConfigBuilder):
    """Declares every layer's page padded to twice its size, then places as the reference.

    Issue 23, efficiency: legal (a group spec may grow a page, never shrink
    it, and the padded page fixes every stride, contract.md#page-pitch), yet
    a block takes twice the bytes, so the same memory holds half the blocks:
    the kit's waste warning must fire on it, with the numbers, and no
    verdict may change.  Where the padded groups cannot be placed (a padded
    page cannot be split into kernel blocks) or the spec kind keeps no
    ``page_size_padded``, it groups as the reference does.
    Not in :data:`ALL`: that tuple's builders must stay quiet on waste too.
    """

    def get_kv_cache_groups(
        self, config: PlanningConfig, kv_cache_spec: Mapping[str, KVCacheSpec]
    ) -> list[KVCacheGroupSpec]:
        groups = super().get_kv_cache_groups(config, kv_cache_spec)
        try:
            padded = [attrs.evolve(g, kv_cache_spec=_doubled(g.kv_cache_spec)) for g in groups]
            super().get_kv_cache_config_from_groups(config, padded, 1)
        except (KVRefError, ValueError, TypeError):
            return groups
        return padded


def _doubled(spec: object) -> object:
    """``spec`` with every layer's page declared twice its size."""
    if isinstance(spec, UniformTypeKVCacheSpecs):
        inner = {n: _doubled(s) for n, s in spec.kv_cache_specs.items()}
        return attrs.evolve(spec, kv_cache_specs=inner)
    if not isinstance(spec, KVCacheSpec) or "page_size_padded" not in attrs.fields_dict(type(spec)):
        raise TypeError(f"{type(spec).__name__} keeps no page_size_padded")
    return attrs.evolve(spec, page_size_padded=2 * spec.page_size_bytes)


#: The legal counterparts, one or more per class of issue 13.
ALL: tuple[type[ReferenceKVCacheConfigBuilder], ...] = (
    SplitTensors,
    Padded4KiB,
    AlwaysPromotes,
    SortedGroups,
    DisjointRegions,
)
