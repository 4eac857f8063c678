"""Legal builders that differ from the reference: the kit must keep passing them.

Each one makes a choice the contract allows but the reference does not make,
in the area of one class of once-invisible bug, so a check that is stricter than the
contract shows up as a false alarm here (tests/kit/check/test_power.py).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import ClassVar

import attrs
from broken_builders._base import _with_layer_specs
from vendor_builders.tensor_edits import first_slot_apart

from kvref import (
    KVCacheConfig,
    KVCacheGroupSpec,
    PlanningConfig,
    ReferenceKVCacheConfigBuilder,
)
from kvref.backends import select_common_block_size
from kvref.errors import KVRefError
from kvref.kernel_blocks import kernel_tensor_geometries, prepare_kernel_block_sizes
from kvref.layout import compute_layout_strides
from kvref.placement import _spec_buckets
from kvref.records import KVCacheTensor
from kvref.specs import (
    KVCacheSpec,
    MLAAttentionSpec,
    MultipleOf,
    UniformTypeKVCacheSpecs,
    iter_layer_specs,
)

__all__ = [
    "ALL",
    "AlignsStrides4KiB",
    "AlwaysPromotes",
    "DeclaresPoolBytes",
    "DisjointRegions",
    "KernelAlignedOffsets",
    "PadsTwice",
    "Padded4KiB",
    "ScattersTargets",
    "SeparateAllocations",
    "SortedGroups",
    "SpacedCompressedRuns",
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
    memory Core admitted, which KV-CORE-MEMORY reports.  Nor in a
    block-outermost layout whose blocks hold one page, when backends are
    described: padded, the worker would take them as packed and could not
    bind smaller kernel blocks (contract.md#kernel-views).
    """

    #: vLLM 0.34.0's worker drops a layer-outer backing's bytes after the
    #: last layer region, so Core's one-block probe (padding included) plans
    #: the capacity with more bytes per block than the worker's segments take:
    #: fewer blocks than the memory holds (tests/kit/check/test_worker_accept.py).
    #: In a layout neither block-compact nor block-outermost (LHBNC) that worker
    #: cuts the backing into segments of ``num_blocks x block_stride`` and
    #: refuses a backing that is not a whole number of them
    #: (``ExtensibleKVCache._segments``, vllm/v1/worker/extensible_kv_cache.py):
    #: the padded backing is not, wherever the padded block is not a multiple
    #: of the page (seen at seed 1: 15 MLA pages of 1,152 B, 17,280 B padded
    #: to 20,480 B a block).
    WORKER_REFUSED: ClassVar[Mapping[str, frozenset[str]]] = {
        "0.34.0": frozenset({"KV-WORKER-POOL-BYTES", "KV-WORKER-BLOCK-SEGMENTS"})
    }

    def get_kv_cache_config_from_groups(
        self, config: PlanningConfig, kv_cache_groups: Sequence[KVCacheGroupSpec], num_blocks: int
    ) -> KVCacheConfig:
        result = super().get_kv_cache_config_from_groups(config, kv_cache_groups, num_blocks)
        device = [t for t in result.kv_cache_tensors if not t.host_resident]
        if not device or config.hisparse is not None:
            return result
        bpb = device[0].size // num_blocks
        outermost = config.kv_cache_layout.is_block_outermost
        padded = -(-bpb // 4096) * 4096
        if outermost:
            # Block-outermost blocks step the whole block: keep every device layer's
            # alignment too.  Rounding to their common multiple after the 4 KiB (not to
            # lcm(4096, alignment), which an odd alignment makes thousands of times a
            # page) keeps the padding under the contract's size bound; host layers
            # must not change device bytes at all (contract.md#host-residency).
            unit = 1
            for g in kv_cache_groups:
                if not g.host_resident:
                    for spec in iter_layer_specs(g.kv_cache_spec):
                        unit = math.lcm(unit, spec.get_block_stride_alignment())
            padded = -(-padded // unit) * unit
            if config.attention_backends and any(t.block_stride <= t.layer_stride for t in device):
                # vLLM's worker reads a block stride beyond the layer stride as
                # packing: a one-page block padded would stay whole, and a backend
                # that needs smaller kernel blocks could not bind a token cache in it
                # (contract.md#kernel-views), where the reference's block splits.
                return result
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
    takes, never what the layer computes.  A promoted window keeps a whole
    request's blocks, so where windows are long against max_model_len the
    plan holds fewer requests than the reference's: legal waste, which the
    efficiency warning may rightly name.
    """

    #: Legal, and may waste memory (the efficiency warning may fire on it).
    WASTES = True

    #: vLLM's worker (0.33.0's and 0.34.0's alike) cannot bind some promoted
    #: plans: in a block-outermost layout a promoted group packs several
    #: layers' token pages in each block (``block_stride > layer_stride``), so
    #: ``prepare_kernel_block_sizes`` leaves the group unsplit at its cache
    #: block size, then ``AttentionGroup.create_metadata_builders`` asks each
    #: layer's backend again and ``map_kv_cache_to_kernel_blocks`` raises
    #: ``ValueError`` for a backend that needs smaller kernel blocks (only
    #: compressed caches can be re-strided).  The reference's plan of the same
    #: input keeps one layer a group per worker and is split (seen at seed 1:
    #: full_sink, BLHNC, 128-token blocks, a 16-token-only backend).
    WORKER_REFUSED: ClassVar[Mapping[str, frozenset[str]]] = {
        "0.33.0": frozenset({"KV-DEV-KERNEL-VIEWS"}),
        "0.34.0": frozenset({"KV-DEV-KERNEL-VIEWS"}),
    }

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


class ScattersTargets(ReferenceKVCacheConfigBuilder):
    """Gives every target layer a group of its own; a group's draft layers stay together.

    The edge of the draft clause: the contract binds the draft
    layers (``is_draft``) of one spec to one group and says nothing of
    target layers (contract.md#grouping-draft-layers), so shattering them
    is legal, as a field builder that put 36 state layers in 36 groups was:
    it wastes memory (each group takes blocks of its own), which the kit
    warns about but never fails.  A declared grouping, HiSparse's groups
    (which carry roles) and groups its own placement cannot lay out (mixed
    pages over several groups of a layer-compact layout) are the reference's.
    """

    #: One-layer groups hold fewer requests in the same memory (contract.md#efficiency).
    WASTES = True

    def get_kv_cache_groups(
        self, config: PlanningConfig, kv_cache_spec: Mapping[str, KVCacheSpec]
    ) -> list[KVCacheGroupSpec]:
        groups = super().get_kv_cache_groups(config, kv_cache_spec)
        if config.hisparse is not None or config.model_kv_cache_grouping is not None:
            return groups
        out: list[KVCacheGroupSpec] = []
        for group in groups:
            drafts = [n for n in group.layer_names if kv_cache_spec[n].is_draft]
            parts = [[n] for n in group.layer_names if not kv_cache_spec[n].is_draft]
            out += [_part(group, names) for names in ([drafts] if drafts else []) + parts]
        try:
            # A layer-compact layout cannot hold mixed pages over several groups.
            super().get_kv_cache_config_from_groups(config, out, 1)
        except KVRefError:
            return groups
        return out


class AlignsStrides4KiB(ReferenceKVCacheConfigBuilder):
    """Asks every device group's block strides for 4 KiB multiples of the layer's alignment.

    A platform whose DMA engine moves whole 4 KiB pages raises each layer's
    ``block_stride_alignment`` in its group specs to ``lcm(alignment, 4096)``
    bytes and places as the reference does.  vLLM reads the field only to size
    block strides (contract.md#views-and-strides), so asking for more is
    legal; asking for less is not (``broken_builders.DropsGroupAlignment``).
    Only in block-outermost layouts, where a block's bytes can be padded
    (layer-outer layouts step one page per block and would have to refuse).
    Host groups keep theirs: host tensors follow the host pool's own layout.
    """

    #: Small pages padded to 4 KiB per layer hold several times fewer requests
    #: in the same memory (contract.md#efficiency): legal, and the warning says so.
    WASTES = True

    def get_kv_cache_groups(
        self, config: PlanningConfig, kv_cache_spec: Mapping[str, KVCacheSpec]
    ) -> list[KVCacheGroupSpec]:
        groups = super().get_kv_cache_groups(config, kv_cache_spec)
        if not config.kv_cache_layout.is_block_outermost:
            return groups

        def aligned(spec: KVCacheSpec) -> KVCacheSpec:
            wanted = math.lcm(spec.get_block_stride_alignment(), 4096)
            return attrs.evolve(spec, block_stride_alignment=wanted)

        return [g if g.host_resident else _with_layer_specs(g, aligned) for g in groups]


def _part(group: KVCacheGroupSpec, names: list[str]) -> KVCacheGroupSpec:
    """The group of ``names``, part of ``group``: the group's spec, or its layers' specs."""
    if len(names) == len(group.layer_names):
        return group
    spec = group.kv_cache_spec
    if isinstance(spec, UniformTypeKVCacheSpecs):
        spec = UniformTypeKVCacheSpecs(kv_cache_specs={n: spec.kv_cache_specs[n] for n in names})
    return attrs.evolve(group, layer_names=names, kv_cache_spec=spec)


class DisjointRegions(ReferenceKVCacheConfigBuilder):
    """Gives each of two layer-outer device groups its own region of the one backing.

    Every layer steps its own aligned page, ``round_up(page,
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

    Several allocations: vLLM's Core allows them when
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
    backing (tests/kit/check/test_allocations.py says what passes).  Legal by the
    interface's text only: vLLM's GPU worker, 0.33.0's and 0.34.0's alike,
    allocates one backing for every device tensor and refuses tensors of
    several sizes at startup (``KV-WORKER-ONE-BACKING``).
    """

    WORKER_REFUSED: ClassVar[Mapping[str, frozenset[str]]] = {
        "0.33.0": frozenset({"KV-WORKER-ONE-BACKING"}),
        "0.34.0": frozenset({"KV-WORKER-ONE-BACKING"}),
    }

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
        tensors += first_slot_apart(device, slot, total, attrs.evolve)
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

    Efficiency: legal (a group spec may grow a page, never shrink
    it, and the padded page fixes every stride, contract.md#page-pitch), yet
    a block takes twice the bytes, so the same memory holds half the blocks:
    the kit's waste warning must fire on it, with the numbers, and no
    verdict may change.  Where the padded groups cannot be placed or read
    (a padded page cannot be split into kernel blocks, by a spec's alignment
    or by the config's attention backends, on the whole model or on a
    pipeline stage that holds one layer of a group) or the spec kind keeps
    no ``page_size_padded``, it groups as the reference does.
    Not in :data:`ALL`: that tuple's builders must stay quiet on waste too.
    """

    def get_kv_cache_groups(
        self, config: PlanningConfig, kv_cache_spec: Mapping[str, KVCacheSpec]
    ) -> list[KVCacheGroupSpec]:
        groups = super().get_kv_cache_groups(config, kv_cache_spec)
        try:
            padded = [attrs.evolve(g, kv_cache_spec=_doubled(g.kv_cache_spec)) for g in groups]
            placed = super().get_kv_cache_config_from_groups(config, padded, 1)
            # The worker reads a block it splits into kernel blocks as one dense
            # page, so padding is legal only where the backends split nothing.
            sizes = prepare_kernel_block_sizes(config, placed)
            kernel_tensor_geometries(placed, sizes, config.kv_cache_layout)
            if _split_on_some_stage(config, padded):
                return groups
        except (KVRefError, ValueError, TypeError):
            return groups
        return padded


def _split_on_some_stage(config: PlanningConfig, groups: Sequence[KVCacheGroupSpec]) -> bool:
    """Whether a worker could read some group's blocks as several kernel blocks.

    Placed whole, a group's pages may sit packed between other layers' pages
    (read unsplit); a pipeline stage that holds one layer of it gets an
    unpacked tensor, which the worker splits where its backends take
    smaller kernel blocks, and a padded page cannot be split.  The builder
    groups the whole model and never knows the stages, so it pads nowhere
    such a split could happen.
    """
    for group in groups:
        block = group.kv_cache_spec.block_size
        if select_common_block_size(block, config.backends_of(group.layer_names)) < block:
            return True
    return False


def _doubled(spec: object) -> object:
    """``spec`` with every layer's page declared twice its size."""
    if isinstance(spec, UniformTypeKVCacheSpecs):
        inner = {n: _doubled(s) for n, s in spec.kv_cache_specs.items()}
        return attrs.evolve(spec, kv_cache_specs=inner)
    if not isinstance(spec, KVCacheSpec) or "page_size_padded" not in attrs.fields_dict(type(spec)):
        raise TypeError(f"{type(spec).__name__} keeps no page_size_padded")
    return attrs.evolve(spec, page_size_padded=2 * spec.page_size_bytes)


def _kernel_split(spec: KVCacheSpec) -> bool:
    """Whether a worker reads ``spec``'s cache blocks as several kernel blocks."""
    wanted = spec.block_stride_alignment
    return isinstance(wanted, MultipleOf) and math.gcd(wanted.n, spec.block_size) < spec.block_size


class KernelAlignedOffsets(ReferenceKVCacheConfigBuilder):
    """Starts each kernel-split layer at a multiple of its kernel page inside the block.

    Kernel blocks below the cache block: ``MultipleOf`` asks the
    block stride to be a multiple of the page at the kernel block
    (contract.md#views-and-strides), nothing of the offsets.  In BLHNC/BLNHC
    this builder also aligns where such a layer starts inside a block (each
    one its own tensor, a gap before it where needed) and rounds the block up
    to every alignment, as a platform whose kernels address kernel blocks
    from the backing's start might.  Every block still steps the whole
    block, the backing stays linear in the block count, and the gaps cost
    less than a kernel page per layer.  Layer-outer layouts (strides fixed
    by the page), HiSparse (Core budgets the pure bytes per block) and
    models without kernel-split layers place as the reference.
    """

    def get_kv_cache_config_from_groups(
        self, config: PlanningConfig, kv_cache_groups: Sequence[KVCacheGroupSpec], num_blocks: int
    ) -> KVCacheConfig:
        result = super().get_kv_cache_config_from_groups(config, kv_cache_groups, num_blocks)
        device = [g for g in kv_cache_groups if g.layer_names and not g.host_resident]
        specs = [s for g in device for s in iter_layer_specs(g.kv_cache_spec)]
        if (
            config.kv_cache_layout.name not in ("BLHNC", "BLNHC")
            or config.hisparse is not None
            or not any(_kernel_split(s) for s in specs)
        ):
            return result
        unit = math.lcm(1, *(s.get_block_stride_alignment() for s in specs))
        placed: list[tuple[list[str], int, int]] = []
        end = 0
        for group in device:
            offset = 0
            for spec, names in _spec_buckets(group):
                page = spec.page_size_bytes
                if not _kernel_split(spec):
                    placed.append((names, page, offset))
                    offset += len(names) * page
                    continue
                step = spec.get_block_stride_alignment()
                for name in names:
                    offset = -(-offset // step) * step
                    placed.append(([name], page, offset))
                    offset += page
            end = max(end, offset)
        bpb = -(-end // unit) * unit
        tensors = [t for t in result.kv_cache_tensors if t.host_resident]
        tensors += [
            KVCacheTensor(
                size=bpb * num_blocks, layers=n, layer_stride=ls, block_stride=bpb, offset=o
            )
            for n, ls, o in placed
        ]
        return attrs.evolve(result, kv_cache_tensors=tensors)


class SpacedCompressedRuns(ReferenceKVCacheConfigBuilder):
    """Spaces a compressed MLA cache's layer runs whole 512-byte sectors per block apart.

    Compressed MLA placed layer-outer: in LBNHC/LBHNC a block
    steps the layer's aligned page (contract.md#page-pitch), but the layer
    stride is the builder's to choose as long as no two pages overlap.  Here
    a compressed tensor's layers are ``num_blocks x round_up(block_stride,
    512)`` apart, and the backing grows (linearly in the block count) to hold
    the gaps; 512 bytes keep the growth within the contract's sane bound
    for the smallest compressed pages (contract.md#placement-backing).  Only
    a single device group is spaced (several groups alias one another's
    slots and place as the reference), as are block-outer layouts and models
    without compressed MLA.
    """

    #: vLLM 0.34.0's worker asserts ``layer_stride == num_blocks x block_stride``
    #: in layer-outer layouts (it moves whole layer regions), so it refuses
    #: the spaced layers at startup (tests/kit/check/test_worker_accept.py).
    WORKER_REFUSED: ClassVar[Mapping[str, frozenset[str]]] = {
        "0.34.0": frozenset({"KV-WORKER-LAYER-REGIONS"})
    }

    def get_kv_cache_config_from_groups(
        self, config: PlanningConfig, kv_cache_groups: Sequence[KVCacheGroupSpec], num_blocks: int
    ) -> KVCacheConfig:
        result = super().get_kv_cache_config_from_groups(config, kv_cache_groups, num_blocks)
        device = [t for t in result.kv_cache_tensors if not t.host_resident]
        populated = [g for g in kv_cache_groups if g.layer_names and not g.host_resident]
        if config.kv_cache_layout.name not in ("LBNHC", "LBHNC") or len(populated) != 1:
            return result
        spec_of = {n: populated[0].layer_spec(n) for n in populated[0].layer_names}

        def compressed(t: KVCacheTensor) -> bool:
            spec = spec_of.get(t.layers[0]) if t.layers else None
            return isinstance(spec, MLAAttentionSpec) and spec.tokens_per_state_value > 1

        if not any(compressed(t) for t in device):
            return result
        spaced: list[KVCacheTensor] = []
        offset = 0
        for t in sorted(device, key=lambda t: t.offset):
            stride = t.layer_stride
            if compressed(t):
                stride = num_blocks * (-(-t.block_stride // 512) * 512)
            spaced.append(attrs.evolve(t, offset=offset, layer_stride=stride))
            offset += len(t.layers) * stride
        size = max(offset, device[0].size)
        tensors = [t for t in result.kv_cache_tensors if t.host_resident]
        tensors += [attrs.evolve(t, size=size) for t in spaced]
        return attrs.evolve(result, kv_cache_tensors=tensors)


class DeclaresPoolBytes(ReferenceKVCacheConfigBuilder):
    """Answers ``_get_pool_bytes_per_block`` itself: the device bytes of one placed block.

    Pipeline splits that leave a worker without any layer of a
    group: Core asks the hook about the groups projected to each worker,
    empty ones included (contract.md#core-flow), and the answer must equal
    what placement uses per block (contract.md#pool-bytes-hook).  A group
    with no layer on the worker takes no bytes there, which this builder
    answers (0 on a worker holding no device layer at all) instead of
    letting Core probe.
    """

    def _get_pool_bytes_per_block(
        self, config: PlanningConfig, kv_cache_groups: Sequence[KVCacheGroupSpec]
    ) -> int | None:
        placed = self.get_kv_cache_config_from_groups(
            attrs.evolve(config, num_gpu_blocks_override=None), kv_cache_groups, 1
        )
        return max((t.size for t in placed.device_tensors), default=0)


class DropsTPShards(ReferenceKVCacheConfigBuilder):
    """Rebuilds every group spec without ``max_tp_shards``.

    A platform whose spec constructors do not know the field (it came with
    MLA's TP replication) drops it.  Core then derives ``kv_tp_replicas``
    of 1: KV connectors keep every TP rank's copy, which costs memory and
    stays correct (contract.md#grouping-tp-shards).  The edge of
    ``broken_builders.ClaimsReplicatedKV``: fewer replicas claimed is legal,
    more is not.
    """

    def get_kv_cache_groups(
        self, config: PlanningConfig, kv_cache_spec: Mapping[str, KVCacheSpec]
    ) -> list[KVCacheGroupSpec]:
        groups = super().get_kv_cache_groups(config, kv_cache_spec)

        def dropped(spec: KVCacheSpec) -> KVCacheSpec:
            if getattr(spec, "max_tp_shards", None) is None:
                return spec
            return attrs.evolve(spec, max_tp_shards=None)

        return [_with_layer_specs(g, dropped) for g in groups]


#: The legal counterparts, one or more per class of once-invisible bug.
ALL: tuple[type[ReferenceKVCacheConfigBuilder], ...] = (
    SplitTensors,
    Padded4KiB,
    AlwaysPromotes,
    SortedGroups,
    DisjointRegions,
)

#: The field regimes: a legal builder at the edge of each class
#: (kernel blocks below the cache block, compressed MLA placed layer-outer,
#: a worker without any layer of a group, target layers scattered over groups
#: of their own beside a drafter's), asserted to pass beside :data:`ALL`.
FIELD_REGIMES: tuple[type[ReferenceKVCacheConfigBuilder], ...] = (
    KernelAlignedOffsets,
    SpacedCompressedRuns,
    DeclaresPoolBytes,
    ScattersTargets,
    AlignsStrides4KiB,
    DropsTPShards,
)
