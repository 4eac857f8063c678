"""Deliberately broken builders: one bug each, for the kit's meta-tests.

Each class says which invariant is meant to catch it in ``CAUGHT_BY``.  They
start from the reference and break one promise, so any other failure the kit
reports for them is noise to be fixed in the kit.  The classes live by where
their bug is (``calls``, ``placement``) and by the issue that added them
(``power``, ``field``); every one is importable from here as
``broken_builders:Name``, and joins the collections the meta-tests draw from
(``ALL``, ``POWER``...) where it is defined (``@member_of``).
"""

from __future__ import annotations

from broken_builders._base import COLLECTIONS, _Base, assert_caught, meta_timeout
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

# Each collection (what it is for: ``COLLECTIONS`` in _base.py), as filled by the
# modules above where they define their builders.
ALL: tuple[type[_Base], ...] = tuple(COLLECTIONS["all"])
POWER: tuple[type[_Base], ...] = tuple(COLLECTIONS["power"])
FIELD: tuple[type[_Base], ...] = tuple(COLLECTIONS["field"])
FIELD_REGIMES: tuple[type[_Base], ...] = tuple(COLLECTIONS["field_regimes"])
REPRODUCED: tuple[type[_Base], ...] = tuple(COLLECTIONS["reproduced"])

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
