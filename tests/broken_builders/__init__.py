"""Deliberately broken builders: one bug each, for the kit's meta-tests.

Each class says which invariant is meant to catch it in ``CAUGHT_BY``.  They
start from the reference and break one promise, so any other failure the kit
reports for them is noise to be fixed in the kit.  The classes live by where
their bug is (``calls``, ``placement``) and by the issue that added them
(``power``, ``field``); every one is importable from here as
``broken_builders:Name``.
"""

from __future__ import annotations

from broken_builders._base import _Base, assert_caught, meta_timeout
from broken_builders.calls import (
    DroppedHeads,
    DroppedLayer,
    DuplicatedLayer,
    EmptyGroup,
    Hangs,
    MutatesInput,
    RaisesOnValidInput,
    RepeatedInGroup,
    Stateful,
    WrongReturnType,
)
from broken_builders.field import (
    ClaimsReplicatedKV,
    DensePadded,
    HotIgnoresDecodeQuery,
    InterleavedCompressed,
    InterleavedHostPool,
    LinearKernelPage,
    PlacesAbsentLayers,
    RolelessSource,
    ScatteredDrafts,
    SignedWraps32,
    Wraps32,
)
from broken_builders.placement import (
    AbsurdSize,
    AttentionFreeZeroBlocks,
    ConstantHeader,
    ConstructsOnce,
    DeclaresEngineBlockSize,
    GhostTensor,
    GroupsNotEchoed,
    HalfUsedBlocks,
    HiSparsePoolShort,
    HostCountedOnDevice,
    HostSizedByDeviceBlocks,
    HostTensorOnDevice,
    IgnoresAlignment,
    LayerInTwoTensors,
    LyingPoolBytes,
    MisalignedStride,
    MissingTensor,
    MixedBlockSizes,
    MutatesGroupList,
    OutOfBoundsOffset,
    OverlappingBlocks,
    OverlappingLayers,
    PoolBytesClearsGroups,
    SharedInstance,
    SizeOneBlockTooBig,
    StatefulPlacement,
    SwappedLayers,
    TwoBackingSizes,
    UnknownLayer,
    WrapperMissesLayer,
    WrongNumBlocks,
)
from broken_builders.power import (
    DeviceAfterHost,
    DropsGroupAlignment,
    DropsRetention,
    GuardedBlocks,
    HostBlocksAlias,
    PoolBytesCountHost,
    RaisesOnEmptyGroup,
    SetOrderedGroups,
    WindowlessPromotion,
)

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
    DeclaresEngineBlockSize,
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
    PoolBytesClearsGroups,
)

#: One broken builder per class of once-invisible bug
#: (tests/kit/check/test_power.py: caught at 50 examples).
POWER: tuple[type[_Base], ...] = (
    RaisesOnEmptyGroup,
    DeviceAfterHost,
    HostBlocksAlias,
    PoolBytesCountHost,
    WindowlessPromotion,
    SetOrderedGroups,
    GuardedBlocks,
    DropsGroupAlignment,
    DropsRetention,
)

# Caught at the meta-tests' 25 examples (seed 11) by exactly their invariant;
# RaisesOnEmptyGroup needs Core's rare empty projections: tests/kit/check/test_power.py only.
ALL = (
    *ALL,
    DeviceAfterHost,
    HostBlocksAlias,
    PoolBytesCountHost,
    WindowlessPromotion,
    SetOrderedGroups,
    GuardedBlocks,
    DropsRetention,
)

#: The broken builders of bugs seen in the field, each caught by its new invariant.
FIELD: tuple[type[_Base], ...] = (
    ScatteredDrafts,
    HotIgnoresDecodeQuery,
    RolelessSource,
    InterleavedHostPool,
    ClaimsReplicatedKV,
)

ALL = (*ALL, *FIELD)

#: The field regimes the default generation reaches as classes
#: (tests/kit/generate/test_field_generation.py: caught at 50 examples, seeds 1-5).
FIELD_REGIMES: tuple[type[_Base], ...] = (
    Wraps32,
    SignedWraps32,
    DensePadded,
    LinearKernelPage,
    InterleavedCompressed,
    PlacesAbsentLayers,
)

ALL = (*ALL, *FIELD_REGIMES)

#: Builders whose printed reproduce line the default suite reruns in a fresh
#: process (tests/kit/test_meta.py); every builder's line is rerun under `-m slow`
#: (tests/kit/run/test_reproduce.py).  One per kind of failure: grouping, placement,
#: a hang, Core's flow.
REPRODUCED: tuple[type[_Base], ...] = (
    DroppedLayer,
    OverlappingBlocks,
    Hangs,
    HostSizedByDeviceBlocks,
)

__all__ = [
    "ALL",
    "AbsurdSize",
    "AttentionFreeZeroBlocks",
    "ClaimsReplicatedKV",
    "ConstantHeader",
    "ConstructsOnce",
    "DeclaresEngineBlockSize",
    "DensePadded",
    "DeviceAfterHost",
    "DroppedHeads",
    "DropsGroupAlignment",
    "DropsRetention",
    "DroppedLayer",
    "DuplicatedLayer",
    "EmptyGroup",
    "FIELD",
    "FIELD_REGIMES",
    "GhostTensor",
    "GroupsNotEchoed",
    "GuardedBlocks",
    "HalfUsedBlocks",
    "Hangs",
    "HiSparsePoolShort",
    "HostBlocksAlias",
    "HostCountedOnDevice",
    "HostSizedByDeviceBlocks",
    "HostTensorOnDevice",
    "HotIgnoresDecodeQuery",
    "IgnoresAlignment",
    "InterleavedCompressed",
    "InterleavedHostPool",
    "LayerInTwoTensors",
    "LinearKernelPage",
    "LyingPoolBytes",
    "MisalignedStride",
    "MissingTensor",
    "MixedBlockSizes",
    "MutatesGroupList",
    "MutatesInput",
    "OutOfBoundsOffset",
    "OverlappingBlocks",
    "OverlappingLayers",
    "POWER",
    "PlacesAbsentLayers",
    "PoolBytesClearsGroups",
    "PoolBytesCountHost",
    "REPRODUCED",
    "RaisesOnEmptyGroup",
    "RaisesOnValidInput",
    "RepeatedInGroup",
    "RolelessSource",
    "ScatteredDrafts",
    "SignedWraps32",
    "SetOrderedGroups",
    "SharedInstance",
    "SizeOneBlockTooBig",
    "Stateful",
    "StatefulPlacement",
    "SwappedLayers",
    "TwoBackingSizes",
    "UnknownLayer",
    "WindowlessPromotion",
    "WrapperMissesLayer",
    "Wraps32",
    "WrongNumBlocks",
    "WrongReturnType",
    "assert_caught",
    "meta_timeout",
]
