"""KV-PLACE-RETENTION: a config carries the operator's prefix-cache retention interval.

vLLM's KV cache manager reads the interval from each ``KVCacheConfig``;
``None`` (dense checkpoints) is a value of its own, which the vLLM
converter once mapped to 0.  The vLLM-native broken builder is
tests/vllm/native_builders/retention.py.
"""

from __future__ import annotations

import attrs
import pytest
import torch
from broken_builders import DropsRetention, StatefulPlacement

from conformance.check.catalog import by_id
from conformance.harness.guard import Guard
from conformance.harness.hooks import Context, make_factory
from conformance.scenarios.examples import Example
from conformance.scenarios.registry import observe_in
from kvref import ReferenceKVCacheConfigBuilder
from kvref.builder import KVCacheConfigBuilder
from kvref.config import PlanningConfig
from kvref.errors import ConfigError
from kvref.specs import FullAttentionSpec, SlidingWindowSpec

FULL = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=64, dtype=torch.bfloat16)
SWA = SlidingWindowSpec(
    block_size=16, num_kv_heads=2, head_size=64, dtype=torch.bfloat16, sliding_window=128
)
RETENTION = "KV-PLACE-RETENTION"


def _example(interval: int | None) -> Example:
    return Example(
        config=PlanningConfig(max_model_len=1024, prefix_cache_retention_interval=interval),
        workers=({"l0": FULL, "l1": SWA, "l2": FULL, "l3": SWA},),
        available_memory=(2**28,),
        num_blocks=8,
        description="hybrid",
    )


def _judge(builder: type[KVCacheConfigBuilder], example: Example, scenario: str) -> object:
    guard = Guard(30.0)
    ctx = Context(factory=make_factory(builder, guard), guard=guard)
    return by_id()[RETENTION].check(observe_in(ctx, scenario, example))


@pytest.mark.parametrize("interval", [None, 0, 2048])
@pytest.mark.parametrize("scenario", ["placement", "core", "profiling"])
def test_reference_keeps_the_interval(interval: int | None, scenario: str) -> None:
    """The reference copies every interval, None included, wherever it places."""
    assert _judge(ReferenceKVCacheConfigBuilder, _example(interval), scenario) == []


@pytest.mark.parametrize("interval", [None, 2048])
@pytest.mark.parametrize("scenario", ["placement", "core", "profiling"])
def test_a_rebuilt_config_that_drops_it_fails(interval: int | None, scenario: str) -> None:
    """Dropped to the record's default 0: the message names both values."""
    found = _judge(DropsRetention, _example(interval), scenario)
    assert isinstance(found, list) and found
    assert repr(interval) in found[0].message and "=0" in found[0].message


def test_dropping_the_default_is_not_seen() -> None:
    """Where the operator kept the default 0 nothing is lost, and nothing is reported."""
    assert _judge(DropsRetention, _example(0), "placement") == []


def test_state_in_the_field_is_caught() -> None:
    """A placement counter written into the field is not the operator's interval."""
    found = _judge(StatefulPlacement, _example(0), "placement")
    assert isinstance(found, list) and found


def test_the_empty_plan_is_not_judged() -> None:
    """No groups: nothing the interval would thin; not counted as a pass either."""
    empty = attrs.evolve(_example(None), workers=({},))
    assert _judge(DropsRetention, empty, "placement") is None


def test_a_bad_interval_names_the_field() -> None:
    """Negative or non-int intervals are refused with the field and value."""
    with pytest.raises(ConfigError, match="prefix_cache_retention_interval=-1"):
        PlanningConfig(prefix_cache_retention_interval=-1)
