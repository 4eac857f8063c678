"""A legal builder with several device allocations, and the checks that add them up.

``legal_builders.SeparateAllocations`` splits the reference's one backing
into two allocations (slot 0 of every group, and the rest) and declares their
sum through ``_get_pool_bytes_per_block``, as vLLM's Core asks of such
placements.  The Core checks must count every allocation, as
``KV-CORE-MEMORY`` and ``KV-PLACE-POOL-BYTES`` do, and the memory-safety
checks must not take pages of two allocations for one address space.
"""

from __future__ import annotations

import legal_builders
import pytest

from conformance.check import core, memory
from conformance.check.observations import CallResult, CoreObservation
from conformance.run.runner import check_builder
from kvref import FullAttentionSpec, PlanningConfig
from kvref.planning import plan_kv_cache

_SPEC = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=64, dtype="bfloat16")
_CONFIG = PlanningConfig(kv_cache_layout="LBNHC", max_model_len=256)
#: Three full-attention layers: one group of three slots, 4096 bytes a page.
_WORKERS = ({f"model.layers.{i}.self_attn.attn": _SPEC for i in range(3)},)
_MEMORY = (100 * 3 * 4096 + 1000,)


def _plan() -> CoreObservation:
    plan = plan_kv_cache(
        legal_builders.SeparateAllocations, _CONFIG, [dict(w) for w in _WORKERS], list(_MEMORY)
    )
    return CoreObservation(
        config=_CONFIG,
        workers=_WORKERS,
        available_memory=_MEMORY,
        result=CallResult(hook="core", value=plan),
    )


def test_two_allocations_are_what_core_planned() -> None:
    """The plan really has two allocations and Core divided the memory by their sum."""
    obs = _plan()
    assert obs.plan is not None
    (config,) = obs.plan.configs
    sizes = sorted({t.size for t in config.device_tensors})
    assert sizes == [4096 * 100, 2 * 4096 * 100]
    assert obs.plan.num_blocks == _MEMORY[0] // (3 * 4096) == 100


def test_slack_counts_every_allocation() -> None:
    """KV-CORE-SLACK: no false alarm where the largest backing alone leaves room for more."""
    obs = _plan()
    assert obs.plan is not None
    (config,) = obs.plan.configs
    largest = max(t.size for t in config.device_tensors) // config.num_blocks
    # Judged by the largest backing, the worker would look half empty.
    assert (config.num_blocks + 1) * largest <= _MEMORY[0]
    assert core._core_slack(obs) == []
    assert core._core_memory(obs) == []


def test_allocations_are_separate_address_spaces() -> None:
    """Pages of two allocations at the same offsets do not overlap each other."""
    obs = _plan()
    assert obs.plan is not None
    (config,) = obs.plan.configs
    # Separate only for a builder that declares its bytes per block: then each
    # size is its own allocation.
    assert memory.find_layer_overlaps(config, "LBNHC", separate=True) == []
    assert memory.find_block_overlaps(config, "LBNHC", separate=True) == []
    # Undeclared, every device tensor views the one backing: the overlap stands.
    assert memory.find_layer_overlaps(config, "LBNHC")
    # One allocation with the same offsets would overlap: the check still sees that.
    merged = config.__class__(
        num_blocks=config.num_blocks,
        kv_cache_tensors=[
            t.__class__(
                size=config.device_tensors[1].size,
                layers=t.layers,
                layer_stride=t.layer_stride,
                block_stride=t.block_stride,
                offset=t.offset,
            )
            for t in config.device_tensors
        ],
        kv_cache_groups=config.kv_cache_groups,
    )
    assert memory.find_layer_overlaps(merged, "LBNHC", separate=True)


@pytest.mark.slow
def test_placement_and_core_checks_pass() -> None:
    """The placement and Core invariants pass it at the default example count."""
    report = check_builder(
        legal_builders.SeparateAllocations,
        select=["KV-PLACE", "KV-CORE"],
        max_examples=50,
        seed=1,
        shrink=False,
    )
    # The profiling path judges placement without the hook's answer (see the builder).
    assert report.failed_ids <= {"KV-PLACE-SINGLE-BACKING"}, report.failed_ids
    assert "KV-CORE-SLACK" not in report.failed_ids
    assert "KV-PLACE-NO-LAYER-OVERLAP" not in report.failed_ids
