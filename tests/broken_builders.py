"""Deliberately broken builders: one bug each, for the kit's meta-tests.

Each class says which invariant is meant to catch it in ``CAUGHT_BY``.  They
start from the reference and break one promise, so any other failure the kit
reports for them is noise to be fixed in the kit.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from kvref import (
    KVCacheConfig,
    KVCacheGroupSpec,
    PlanningConfig,
    ReferenceKVCacheConfigBuilder,
)
from kvref.specs import KVCacheSpec

if TYPE_CHECKING:
    from conformance.report.model import Report

Groups = list[KVCacheGroupSpec]


class _Base(ReferenceKVCacheConfigBuilder):
    CAUGHT_BY = ""
    #: Invariants that see the same bug from another side (a stride that both
    #: overlaps and is not the layout's, the same page beside host groups).
    ALSO: frozenset[str] = frozenset()
    #: Examples the meta-test needs to meet the bug at its seed.
    EXAMPLES = 25


def _with_tensors(config: KVCacheConfig, tensors: Sequence[Any], **changes: Any) -> KVCacheConfig:
    return attrs.evolve(config, kv_cache_tensors=list(tensors), **changes)


class DroppedLayer(_Base):
    """Forgets the last layer of the largest group."""

    CAUGHT_BY = "KV-GROUP-PARTITION"

    def get_kv_cache_groups(
        self, config: PlanningConfig, kv_cache_spec: Mapping[str, KVCacheSpec]
    ) -> Groups:
        groups = super().get_kv_cache_groups(config, kv_cache_spec)
        if not groups:
            return groups
        i = max(range(len(groups)), key=lambda k: len(groups[k].layer_names))
        g = groups[i]
        if len(g.layer_names) == 1:
            return groups[:i] + groups[i + 1 :]
        names = list(g.layer_names[:-1])
        spec = g.kv_cache_spec
        from kvref import UniformTypeKVCacheSpecs

        if isinstance(spec, UniformTypeKVCacheSpecs):
            spec = UniformTypeKVCacheSpecs(
                kv_cache_specs={n: spec.kv_cache_specs[n] for n in names}
            )
        groups[i] = attrs.evolve(g, layer_names=names, kv_cache_spec=spec)
        return groups


class DuplicatedLayer(_Base):
    """Puts the first layer into a second, extra group as well."""

    CAUGHT_BY = "KV-GROUP-PARTITION"

    def get_kv_cache_groups(
        self, config: PlanningConfig, kv_cache_spec: Mapping[str, KVCacheSpec]
    ) -> Groups:
        groups = super().get_kv_cache_groups(config, kv_cache_spec)
        if not groups:
            return groups
        name = groups[0].layer_names[0]
        return [
            *groups,
            KVCacheGroupSpec(layer_names=[name], kv_cache_spec=groups[0].layer_spec(name)),
        ]


class RepeatedInGroup(_Base):
    """Lists the first layer of the first group twice in that group."""

    CAUGHT_BY = "KV-GROUP-REPEATED-LAYER"

    def get_kv_cache_groups(
        self, config: PlanningConfig, kv_cache_spec: Mapping[str, KVCacheSpec]
    ) -> Groups:
        groups = super().get_kv_cache_groups(config, kv_cache_spec)
        if groups:
            g = groups[0]
            groups[0] = attrs.evolve(g, layer_names=[*g.layer_names, g.layer_names[0]])
        return groups


class EmptyGroup(_Base):
    """Appends a group with no layers."""

    CAUGHT_BY = "KV-GROUP-NONEMPTY"

    def get_kv_cache_groups(
        self, config: PlanningConfig, kv_cache_spec: Mapping[str, KVCacheSpec]
    ) -> Groups:
        groups = super().get_kv_cache_groups(config, kv_cache_spec)
        if groups:
            groups.append(attrs.evolve(groups[-1], layer_names=[]))
        return groups


class DroppedHeads(_Base):
    """Halves the KV heads of every plain attention group: the layers lose half their cache."""

    CAUGHT_BY = "KV-GROUP-LAYER-SPEC"

    def get_kv_cache_groups(
        self, config: PlanningConfig, kv_cache_spec: Mapping[str, KVCacheSpec]
    ) -> Groups:
        from kvref import AttentionSpec

        groups = super().get_kv_cache_groups(config, kv_cache_spec)
        out = []
        for g in groups:
            spec = g.kv_cache_spec
            if (
                isinstance(spec, AttentionSpec)
                and spec.num_kv_heads % 2 == 0
                and spec.num_head_slots is None
                and spec.page_size_padded is None
                and getattr(spec, "alignment", None) is None
            ):
                spec = attrs.evolve(spec, num_kv_heads=spec.num_kv_heads // 2)
            out.append(attrs.evolve(g, kv_cache_spec=spec))
        return out


class Stateful(_Base):
    """Returns the groups in reverse order from its second call on."""

    CAUGHT_BY = "KV-GROUP-DETERMINISTIC"

    def __init__(self) -> None:
        self.calls = 0

    def get_kv_cache_groups(
        self, config: PlanningConfig, kv_cache_spec: Mapping[str, KVCacheSpec]
    ) -> Groups:
        self.calls += 1
        groups = super().get_kv_cache_groups(config, kv_cache_spec)
        return groups[::-1] if self.calls > 1 else groups


class MutatesInput(_Base):
    """Empties the dict of layer specs it was given."""

    CAUGHT_BY = "KV-GROUP-INPUT-UNCHANGED"

    def get_kv_cache_groups(
        self, config: PlanningConfig, kv_cache_spec: Mapping[str, KVCacheSpec]
    ) -> Groups:
        groups = super().get_kv_cache_groups(config, kv_cache_spec)
        if isinstance(kv_cache_spec, dict):
            kv_cache_spec.clear()
        return groups


class RaisesOnValidInput(_Base):
    """Raises on any model with more than two layers."""

    CAUGHT_BY = "KV-CALL-RAISES"

    def get_kv_cache_groups(
        self, config: PlanningConfig, kv_cache_spec: Mapping[str, KVCacheSpec]
    ) -> Groups:
        if len(kv_cache_spec) > 2:
            raise RuntimeError("unsupported model")
        return super().get_kv_cache_groups(config, kv_cache_spec)


class WrongReturnType(_Base):
    """Returns the config as a plain dict."""

    CAUGHT_BY = "KV-CALL-RETURN-TYPE"

    def get_kv_cache_config_from_groups(
        self, config: PlanningConfig, kv_cache_groups: Sequence[KVCacheGroupSpec], num_blocks: int
    ) -> Any:
        return attrs.asdict(
            super().get_kv_cache_config_from_groups(config, kv_cache_groups, num_blocks)
        )


def assert_caught(report: Report, meant: str, also: frozenset[str]) -> None:
    """``meant`` failed with a counterexample and a reproduce line; nothing unmeant failed.

    The same assertions as tests/test_meta.py's, so that a builder proven here
    need not be run there again in the default suite.
    """
    failed = set(report.failed_ids)
    assert meant in failed, failed
    assert failed <= {meant} | also, failed
    failure = next(r for r in report.failures if r.id == meant)
    assert failure.violations and failure.counterexample and failure.counterexample_python
    assert failure.reproduce and meant in failure.reproduce


def meta_timeout(builder: type) -> float:
    """The per-call deadline the meta runs give ``builder``: short only for the one that hangs.

    A tight deadline for every builder made honest calls time out on a cold or
    loaded machine (a fresh-clone CI run failed GroupsNotEchoed that way, H2 and
    H4 saw it under load), which reads as a second, unmeant failure.  Used by
    tests/test_meta.py and tests/test_reproduce.py, whose runs must match.
    """
    return 0.5 if getattr(builder, "CAUGHT_BY", None) == "KV-CALL-TIMEOUT" else 5.0


class Hangs(_Base):
    """Never returns from placement."""

    CAUGHT_BY = "KV-CALL-TIMEOUT"

    def get_kv_cache_config_from_groups(
        self, config: PlanningConfig, kv_cache_groups: Sequence[KVCacheGroupSpec], num_blocks: int
    ) -> KVCacheConfig:
        time.sleep(3600)
        raise AssertionError("unreachable")


class _Placement(_Base):
    def fix(self, config: PlanningConfig, result: KVCacheConfig, num_blocks: int) -> KVCacheConfig:
        raise NotImplementedError

    def get_kv_cache_config_from_groups(
        self, config: PlanningConfig, kv_cache_groups: Sequence[KVCacheGroupSpec], num_blocks: int
    ) -> KVCacheConfig:
        result = super().get_kv_cache_config_from_groups(config, kv_cache_groups, num_blocks)
        if not result.kv_cache_tensors:
            return result
        return self.fix(config, result, num_blocks)


class WrongNumBlocks(_Placement):
    """Reports one block more than it placed."""

    CAUGHT_BY = "KV-PLACE-NUM-BLOCKS"

    def fix(self, config: PlanningConfig, result: KVCacheConfig, num_blocks: int) -> KVCacheConfig:
        return attrs.evolve(result, num_blocks=num_blocks + 1)


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


class SizeOneBlockTooBig(_Placement):
    """Sizes the backing for one block more than asked."""

    CAUGHT_BY = "KV-PLACE-BACKING-SIZE"

    def fix(self, config: PlanningConfig, result: KVCacheConfig, num_blocks: int) -> KVCacheConfig:
        bpb = result.device_size // num_blocks
        return _with_tensors(
            result,
            [
                t if t.host_resident else attrs.evolve(t, size=t.size + bpb)
                for t in result.kv_cache_tensors
            ],
        )


class ConstantHeader(_Placement):
    """Reserves a 256-byte header before every tensor."""

    CAUGHT_BY = "KV-PLACE-BACKING-SIZE"

    def fix(self, config: PlanningConfig, result: KVCacheConfig, num_blocks: int) -> KVCacheConfig:
        return _with_tensors(
            result,
            [
                t if t.host_resident else attrs.evolve(t, size=t.size + 256, offset=t.offset + 256)
                for t in result.kv_cache_tensors
            ],
        )


class AbsurdSize(_Placement):
    """Claims a 2**60-byte backing."""

    CAUGHT_BY = "KV-PLACE-SIZE-BOUND"

    def fix(self, config: PlanningConfig, result: KVCacheConfig, num_blocks: int) -> KVCacheConfig:
        return _with_tensors(
            result,
            [
                t if t.host_resident else attrs.evolve(t, size=2**60)
                for t in result.kv_cache_tensors
            ],
        )


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
        return _with_tensors(
            result,
            [
                attrs.evolve(t, block_stride=max(t.block_stride // 2 // 16 * 16, 16))
                if t.block_stride >= 32
                else t
                for t in result.kv_cache_tensors
            ],
        )


class OverlappingLayers(_Placement):
    """Halves the layer stride in block-outermost layouts, so a block's layers overlap."""

    CAUGHT_BY = "KV-PLACE-NO-LAYER-OVERLAP"
    #: The overlap comes from a layer stride the layout does not fix; placed beside host groups it
    #: is the same overlap there.
    ALSO = frozenset({"KV-PLACE-PAGE-PITCH", "KV-HOST-DEVICE-SAFE", "KV-HOST-NO-ALIAS"})

    def fix(self, config: PlanningConfig, result: KVCacheConfig, num_blocks: int) -> KVCacheConfig:
        if not config.kv_cache_layout.is_block_outermost:
            return result
        return _with_tensors(
            result,
            [
                attrs.evolve(t, layer_stride=t.layer_stride // 2 // 16 * 16)
                if len(t.layers) > 1 and t.layer_stride >= 32
                else t
                for t in result.kv_cache_tensors
            ],
        )


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


class LayerInTwoTensors(_Placement):
    """Emits the first tensor twice."""

    CAUGHT_BY = "KV-PLACE-LAYER-ONCE"

    def fix(self, config: PlanningConfig, result: KVCacheConfig, num_blocks: int) -> KVCacheConfig:
        tensors = list(result.kv_cache_tensors)
        return _with_tensors(result, [tensors[0], *tensors])


class MissingTensor(_Placement):
    """Drops the last device tensor."""

    CAUGHT_BY = "KV-PLACE-LAYER-MISSING"

    def fix(self, config: PlanningConfig, result: KVCacheConfig, num_blocks: int) -> KVCacheConfig:
        device = [t for t in result.kv_cache_tensors if not t.host_resident]
        host = [t for t in result.kv_cache_tensors if t.host_resident]
        return _with_tensors(result, host + device[:-1])


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
        return _with_tensors(
            result,
            [
                t
                if t.host_resident
                else attrs.evolve(
                    t,
                    block_stride=stride,
                    layer_stride=stride * num_blocks,
                    size=widest * stride * num_blocks,
                )
                for t in result.kv_cache_tensors
            ],
        )


class AttentionFreeZeroBlocks(_Base):
    """Returns zero blocks for an attention-free model."""

    CAUGHT_BY = "KV-PLACE-ATTENTION-FREE"

    def get_kv_cache_config_from_groups(
        self, config: PlanningConfig, kv_cache_groups: Sequence[KVCacheGroupSpec], num_blocks: int
    ) -> KVCacheConfig:
        result = super().get_kv_cache_config_from_groups(config, kv_cache_groups, num_blocks)
        return attrs.evolve(result, num_blocks=0) if not kv_cache_groups else result


class LyingPoolBytes(_Base):
    """Declares half the device bytes per block it really places."""

    CAUGHT_BY = "KV-PLACE-POOL-BYTES"

    def _get_pool_bytes_per_block(
        self, config: PlanningConfig, kv_cache_groups: Sequence[KVCacheGroupSpec]
    ) -> int | None:
        probe = super().get_kv_cache_config_from_groups(config, kv_cache_groups, 2)
        return max(probe.device_size // 4, 1)


class HostTensorOnDevice(_Placement):
    """Marks host-resident tensors as device tensors."""

    CAUGHT_BY = "KV-HOST-TENSORS"
    #: Host layers placed in device tensors break the device placement itself.
    ALSO = frozenset(
        {
            "KV-PLACE-IN-BOUNDS",
            "KV-PLACE-NO-BLOCK-ALIAS",
            "KV-PLACE-PAGE-PITCH",
            "KV-PLACE-SINGLE-BACKING",
            "KV-PLACE-SIZE-BOUND",
            "KV-PLACE-UNKNOWN-LAYER",
        }
    )

    def fix(self, config: PlanningConfig, result: KVCacheConfig, num_blocks: int) -> KVCacheConfig:
        return _with_tensors(
            result, [attrs.evolve(t, host_resident=False) for t in result.kv_cache_tensors]
        )


class HostCountedOnDevice(_Placement):
    """Grows the device backing by the host pages when host groups exist."""

    CAUGHT_BY = "KV-HOST-EXCLUDED"
    #: Host pages counted on the device make the device backing larger than its layers.
    ALSO = frozenset({"KV-PLACE-SIZE-BOUND"})

    def fix(self, config: PlanningConfig, result: KVCacheConfig, num_blocks: int) -> KVCacheConfig:
        host = [t for t in result.kv_cache_tensors if t.host_resident]
        if not host:
            return result
        extra = host[0].size
        return _with_tensors(
            result,
            [
                t if t.host_resident else attrs.evolve(t, size=t.size + extra)
                for t in result.kv_cache_tensors
            ],
        )


class HostSizedByDeviceBlocks(_Placement):
    """Makes host backings one byte short of their host blocks."""

    CAUGHT_BY = "KV-HOST-SIZED"

    def fix(self, config: PlanningConfig, result: KVCacheConfig, num_blocks: int) -> KVCacheConfig:
        return _with_tensors(
            result,
            [
                attrs.evolve(t, size=t.size - 1) if t.host_resident else t
                for t in result.kv_cache_tensors
            ],
        )


class UnknownLayer(_Base):
    """Adds a group for a layer the model does not have."""

    CAUGHT_BY = "KV-GROUP-UNKNOWN-LAYER"

    def get_kv_cache_groups(
        self, config: PlanningConfig, kv_cache_spec: Mapping[str, KVCacheSpec]
    ) -> Groups:
        groups = super().get_kv_cache_groups(config, kv_cache_spec)
        if groups:
            first = groups[0]
            groups.append(
                KVCacheGroupSpec(
                    layer_names=["ghost.attn"], kv_cache_spec=first.layer_spec(first.layer_names[0])
                )
            )
        return groups


class WrapperMissesLayer(_Base):
    """Wraps the first group's spec over all but its last layer."""

    CAUGHT_BY = "KV-GROUP-WRAPPER"

    def get_kv_cache_groups(
        self, config: PlanningConfig, kv_cache_spec: Mapping[str, KVCacheSpec]
    ) -> Groups:
        from kvref import UniformTypeKVCacheSpecs

        groups = super().get_kv_cache_groups(config, kv_cache_spec)
        if groups and len(groups[0].layer_names) >= 2:
            g = groups[0]
            wrapper = UniformTypeKVCacheSpecs(
                kv_cache_specs={n: g.layer_spec(n) for n in g.layer_names[:-1]}
            )
            groups[0] = attrs.evolve(g, kv_cache_spec=wrapper)
        return groups


class MixedBlockSizes(_Base):
    """Gives the last layer of the first group twice the block size of the others."""

    CAUGHT_BY = "KV-GROUP-ONE-BLOCK-SIZE"

    def get_kv_cache_groups(
        self, config: PlanningConfig, kv_cache_spec: Mapping[str, KVCacheSpec]
    ) -> Groups:
        from kvref import MambaSpec, UniformTypeKVCacheSpecs

        groups = super().get_kv_cache_groups(config, kv_cache_spec)
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


class GhostTensor(_Placement):
    """Emits an extra tensor for a layer no group has."""

    CAUGHT_BY = "KV-PLACE-UNKNOWN-LAYER"

    def fix(self, config: PlanningConfig, result: KVCacheConfig, num_blocks: int) -> KVCacheConfig:
        device = result.device_tensors
        if not device:
            return result
        ghost = attrs.evolve(device[0], layers=["ghost.attn"])
        return _with_tensors(result, [*result.kv_cache_tensors, ghost])


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


class HalfUsedBlocks(_Placement):
    """In block-outermost layouts, doubles the backing but keeps stepping the old block size."""

    CAUGHT_BY = "KV-PLACE-BLOCK-STRIDE"

    def fix(self, config: PlanningConfig, result: KVCacheConfig, num_blocks: int) -> KVCacheConfig:
        if not config.kv_cache_layout.is_block_outermost:
            return result
        return _with_tensors(
            result,
            [
                t if t.host_resident else attrs.evolve(t, size=t.size * 2)
                for t in result.kv_cache_tensors
            ],
        )


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


class StatefulPlacement(_Base):
    """Counts its placements in prefix_cache_retention_interval."""

    CAUGHT_BY = "KV-PLACE-DETERMINISTIC"

    def __init__(self) -> None:
        self.calls = 0

    def get_kv_cache_config_from_groups(
        self, config: PlanningConfig, kv_cache_groups: Sequence[KVCacheGroupSpec], num_blocks: int
    ) -> KVCacheConfig:
        self.calls += 1
        result = super().get_kv_cache_config_from_groups(config, kv_cache_groups, num_blocks)
        return attrs.evolve(result, prefix_cache_retention_interval=self.calls)


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


class IgnoresAlignment(_Base):
    """Places every layer as if no backend asked for a block-stride alignment."""

    CAUGHT_BY = "KV-PLACE-ALIGNMENT"
    #: The unaligned stride is also not the stride the layout fixes.
    ALSO = frozenset({"KV-PLACE-PAGE-PITCH"})
    #: Aligned layers come from few families: 25 examples at seed 11 meet none.
    EXAMPLES = 50

    def get_kv_cache_config_from_groups(
        self, config: PlanningConfig, kv_cache_groups: Sequence[KVCacheGroupSpec], num_blocks: int
    ) -> KVCacheConfig:
        from kvref import UniformTypeKVCacheSpecs

        def strip(spec: KVCacheSpec) -> KVCacheSpec:
            return attrs.evolve(spec, block_stride_alignment=None)

        plain = []
        for g in kv_cache_groups:
            spec = g.kv_cache_spec
            if isinstance(spec, UniformTypeKVCacheSpecs):
                spec = UniformTypeKVCacheSpecs(
                    kv_cache_specs={n: strip(s) for n, s in spec.kv_cache_specs.items()}
                )
            else:
                spec = strip(spec)
            plain.append(attrs.evolve(g, kv_cache_spec=spec))
        result = super().get_kv_cache_config_from_groups(config, plain, num_blocks)
        return attrs.evolve(result, kv_cache_groups=list(kv_cache_groups))


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


class SharedInstance(_Base):
    """Hands out one shared object: every construction after the first returns it."""

    CAUGHT_BY = "KV-CALL-FRESH"

    shared: Any = None

    def __new__(cls) -> Any:
        if cls.shared is None:
            cls.shared = super().__new__(cls)
        return cls.shared


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


ALL: tuple[type[_Base], ...] = (
    DroppedLayer,
    DuplicatedLayer,
    RepeatedInGroup,
    EmptyGroup,
    DroppedHeads,
    Stateful,
    MutatesInput,
    RaisesOnValidInput,
    WrongReturnType,
    Hangs,
    WrongNumBlocks,
    GroupsNotEchoed,
    SizeOneBlockTooBig,
    ConstantHeader,
    AbsurdSize,
    OverlappingBlocks,
    OverlappingLayers,
    OutOfBoundsOffset,
    LayerInTwoTensors,
    MissingTensor,
    MisalignedStride,
    AttentionFreeZeroBlocks,
    LyingPoolBytes,
    HostTensorOnDevice,
    HostCountedOnDevice,
    HostSizedByDeviceBlocks,
    UnknownLayer,
    WrapperMissesLayer,
    MixedBlockSizes,
    GhostTensor,
    TwoBackingSizes,
    HalfUsedBlocks,
    MutatesGroupList,
    StatefulPlacement,
    SwappedLayers,
    IgnoresAlignment,
    ConstructsOnce,
    SharedInstance,
    HiSparsePoolShort,
)


# -- issue 13: bugs the kit was blind to (tests/test_power.py measures each class) ----------


class RaisesOnEmptyGroup(_Base):
    """Reads every group's first layer: a group Core projects to no layer of a worker raises.

    Class 1 (Core-only placement paths): global groups always hold layers, so
    only groups projected to a pipeline stage that has none of their layers
    reach the bug.
    """

    CAUGHT_BY = "KV-CALL-RAISES"

    def get_kv_cache_config_from_groups(
        self, config: PlanningConfig, kv_cache_groups: Sequence[KVCacheGroupSpec], num_blocks: int
    ) -> KVCacheConfig:
        for group in kv_cache_groups:
            group.layer_spec(group.layer_names[0])  # IndexError on a projected empty group
        return super().get_kv_cache_config_from_groups(config, kv_cache_groups, num_blocks)


class DeviceAfterHost(_Placement):
    """Starts the device tensors after the host bytes of a block, as if both shared one pool.

    Class 2: the device backing keeps its size, so its last pages spill past it.
    """

    CAUGHT_BY = "KV-HOST-DEVICE-SAFE"

    def fix(self, config: PlanningConfig, result: KVCacheConfig, num_blocks: int) -> KVCacheConfig:
        blocks = result.host_num_blocks or 1
        host = sum({t.size for t in result.kv_cache_tensors if t.host_resident}) // blocks
        return _with_tensors(
            result,
            [
                t if t.host_resident else attrs.evolve(t, offset=t.offset + host)
                for t in result.kv_cache_tensors
            ],
        )


class HostBlocksAlias(_Placement):
    """Steps host blocks half a host page apart: neighbouring host blocks share bytes.

    Class 2: host backings stay in bounds, so only an overlap check of the host pool sees it.
    """

    CAUGHT_BY = "KV-HOST-NO-ALIAS"

    def fix(self, config: PlanningConfig, result: KVCacheConfig, num_blocks: int) -> KVCacheConfig:
        return _with_tensors(
            result,
            [
                attrs.evolve(t, block_stride=max(16, t.block_stride // 32 * 16))
                if t.host_resident
                else t
                for t in result.kv_cache_tensors
            ],
        )


class PoolBytesCountHost(_Base):
    """Declares device plus host bytes per block to Core's pool-bytes hook.

    Class 2 (Core's host exclusions): harmless without host-resident groups.
    """

    CAUGHT_BY = "KV-PLACE-POOL-BYTES"

    def _get_pool_bytes_per_block(
        self, config: PlanningConfig, kv_cache_groups: Sequence[KVCacheGroupSpec]
    ) -> int | None:
        probe = super().get_kv_cache_config_from_groups(config, kv_cache_groups, 1)
        host = {t.size for t in probe.kv_cache_tensors if t.host_resident}
        device = max((t.size for t in probe.kv_cache_tensors if not t.host_resident), default=0)
        if not device:
            return None  # nothing on the device: let Core probe, as the reference does
        return int(device + sum(host) // (probe.host_num_blocks or 1))


class WindowlessPromotion(_Base):
    """Allocates sliding-window layers as full attention and forgets their window.

    Class 3: the pages are the same, but kernels now attend to every token.
    """

    CAUGHT_BY = "KV-GROUP-SPEC-MEANING"

    @staticmethod
    def _full(spec: Any) -> Any:
        from kvref import FullAttentionSpec, SlidingWindowSpec

        if type(spec) is not SlidingWindowSpec:
            return spec
        keep = [
            "block_size",
            "dcp_sharded",
            "block_stride_alignment",
            "is_draft",
            "num_kv_heads",
            "head_size",
            "dtype",
            "head_size_v",
            "max_tp_shards",
            "kv_quant_mode",
            "page_size_padded",
            "num_head_slots",
            "state_content_bytes",
            "tokens_per_state",
        ]
        return FullAttentionSpec(**{k: getattr(spec, k) for k in keep})

    def get_kv_cache_groups(
        self, config: PlanningConfig, kv_cache_spec: Mapping[str, KVCacheSpec]
    ) -> Groups:
        from kvref import UniformTypeKVCacheSpecs

        out = []
        for g in super().get_kv_cache_groups(config, kv_cache_spec):
            spec = g.kv_cache_spec
            if isinstance(spec, UniformTypeKVCacheSpecs):
                spec = UniformTypeKVCacheSpecs(
                    kv_cache_specs={n: self._full(s) for n, s in spec.kv_cache_specs.items()}
                )
            else:
                spec = self._full(spec)
            out.append(attrs.evolve(g, kv_cache_spec=spec))
        return out


class SetOrderedGroups(_Base):
    """Orders the groups by iterating a set of their first layer names.

    Class 4: the order is fixed within one process but follows the string hash
    seed, so two processes (PYTHONHASHSEED) group one model differently.
    """

    CAUGHT_BY = "KV-GROUP-HASH-STABLE"

    def get_kv_cache_groups(
        self, config: PlanningConfig, kv_cache_spec: Mapping[str, KVCacheSpec]
    ) -> Groups:
        groups = super().get_kv_cache_groups(config, kv_cache_spec)
        order = list({g.layer_names[0] for g in groups})
        return sorted(groups, key=lambda g: order.index(g.layer_names[0]))


class GuardedBlocks(_Placement):
    """Leaves a guard of aligned bytes after every page in layer-outer layouts.

    Class 5: strides stay consistent, linear and memory-safe, but a kernel
    stepping blocks by the layer's (aligned) page reads the wrong bytes.
    """

    CAUGHT_BY = "KV-PLACE-PAGE-PITCH"

    def fix(self, config: PlanningConfig, result: KVCacheConfig, num_blocks: int) -> KVCacheConfig:
        import math

        layer_outer = config.kv_cache_layout.name in ("LBHNC", "LBNHC")
        if not layer_outer or config.host_resident_layers or getattr(config, "hisparse", None):
            return result  # one bug: guards only where no host pool is involved
        guard = 16
        for g in result.kv_cache_groups:
            for spec in _layer_specs(g):
                guard = math.lcm(guard, spec.get_block_stride_alignment())
        tensors, used, widest = [], 0, 0
        for t in result.kv_cache_tensors:
            if t.host_resident:
                tensors.append(t)
                continue
            if t.offset == 0:
                used = 0  # every group starts at byte 0
            stride = t.block_stride + guard
            tensors.append(
                attrs.evolve(t, block_stride=stride, layer_stride=stride * num_blocks, offset=used)
            )
            used += len(t.layers) * stride * num_blocks
            widest = max(widest, used)
        return _with_tensors(
            result,
            [t if t.host_resident else attrs.evolve(t, size=widest) for t in tensors],
        )


def _layer_specs(group: KVCacheGroupSpec) -> list[KVCacheSpec]:
    from kvref import UniformTypeKVCacheSpecs

    spec = group.kv_cache_spec
    if isinstance(spec, UniformTypeKVCacheSpecs):
        return list(spec.kv_cache_specs.values())
    return [spec]


#: One broken builder per class of issue 13 (tests/test_power.py: caught at 50 examples).
POWER: tuple[type[_Base], ...] = (
    RaisesOnEmptyGroup,
    DeviceAfterHost,
    HostBlocksAlias,
    PoolBytesCountHost,
    WindowlessPromotion,
    SetOrderedGroups,
    GuardedBlocks,
)

# Caught at the meta-tests' 25 examples (seed 11) by exactly their invariant;
# RaisesOnEmptyGroup needs Core's rare empty projections: tests/test_power.py only.
ALL = (
    *ALL,
    DeviceAfterHost,
    HostBlocksAlias,
    PoolBytesCountHost,
    WindowlessPromotion,
    SetOrderedGroups,
    GuardedBlocks,
)


# -- issue 23: bugs seen in the field --------------------------------------------------------


class ScatteredDrafts(_Base):
    """Moves the last of a group's equal-spec draft layers into a group of its own.

    Every layer keeps its spec and stays in one group, but vLLM's drafter
    asserts that its attention layers share one KV cache group.
    """

    CAUGHT_BY = "KV-GROUP-DRAFTS-TOGETHER"
    #: Two equal draft layers outside a model-declared grouping are rare at seed 11.
    EXAMPLES = 60

    def get_kv_cache_groups(
        self, config: PlanningConfig, kv_cache_spec: Mapping[str, KVCacheSpec]
    ) -> Groups:
        from kvref import UniformTypeKVCacheSpecs

        groups = super().get_kv_cache_groups(config, kv_cache_spec)
        if getattr(config, "hisparse", None) is not None:
            return groups  # HiSparse's groups carry roles: one bug, elsewhere
        for i, g in enumerate(groups):
            drafts = [n for n in g.layer_names if kv_cache_spec[n].is_draft]
            twins = [n for n in drafts if kv_cache_spec[n] == kv_cache_spec[drafts[-1]]]
            if len(twins) < 2:
                continue
            moved = twins[-1]
            kept = [n for n in g.layer_names if n != moved]
            spec = g.kv_cache_spec
            if isinstance(spec, UniformTypeKVCacheSpecs):
                spec = UniformTypeKVCacheSpecs(
                    kv_cache_specs={n: s for n, s in spec.kv_cache_specs.items() if n != moved}
                )
            groups[i] = attrs.evolve(g, layer_names=kept, kv_cache_spec=spec)
            groups.append(KVCacheGroupSpec(layer_names=[moved], kv_cache_spec=g.layer_spec(moved)))
            return groups
        return groups


class HotIgnoresDecodeQuery(_Base):
    """Sizes HiSparse's hot groups for one top-k per request, whatever the settings say.

    A field bug: the hot buffer ignores speculative decoding's query length
    and an explicit ``device_buffer_size``, so the kernels write past a
    request's hot blocks.
    """

    CAUGHT_BY = "KV-GROUP-HISPARSE-HOT-BLOCKS"

    def get_kv_cache_groups(
        self, config: PlanningConfig, kv_cache_spec: Mapping[str, KVCacheSpec]
    ) -> Groups:
        from kvref.extra_specs import HiSparseHotSpec
        from kvref.specs import MLAAttentionSpec

        groups = super().get_kv_cache_groups(config, kv_cache_spec)
        settings = getattr(config, "hisparse", None)
        widths = [
            s.topk_buffer_width or (settings.index_topk if settings else None)
            for s in kv_cache_spec.values()
            if isinstance(s, MLAAttentionSpec) and s.cache_role == "SPARSE"
        ]
        if settings is None or not widths or None in widths:
            return groups
        top_k = max(w for w in widths if w is not None)
        for i, g in enumerate(groups):
            spec = g.kv_cache_spec
            if isinstance(spec, HiSparseHotSpec):
                blocks = -(-top_k // spec.block_size)
                groups[i] = attrs.evolve(
                    g, kv_cache_spec=attrs.evolve(spec, blocks_per_request=blocks)
                )
        return groups


class RolelessSource(_Base):
    """Rebuilds HiSparse's source group without its role (vLLM then finds no host manager)."""

    CAUGHT_BY = "KV-GROUP-HISPARSE-ROLES"

    def get_kv_cache_groups(
        self, config: PlanningConfig, kv_cache_spec: Mapping[str, KVCacheSpec]
    ) -> Groups:
        groups = super().get_kv_cache_groups(config, kv_cache_spec)
        return [
            attrs.evolve(g, role="DEFAULT") if g.role == "HISPARSE_SOURCE" else g for g in groups
        ]


class InterleavedHostPool(_Placement):
    """Lays HiSparse's host pool out block-interleaved: each host block holds every source page.

    Every host page stays in bounds and apart from the others, but vLLM's
    runtime reads each source layer's host pages as one run of
    ``host_num_blocks`` pages (contract.md#hisparse-host-runs).
    """

    CAUGHT_BY = "KV-HOST-HISPARSE-RUNS"

    def fix(self, config: PlanningConfig, result: KVCacheConfig, num_blocks: int) -> KVCacheConfig:
        if config.hisparse is None:
            return result
        host = [t for t in result.kv_cache_tensors if t.host_resident]
        # One host block: the aligned page of every source layer, as LBNHC laid them out.
        block = sum(len(t.layers) * t.block_stride for t in host)
        tensors, offset = [], 0
        for t in result.kv_cache_tensors:
            if not t.host_resident:
                tensors.append(t)
                continue
            page = t.block_stride
            tensors.append(attrs.evolve(t, offset=offset, layer_stride=page, block_stride=block))
            offset += len(t.layers) * page
        return _with_tensors(result, tensors)


#: The broken builders of issue 23, each caught by its new invariant.
FIELD: tuple[type[_Base], ...] = (
    ScatteredDrafts,
    HotIgnoresDecodeQuery,
    RolelessSource,
    InterleavedHostPool,
)

ALL = (*ALL, *FIELD)


class Wraps32(_Placement):
    """Writes strides and offsets through 32-bit descriptors: ``x & 0xFFFFFFFF``.

    Right for every plan under 4 GiB; past it a layer-outer layer stride
    (``num_blocks x page``) wraps, and the layers of a tensor alias.
    """

    CAUGHT_BY = "KV-PLACE-NO-BLOCK-ALIAS"
    #: The wrapped stride also lands layers of one block on each other, and
    #: device pages beside host groups are judged by their own invariant.
    ALSO = frozenset({"KV-PLACE-NO-LAYER-OVERLAP", "KV-HOST-DEVICE-SAFE"})
    EXAMPLES = 50

    def fix(self, config: PlanningConfig, result: KVCacheConfig, num_blocks: int) -> KVCacheConfig:
        wrap = 0xFFFFFFFF
        return _with_tensors(
            result,
            [
                attrs.evolve(
                    t,
                    offset=t.offset & wrap,
                    layer_stride=t.layer_stride & wrap,
                    block_stride=t.block_stride & wrap,
                )
                for t in result.kv_cache_tensors
            ],
        )


class DensePadded(_Placement):
    """Steps a padded page's blocks by its dense bytes, as if no backend padded pages.

    Layer-outer layouts only: there each layer's blocks step by its own
    page, and a page of ``page_size_padded`` bytes must step by that
    (contract.md#page-pitch); the dense step reads the padding as data.
    """

    CAUGHT_BY = "KV-PLACE-PAGE-PITCH"
    #: The short step also lands the group's blocks on the next block's bytes
    #: of the groups aliasing it, beside host groups too; and where the padding
    #: comes from a block stride alignment (a compressed latent's 576-byte
    #: multiple), the dense step is no multiple of it.
    ALSO = frozenset({"KV-PLACE-NO-BLOCK-ALIAS", "KV-HOST-DEVICE-SAFE", "KV-PLACE-ALIGNMENT"})
    EXAMPLES = 50

    def fix(self, config: PlanningConfig, result: KVCacheConfig, num_blocks: int) -> KVCacheConfig:
        import math

        from kvref.layout import compute_layer_kv_cache_shape_bytes

        if config.kv_cache_layout.is_block_outermost:
            return result
        specs = {n: g.layer_spec(n) for g in result.kv_cache_groups for n in g.layer_names}
        tensors = []
        for t in result.kv_cache_tensors:
            spec = specs.get(t.layers[0]) if t.layers else None
            if spec is not None and spec.padded_page_size is not None and not t.host_resident:
                dense = math.prod(compute_layer_kv_cache_shape_bytes(spec, 1)[1:])
                blocks = result.num_blocks_of(t)
                t = attrs.evolve(t, block_stride=dense, layer_stride=dense * blocks)  # noqa: PLW2901
            tensors.append(t)
        return _with_tensors(result, tensors)


def _with_layer_specs(group: KVCacheGroupSpec, change: Any) -> KVCacheGroupSpec:
    """``group`` with ``change(spec)`` applied to every layer spec (wrapper included)."""
    from kvref import UniformTypeKVCacheSpecs

    spec = group.kv_cache_spec
    if isinstance(spec, UniformTypeKVCacheSpecs):
        inner = {n: change(s) for n, s in spec.kv_cache_specs.items()}
        return attrs.evolve(group, kv_cache_spec=UniformTypeKVCacheSpecs(kv_cache_specs=inner))
    return attrs.evolve(group, kv_cache_spec=change(spec))


class LinearKernelPage(_Base):
    """Takes a kernel block's page as the cache block's page scaled down: ``page x k / block``.

    ``MultipleOf(b)`` asks the block stride to be a multiple of the layer's
    page at the kernel block ``k = gcd(b, block_size)``, with the MLA
    alignment padding recomputed at ``k`` (contract.md#views-and-strides).
    Scaling the padded page instead is right for dense pages and wrong for
    padded compressed ones (a DeepSeek-V4-style indexer read in 64-token
    kernel blocks): the stride honours an alignment no kernel asked for.
    Only a kernel block smaller than the cache block meets the bug.
    """

    CAUGHT_BY = "KV-PLACE-ALIGNMENT"
    #: The stride it picks is also not the aligned page the layout fixes, and
    #: device pages beside host groups are judged by their own invariant.
    ALSO = frozenset({"KV-PLACE-PAGE-PITCH", "KV-HOST-DEVICE-SAFE"})
    EXAMPLES = 50

    def get_kv_cache_config_from_groups(
        self, config: PlanningConfig, kv_cache_groups: Sequence[KVCacheGroupSpec], num_blocks: int
    ) -> KVCacheConfig:
        import math

        from kvref.specs import MultipleOf

        def scaled(spec: KVCacheSpec) -> KVCacheSpec:
            wanted = spec.block_stride_alignment
            if not isinstance(wanted, MultipleOf):
                return spec
            kernel = math.gcd(wanted.n, spec.block_size)
            if kernel == spec.block_size:
                return spec
            page = max(1, spec.page_size_bytes * kernel // spec.block_size)
            return attrs.evolve(spec, block_stride_alignment=page)

        given = [_with_layer_specs(g, scaled) for g in kv_cache_groups]
        result = super().get_kv_cache_config_from_groups(config, given, num_blocks)
        return attrs.evolve(result, kv_cache_groups=list(kv_cache_groups))


class InterleavedCompressed(_Placement):
    """Lays compressed MLA caches out block-interleaved whatever the layout.

    A builder written for DeepSeek-V4's block-outer backends keeps a
    compressed tensor's layers side by side inside each block (layer stride
    one page, block stride the tensor's layers' pages) also in layer-outer
    layouts.
    The bytes stay in the tensor's region, but a layer-outer block must step
    the layer's aligned page (contract.md#page-pitch); groups aliasing the
    region then meet other block IDs.  Only compressed caches placed
    layer-outer meet the bug.
    """

    CAUGHT_BY = "KV-PLACE-PAGE-PITCH"
    #: Other groups aliasing the region see other blocks' bytes, beside host groups too.
    ALSO = frozenset({"KV-PLACE-NO-BLOCK-ALIAS", "KV-HOST-DEVICE-SAFE"})
    EXAMPLES = 50

    def fix(self, config: PlanningConfig, result: KVCacheConfig, num_blocks: int) -> KVCacheConfig:
        from kvref.specs import MLAAttentionSpec

        if config.kv_cache_layout.is_block_outermost:
            return result
        specs = {n: g.layer_spec(n) for g in result.kv_cache_groups for n in g.layer_names}
        tensors = []
        for t in result.kv_cache_tensors:
            spec = specs.get(t.layers[0]) if t.layers else None
            # One latent head: a block of every layer-outer layout is one run of the page.
            compressed = (
                isinstance(spec, MLAAttentionSpec)
                and spec.tokens_per_state_value > 1
                and spec.num_kv_heads == 1
            )
            if compressed and not t.host_resident and len(t.layers) > 1:
                page = t.block_stride
                t = attrs.evolve(t, layer_stride=page, block_stride=len(t.layers) * page)  # noqa: PLW2901
            tensors.append(t)
        return _with_tensors(result, tensors)


class PlacesAbsentLayers(_Base):
    """Places the layers a projected uniform-type group names in its wrapper, on every worker.

    vLLM 0.33.0's own placement does this (contract.md#deliberate-differences,
    difference 2): a pipeline worker holding no layer of a uniform-type group
    gets the group with no layer names but the global wrapper, and placing
    the wrapper's layers gives the worker tensors of layers it does not have.
    Only a worker without any layer of such a group meets the bug.
    """

    CAUGHT_BY = "KV-PLACE-UNKNOWN-LAYER"
    #: The absent layers' bytes may pass the sane bound of the worker's own layers.
    ALSO = frozenset({"KV-PLACE-SIZE-BOUND"})
    EXAMPLES = 50

    def get_kv_cache_config_from_groups(
        self, config: PlanningConfig, kv_cache_groups: Sequence[KVCacheGroupSpec], num_blocks: int
    ) -> KVCacheConfig:
        from kvref import UniformTypeKVCacheSpecs

        given = [
            attrs.evolve(g, layer_names=list(g.kv_cache_spec.kv_cache_specs))
            if not g.layer_names and isinstance(g.kv_cache_spec, UniformTypeKVCacheSpecs)
            else g
            for g in kv_cache_groups
        ]
        result = super().get_kv_cache_config_from_groups(config, given, num_blocks)
        return attrs.evolve(result, kv_cache_groups=list(kv_cache_groups))


#: Issue 23's field regimes the default generation reaches as classes
#: (tests/test_field_generation.py: caught at 50 examples, seeds 1-5).
FIELD_REGIMES: tuple[type[_Base], ...] = (
    Wraps32,
    DensePadded,
    LinearKernelPage,
    InterleavedCompressed,
    PlacesAbsentLayers,
)

ALL = (*ALL, *FIELD_REGIMES)

#: Builders whose printed reproduce line the default suite reruns in a fresh
#: process (tests/test_meta.py); every builder's line is rerun under `-m slow`
#: (tests/test_reproduce.py).  One per kind of failure: grouping, placement,
#: a hang, Core's flow.
REPRODUCED: tuple[type[_Base], ...] = (
    DroppedLayer,
    OverlappingBlocks,
    Hangs,
    HostSizedByDeviceBlocks,
)
