"""Power against bugs seen in the field, and no false alarm on legal layouts.

Each test builds the plan it judges by hand or with a builder of
tests/legal_builders.py and tests/broken_builders/, and asks the kit's
check functions directly, so a check that goes quiet or too strict shows here
without a whole kit run.
"""

from __future__ import annotations

import attrs
import legal_builders
import pytest

from conformance.check.pitch import pitch_findings
from kvref import (
    FullAttentionSpec,
    KVCacheGroupSpec,
    PlanningConfig,
    ReferenceKVCacheConfigBuilder,
)

# Whole kit runs: too costly for every CI submission (tox -e slow, pytest -m slow).
pytestmark = pytest.mark.slow


def _spec(alignment: int) -> FullAttentionSpec:
    return FullAttentionSpec(
        block_size=16,
        num_kv_heads=1,
        head_size=64,
        dtype="bfloat16",
        block_stride_alignment=alignment,
    )


#: Two groups whose 4096-byte pages align to 512 and 4608 bytes: their own
#: pitches are 4096 and 4608, the reference's common one 4608.
_GROUPS = [
    KVCacheGroupSpec(layer_names=["a0", "a1"], kv_cache_spec=_spec(512)),
    KVCacheGroupSpec(layer_names=["b0", "b1"], kv_cache_spec=_spec(4608)),
]
_CONFIG = PlanningConfig(kv_cache_layout="LBNHC")


def test_disjoint_regions_keep_their_own_pitch() -> None:
    """Groups in regions of their own step their own aligned pages: no finding."""
    placed = legal_builders.DisjointRegions().get_kv_cache_config_from_groups(_CONFIG, _GROUPS, 4)
    strides = [t.block_stride for t in placed.device_tensors]
    offsets = [t.offset for t in placed.device_tensors]
    assert strides == [4096, 4608] and offsets == [0, 2 * 4096 * 4]
    assert pitch_findings(placed, "LBNHC") == []


def test_reference_common_pitch_still_judged() -> None:
    """Groups that alias from byte 0 must share the common stride, as before."""
    placed = ReferenceKVCacheConfigBuilder().get_kv_cache_config_from_groups(_CONFIG, _GROUPS, 4)
    assert {t.block_stride for t in placed.device_tensors} == {4608}
    assert pitch_findings(placed, "LBNHC") == []
    # vLLM's own answer: each layer its own pitch, every group from byte 0.
    own = [
        attrs.evolve(t, block_stride=4096, layer_stride=4096 * 4) if i == 0 else t
        for i, t in enumerate(placed.kv_cache_tensors)
    ]
    found = pitch_findings(attrs.evolve(placed, kv_cache_tensors=own), "LBNHC")
    assert found and "4608" in found[0]


def test_partly_overlapping_regions_are_judged_together() -> None:
    """A group whose region reaches into another's aliases it: the common stride applies."""
    placed = legal_builders.DisjointRegions().get_kv_cache_config_from_groups(_CONFIG, _GROUPS, 4)
    # Move the second group's tensor one page down, into the first group's region.
    moved = [
        attrs.evolve(t, offset=t.offset - 4096) if i == 1 else t
        for i, t in enumerate(placed.kv_cache_tensors)
    ]
    found = pitch_findings(attrs.evolve(placed, kv_cache_tensors=moved), "LBNHC")
    assert found and "block_stride=4096" in found[0]
