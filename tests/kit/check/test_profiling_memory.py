"""The profiling path's placements are judged by the memory-safety and tensor invariants.

vLLM allocates the profiling cache and runs captured graphs on it, so its
placement must be as safe as the real one.  The profiling observer always
asked the gate about these invariants, but they were not declared for the
``profiling`` scenario, so their verdicts were dropped.  The vLLM-native
form of this test is tests/vllm/test_vllm_flow_memory.py.
"""

from __future__ import annotations

import pytest
import torch
from broken_builders.placement import OverlappingLayers

from conformance.check.catalog import by_id
from conformance.harness.guard import Guard
from conformance.harness.hooks import Context, make_factory
from conformance.scenarios.examples import Example
from conformance.scenarios.registry import observe_in
from kvref import ReferenceKVCacheConfigBuilder
from kvref.axes import KVCacheLayout
from kvref.builder import KVCacheConfigBuilder
from kvref.config import PlanningConfig
from kvref.specs import FullAttentionSpec

FULL = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=64, dtype=torch.bfloat16)
PLACEMENT_IDS = [
    "KV-PLACE-IN-BOUNDS",
    "KV-PLACE-NO-BLOCK-ALIAS",
    "KV-PLACE-NO-LAYER-OVERLAP",
    "KV-PLACE-LAYER-ONCE",
    "KV-PLACE-LAYER-MISSING",
    "KV-PLACE-UNKNOWN-LAYER",
    "KV-PLACE-TENSOR-ONE-SPEC",
]


def _example() -> Example:
    names = [f"model.layers.{i}.self_attn.attn" for i in range(6)]
    return Example(
        config=PlanningConfig(
            kv_cache_layout=KVCacheLayout.BLHNC,
            pipeline_parallel_size=2,
            max_model_len=1024,
            num_hidden_layers=6,
        ),
        workers=(dict.fromkeys(names[:4], FULL), dict.fromkeys(names[4:], FULL)),
        available_memory=(2**28, 2**28),
        num_blocks=8,
        description="two workers, block-outermost",
    )


def _judge(builder: type[KVCacheConfigBuilder], invariant: str) -> list[object]:
    guard = Guard(30.0)
    ctx = Context(factory=make_factory(builder, guard), guard=guard)
    found = by_id()[invariant].check(observe_in(ctx, "profiling", _example()))
    assert isinstance(found, list), found  # judged, not skipped
    return found


@pytest.mark.parametrize("invariant", PLACEMENT_IDS)
def test_declared_for_profiling(invariant: str) -> None:
    """Each placement invariant the profiling gate computes is one the scenario reports."""
    assert by_id()[invariant].reads("profiling")


def test_overlapping_layers_caught_on_the_profiling_path() -> None:
    """Halved layer strides overwrite layers in the profiling cache; each worker is named."""
    found = _judge(OverlappingLayers, "KV-PLACE-NO-LAYER-OVERLAP")
    assert found
    assert {getattr(v, "worker", None) for v in found} <= {0, 1}


@pytest.mark.parametrize("invariant", PLACEMENT_IDS)
def test_reference_passes(invariant: str) -> None:
    """The reference's profiling placements keep every one of them."""
    assert _judge(ReferenceKVCacheConfigBuilder, invariant) == []
