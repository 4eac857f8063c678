"""Broken builders of placement, host residency and pool bytes, and later grouping ones."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from broken_builders._base import (
    Groups,
    Specs,
    _Base,
    _change_tensors,
    _Grouping,
    _on_device,
    _on_host,
    _Placement,
    _Regiven,
    _with_layer_specs,
    _with_tensors,
    member_of,
)
from kvref import (
    KVCacheConfig,
    KVCacheGroupSpec,
    PlanningConfig,
)
from kvref.specs import KVCacheSpec


@member_of("all")
class WrongNumBlocks(_Placement):
    """Reports one block more than it placed."""

    CAUGHT_BY = "KV-PLACE-NUM-BLOCKS"

    def fix(self, config: PlanningConfig, result: KVCacheConfig, num_blocks: int) -> KVCacheConfig:
        return attrs.evolve(result, num_blocks=num_blocks + 1)


@member_of("all")
class GroupsNotEchoed(_Placement):
    """Returns the groups in reverse order."""

    CAUGHT_BY = "KV-PLACE-GROUPS-ECHOED"

    def fix(self, config: PlanningConfig, result: KVCacheConfig, num_blocks: int) -> KVCacheConfig:
        if len(result.kv_cache_groups) < 2:
            return attrs.evolve(
                result,
                kv_cache_groups=[
                    attrs.evolve(g, enable_kv_transfer=False) for g in result.kv_cache_groups
                ],
            )
        return attrs.evolve(result, kv_cache_groups=list(result.kv_cache_groups)[::-1])


@member_of("all")
class SizeOneBlockTooBig(_Placement):
    """Sizes the backing for one block more than asked."""

    CAUGHT_BY = "KV-PLACE-BACKING-SIZE"

    def fix(self, config: PlanningConfig, result: KVCacheConfig, num_blocks: int) -> KVCacheConfig:
        bpb = result.device_size // num_blocks
        return _change_tensors(result, lambda t: attrs.evolve(t, size=t.size + bpb), _on_device)


@member_of("all")
class ConstantHeader(_Placement):
    """Reserves a 256-byte header before every tensor."""

    CAUGHT_BY = "KV-PLACE-BACKING-SIZE"

    def fix(self, config: PlanningConfig, result: KVCacheConfig, num_blocks: int) -> KVCacheConfig:
        return _change_tensors(
            result, lambda t: attrs.evolve(t, size=t.size + 256, offset=t.offset + 256), _on_device
        )


@member_of("all")
class AbsurdSize(_Placement):
    """Claims a 2**60-byte backing."""

    CAUGHT_BY = "KV-PLACE-SIZE-BOUND"

    def fix(self, config: PlanningConfig, result: KVCacheConfig, num_blocks: int) -> KVCacheConfig:
        return _change_tensors(result, lambda t: attrs.evolve(t, size=2**60), _on_device)


@member_of("all", "reproduced")
class OverlappingBlocks(_Placement):
    """Halves the block stride in layer-outer layouts, so neighbouring blocks overlap."""

    CAUGHT_BY = "KV-PLACE-NO-BLOCK-ALIAS"
    #: The overlap comes from a block stride the layout does not fix; placed beside host groups it
    #: is the same overlap there; half an aligned layer's stride is no longer a multiple of its
    #: block_stride_alignment.
    ALSO = frozenset(
        {"KV-PLACE-PAGE-PITCH", "KV-HOST-DEVICE-SAFE", "KV-HOST-NO-ALIAS", "KV-PLACE-ALIGNMENT"}
    )

    def fix(self, config: PlanningConfig, result: KVCacheConfig, num_blocks: int) -> KVCacheConfig:
        if config.kv_cache_layout.is_block_outermost or num_blocks < 2:
            return result
        return _change_tensors(
            result,
            lambda t: attrs.evolve(t, block_stride=max(t.block_stride // 2 // 16 * 16, 16)),
            lambda t: t.block_stride >= 32,
        )


@member_of("all")
class OverlappingLayers(_Placement):
    """Halves the layer stride in block-outermost layouts, so a block's layers overlap."""

    CAUGHT_BY = "KV-PLACE-NO-LAYER-OVERLAP"
    #: The overlap comes from a layer stride the layout does not fix; placed beside host groups it
    #: is the same overlap there.
    ALSO = frozenset({"KV-PLACE-PAGE-PITCH", "KV-HOST-DEVICE-SAFE", "KV-HOST-NO-ALIAS"})

    def fix(self, config: PlanningConfig, result: KVCacheConfig, num_blocks: int) -> KVCacheConfig:
        if not config.kv_cache_layout.is_block_outermost:
            return result
        return _change_tensors(
            result,
            lambda t: attrs.evolve(t, layer_stride=t.layer_stride // 2 // 16 * 16),
            lambda t: len(t.layers) > 1 and t.layer_stride >= 32,
        )


@member_of("all")
class OutOfBoundsOffset(_Placement):
    """Starts the last tensor at the end of the backing."""

    CAUGHT_BY = "KV-PLACE-IN-BOUNDS"
    #: Beside host groups the same page runs past the backing.
    ALSO = frozenset({"KV-HOST-DEVICE-SAFE"})

    def fix(self, config: PlanningConfig, result: KVCacheConfig, num_blocks: int) -> KVCacheConfig:
        tensors = list(result.kv_cache_tensors)
        if tensors[-1].host_resident:
            return result
        tensors[-1] = attrs.evolve(tensors[-1], offset=tensors[-1].size)
        return _with_tensors(result, tensors)


@member_of("all")
class LayerInTwoTensors(_Placement):
    """Emits the first tensor twice."""

    CAUGHT_BY = "KV-PLACE-LAYER-ONCE"

    def fix(self, config: PlanningConfig, result: KVCacheConfig, num_blocks: int) -> KVCacheConfig:
        tensors = list(result.kv_cache_tensors)
        return _with_tensors(result, [tensors[0], *tensors])


@member_of("all")
class MissingTensor(_Placement):
    """Drops the last device tensor."""

    CAUGHT_BY = "KV-PLACE-LAYER-MISSING"

    def fix(self, config: PlanningConfig, result: KVCacheConfig, num_blocks: int) -> KVCacheConfig:
        device = [t for t in result.kv_cache_tensors if not t.host_resident]
        host = [t for t in result.kv_cache_tensors if t.host_resident]
        return _with_tensors(result, host + device[:-1])


@member_of("all")
class MisalignedStride(_Placement):
    """Steps one byte more than a page per block in LBNHC/LBHNC, so typed views misalign."""

    CAUGHT_BY = "KV-PLACE-TYPED-VIEWS"
    #: A misaligned stride is also not the stride the layout fixes.
    ALSO = frozenset({"KV-PLACE-PAGE-PITCH"})

    def fix(self, config: PlanningConfig, result: KVCacheConfig, num_blocks: int) -> KVCacheConfig:
        device = result.device_tensors
        layout = config.kv_cache_layout
        same = {(t.block_stride, t.offset, t.layer_stride) for t in device}
        if not (layout.is_block_compact and layout.is_layer_compact) or len(same) != 1:
            return result
        aligned = [s.get_block_stride_alignment() for s in result.layer_specs().values()]
        if any(a > 1 for a in aligned):
            return result  # keep to the one bug: stepping off alignment is another invariant
        ((block_stride, offset, layer_stride),) = same
        if offset != 0 or layer_stride != block_stride * num_blocks:
            return result
        stride = block_stride + 1
        widest = max(len(t.layers) for t in device)
        return _change_tensors(
            result,
            lambda t: attrs.evolve(
                t,
                block_stride=stride,
                layer_stride=stride * num_blocks,
                size=widest * stride * num_blocks,
            ),
            _on_device,
        )


@member_of("all")
class AttentionFreeZeroBlocks(_Base):
    """Returns zero blocks for an attention-free model."""

    CAUGHT_BY = "KV-PLACE-ATTENTION-FREE"

    def get_kv_cache_config_from_groups(
        self, config: PlanningConfig, kv_cache_groups: Sequence[KVCacheGroupSpec], num_blocks: int
    ) -> KVCacheConfig:
        result = super().get_kv_cache_config_from_groups(config, kv_cache_groups, num_blocks)
        return attrs.evolve(result, num_blocks=0) if not kv_cache_groups else result


@member_of("all")
class LyingPoolBytes(_Base):
    """Declares half the device bytes per block it really places."""

    CAUGHT_BY = "KV-PLACE-POOL-BYTES"

    def _get_pool_bytes_per_block(
        self, config: PlanningConfig, kv_cache_groups: Sequence[KVCacheGroupSpec]
    ) -> int | None:
        probe = super().get_kv_cache_config_from_groups(config, kv_cache_groups, 2)
        return max(probe.device_size // 4, 1)


@member_of("all")
class PoolBytesClearsGroups(_Base):
    """Empties the group list it is asked about in ``_get_pool_bytes_per_block``.

    Core asks the hook about the groups it then places: a hook that changes
    them changes what Core places next (contract.md#hook-purity).
    """

    CAUGHT_BY = "KV-PLACE-INPUT-UNCHANGED"

    def _get_pool_bytes_per_block(
        self, config: PlanningConfig, kv_cache_groups: Sequence[KVCacheGroupSpec]
    ) -> int | None:
        answer = super()._get_pool_bytes_per_block(config, kv_cache_groups)
        if isinstance(kv_cache_groups, list):
            kv_cache_groups.clear()
        return answer


@member_of("all")
class HostTensorOnDevice(_Placement):
    """Marks host-resident tensors as device tensors."""

    CAUGHT_BY = "KV-HOST-TENSORS"
    #: Host layers placed in device tensors break the device placement itself
    #: (their pages then share device bytes with device layers' pages).
    ALSO = frozenset(
        {
            "KV-PLACE-IN-BOUNDS",
            "KV-PLACE-NO-BLOCK-ALIAS",
            "KV-PLACE-NO-LAYER-OVERLAP",
            "KV-PLACE-PAGE-PITCH",
            "KV-PLACE-SINGLE-BACKING",
            "KV-PLACE-SIZE-BOUND",
            "KV-PLACE-UNKNOWN-LAYER",
        }
    )

    def fix(self, config: PlanningConfig, result: KVCacheConfig, num_blocks: int) -> KVCacheConfig:
        return _change_tensors(result, lambda t: attrs.evolve(t, host_resident=False))


@member_of("all")
class HostCountedOnDevice(_Placement):
    """Grows the device backing by the host pages when host groups exist."""

    CAUGHT_BY = "KV-HOST-EXCLUDED"
    #: Host pages counted on the device make the device backing larger than its
    #: layers, and than ``num_blocks`` device blocks.
    ALSO = frozenset({"KV-PLACE-SIZE-BOUND", "KV-PLACE-BACKING-SIZE"})

    def fix(self, config: PlanningConfig, result: KVCacheConfig, num_blocks: int) -> KVCacheConfig:
        host = [t for t in result.kv_cache_tensors if t.host_resident]
        if not host:
            return result
        extra = host[0].size
        return _change_tensors(result, lambda t: attrs.evolve(t, size=t.size + extra), _on_device)


@member_of("all", "reproduced")
class HostSizedByDeviceBlocks(_Placement):
    """Makes host backings one byte short of their host blocks."""

    CAUGHT_BY = "KV-HOST-SIZED"

    def fix(self, config: PlanningConfig, result: KVCacheConfig, num_blocks: int) -> KVCacheConfig:
        return _change_tensors(result, lambda t: attrs.evolve(t, size=t.size - 1), _on_host)


@member_of("all")
class UnknownLayer(_Grouping):
    """Adds a group for a layer the model does not have."""

    CAUGHT_BY = "KV-GROUP-UNKNOWN-LAYER"

    def regroup(self, config: PlanningConfig, kv_cache_spec: Specs, groups: Groups) -> Groups:
        if groups:
            first = groups[0]
            groups.append(
                KVCacheGroupSpec(
                    layer_names=["ghost.attn"], kv_cache_spec=first.layer_spec(first.layer_names[0])
                )
            )
        return groups


@member_of("all")
class WrapperMissesLayer(_Grouping):
    """Wraps the first group's spec over all but its last layer."""

    CAUGHT_BY = "KV-GROUP-WRAPPER"

    def regroup(self, config: PlanningConfig, kv_cache_spec: Specs, groups: Groups) -> Groups:
        from kvref import UniformTypeKVCacheSpecs

        if groups and len(groups[0].layer_names) >= 2:
            g = groups[0]
            wrapper = UniformTypeKVCacheSpecs(
                kv_cache_specs={n: g.layer_spec(n) for n in g.layer_names[:-1]}
            )
            groups[0] = attrs.evolve(g, kv_cache_spec=wrapper)
        return groups


@member_of("all")
class MixedBlockSizes(_Grouping):
    """Gives the last layer of the first group twice the block size of the others."""

    CAUGHT_BY = "KV-GROUP-ONE-BLOCK-SIZE"

    def regroup(self, config: PlanningConfig, kv_cache_spec: Specs, groups: Groups) -> Groups:
        from kvref import MambaSpec, UniformTypeKVCacheSpecs

        for i, g in enumerate(groups):
            last = g.layer_names[-1]
            spec = g.layer_spec(last)
            if (
                len(g.layer_names) < 2
                or isinstance(spec, MambaSpec)
                or getattr(spec, "page_size_padded", None) is not None
                or getattr(spec, "alignment", None) is not None
            ):
                continue
            specs = {n: g.layer_spec(n) for n in g.layer_names}
            specs[last] = attrs.evolve(spec, block_size=spec.block_size * 2)
            groups[i] = attrs.evolve(g, kv_cache_spec=UniformTypeKVCacheSpecs(kv_cache_specs=specs))
            break
        return groups


@member_of("all")
class DeclaresEngineBlockSize(_Grouping):
    """Re-wraps each uniform-type group with the deployment's block size as its own.

    The layers keep their pages; the wrapper declares ``config.block_size``
    (twice the layers' where the two agree), so the group's block table counts
    tokens in blocks its layers' pages do not hold.
    """

    CAUGHT_BY = "KV-GROUP-ONE-BLOCK-SIZE"

    def regroup(self, config: PlanningConfig, kv_cache_spec: Specs, groups: Groups) -> Groups:
        from kvref import UniformTypeKVCacheSpecs

        for i, g in enumerate(groups):
            spec = g.kv_cache_spec
            if not isinstance(spec, UniformTypeKVCacheSpecs):
                continue
            engine = config.block_size
            declared = engine if engine and engine != spec.block_size else 2 * spec.block_size
            wrapper = UniformTypeKVCacheSpecs(
                kv_cache_specs=dict(spec.kv_cache_specs), declared_block_size=declared
            )
            groups[i] = attrs.evolve(g, kv_cache_spec=wrapper)
        return groups


@member_of("all")
class GhostTensor(_Placement):
    """Emits an extra tensor for a layer no group has."""

    CAUGHT_BY = "KV-PLACE-UNKNOWN-LAYER"

    def fix(self, config: PlanningConfig, result: KVCacheConfig, num_blocks: int) -> KVCacheConfig:
        device = result.device_tensors
        if not device:
            return result
        ghost = attrs.evolve(device[0], layers=["ghost.attn"])
        return _with_tensors(result, [*result.kv_cache_tensors, ghost])


@member_of("all")
class TwoBackingSizes(_Placement):
    """Gives the second device tensor a backing one byte larger."""

    CAUGHT_BY = "KV-PLACE-SINGLE-BACKING"

    def fix(self, config: PlanningConfig, result: KVCacheConfig, num_blocks: int) -> KVCacheConfig:
        tensors = list(result.kv_cache_tensors)
        device = [i for i, t in enumerate(tensors) if not t.host_resident]
        if len(device) < 2:
            return result
        i = device[1]
        tensors[i] = attrs.evolve(tensors[i], size=tensors[i].size + 1)
        return _with_tensors(result, tensors)


@member_of("all")
class HalfUsedBlocks(_Placement):
    """In block-outermost layouts, doubles the backing but keeps stepping the old block size."""

    CAUGHT_BY = "KV-PLACE-BLOCK-STRIDE"

    def fix(self, config: PlanningConfig, result: KVCacheConfig, num_blocks: int) -> KVCacheConfig:
        if not config.kv_cache_layout.is_block_outermost:
            return result
        return _change_tensors(result, lambda t: attrs.evolve(t, size=t.size * 2), _on_device)


@member_of("all")
class MutatesGroupList(_Base):
    """Reverses the list of groups it was given, in place."""

    CAUGHT_BY = "KV-PLACE-INPUT-UNCHANGED"

    def get_kv_cache_config_from_groups(
        self, config: PlanningConfig, kv_cache_groups: Sequence[KVCacheGroupSpec], num_blocks: int
    ) -> KVCacheConfig:
        result = super().get_kv_cache_config_from_groups(config, kv_cache_groups, num_blocks)
        if isinstance(kv_cache_groups, list) and len(kv_cache_groups) > 1:
            kv_cache_groups.reverse()
        return result


@member_of("all")
class StatefulPlacement(_Base):
    """Counts its placements in prefix_cache_retention_interval."""

    CAUGHT_BY = "KV-PLACE-DETERMINISTIC"
    #: The count is not the interval the engine was started with.
    ALSO = frozenset({"KV-PLACE-RETENTION"})

    def __init__(self) -> None:
        self.calls = 0

    def get_kv_cache_config_from_groups(
        self, config: PlanningConfig, kv_cache_groups: Sequence[KVCacheGroupSpec], num_blocks: int
    ) -> KVCacheConfig:
        self.calls += 1
        result = super().get_kv_cache_config_from_groups(config, kv_cache_groups, num_blocks)
        return attrs.evolve(result, prefix_cache_retention_interval=self.calls)


@member_of("all")
class SwappedLayers(_Placement):
    """Swaps the last layers of two same-shaped tensors of different groups."""

    CAUGHT_BY = "KV-PLACE-TENSOR-ONE-SPEC"

    def fix(self, config: PlanningConfig, result: KVCacheConfig, num_blocks: int) -> KVCacheConfig:
        owner = {n: i for i, g in enumerate(result.kv_cache_groups) for n in g.layer_names}
        tensors = list(result.kv_cache_tensors)
        shape = {
            i: (t.size, t.layer_stride, t.block_stride, t.offset, len(t.layers), t.host_resident)
            for i, t in enumerate(tensors)
        }
        for i in range(len(tensors)):
            for j in range(i + 1, len(tensors)):
                a, b = tensors[i], tensors[j]
                if shape[i] == shape[j] and owner.get(a.layers[-1]) != owner.get(b.layers[-1]):
                    tensors[i] = attrs.evolve(a, layers=[*a.layers[:-1], b.layers[-1]])
                    tensors[j] = attrs.evolve(b, layers=[*b.layers[:-1], a.layers[-1]])
                    return _with_tensors(result, tensors)
        return result


@member_of("all")
class IgnoresAlignment(_Regiven):
    """Places every layer as if no backend asked for a block-stride alignment."""

    CAUGHT_BY = "KV-PLACE-ALIGNMENT"
    #: The unaligned stride is also not the stride the layout fixes.
    ALSO = frozenset({"KV-PLACE-PAGE-PITCH"})
    #: Aligned layers come from few families: 25 examples at seed 11 meet none.
    EXAMPLES = 50

    def regive(self, config: PlanningConfig, kv_cache_groups: Sequence[KVCacheGroupSpec]) -> Groups:
        def strip(spec: KVCacheSpec) -> KVCacheSpec:
            return attrs.evolve(spec, block_stride_alignment=None)

        return [_with_layer_specs(g, strip) for g in kv_cache_groups]


@member_of("all")
class ConstructsOnce(_Base):
    """Holds an exclusive resource while alive: a second live instance cannot be made.

    Core and the kit make fresh builders while an earlier one is still in
    use, as vLLM does; this constructor refuses that.
    """

    CAUGHT_BY = "KV-CALL-CONSTRUCT"
    held = 0

    def __init__(self) -> None:
        if type(self).held:
            raise RuntimeError("the builder's resource is already taken")
        type(self).held += 1
        self.holds = True

    def __del__(self) -> None:
        # An instance whose construction failed never held the resource.
        if getattr(self, "holds", False):
            type(self).held -= 1


@member_of("all")
class SharedInstance(_Base):
    """Hands out one shared object: every construction after the first returns it."""

    CAUGHT_BY = "KV-CALL-FRESH"

    shared: Any = None

    def __new__(cls) -> Any:
        if cls.shared is None:
            cls.shared = super().__new__(cls)
        return cls.shared


@member_of("all")
class HiSparsePoolShort(_Base):
    """Plans HiSparse's host pool one host block short of what host_pool_bytes holds."""

    CAUGHT_BY = "KV-HOST-HISPARSE-POOL"

    def get_kv_cache_config_from_groups(
        self, config: PlanningConfig, kv_cache_groups: Sequence[KVCacheGroupSpec], num_blocks: int
    ) -> KVCacheConfig:
        from kvref.errors import HiSparseError

        result = super().get_kv_cache_config_from_groups(config, kv_cache_groups, num_blocks)
        stride, pool = result.host_block_stride, config.host_pool_bytes
        if config.hisparse is None or stride is None or pool is None:
            return result
        try:
            smaller = attrs.evolve(config, host_pool_bytes=pool - stride)
            return super().get_kv_cache_config_from_groups(smaller, kv_cache_groups, num_blocks)
        except HiSparseError:
            return result  # one block fewer would not hold a request: no room to be wrong
