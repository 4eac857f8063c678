"""KV-PLACE-RETENTION on the vLLM-native path: vLLM's default keeps the interval, a helper loses it.

vLLM's ``KVCacheConfig`` defaults the interval to ``None`` (dense
checkpoints) while the engine's default is 0, so a vendor helper that
rebuilds the config without the field changes the cache's checkpoints on
every default deployment.  The kit's converter keeps ``None`` as ``None``.
"""

from __future__ import annotations

import pytest

pytest.importorskip("vllm.v1.core.kv_cache_planning")

from _native import native_context

from conformance.check.catalog import by_id
from conformance.scenarios.examples import Example
from conformance.scenarios.registry import observe_in
from kvref import FullAttentionSpec, KVCacheLayout, PlanningConfig, SlidingWindowSpec
from kvref.versions import NEWEST, installed_vllm_version

pytestmark = pytest.mark.vllm

DEFAULT = "vllm.v1.core.kv_cache_planning:DefaultKVCacheConfigBuilder"
DROPS = "tests.vllm.native_builders.retention:RetentionDroppedBuilder"
FULL = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=64, dtype="bfloat16")  # type: ignore[arg-type]
SWA = SlidingWindowSpec(
    block_size=16,
    num_kv_heads=2,
    head_size=64,
    dtype="bfloat16",  # type: ignore[arg-type]
    sliding_window=128,
    dcp_sharded=False,
)


def _example(interval: int | None) -> Example:
    return Example(
        # Planned as the installed release: vLLM's Core flow runs the installed one.
        config=PlanningConfig(
            kv_cache_layout=KVCacheLayout.BLHNC,
            max_model_len=1024,
            prefix_cache_retention_interval=interval,
            vllm_version=installed_vllm_version() or NEWEST,
        ),
        workers=({"l0": FULL, "l1": SWA, "l2": FULL, "l3": SWA},),
        available_memory=(2**28,),
        num_blocks=8,
        description="hybrid",
    )


def _judge(name: str, interval: int | None, scenario: str) -> object:
    ctx = native_context(name)
    return by_id()["KV-PLACE-RETENTION"].check(observe_in(ctx, scenario, _example(interval)))


@pytest.mark.parametrize("interval", [None, 0, 2048])
@pytest.mark.parametrize("scenario", ["placement", "core"])
def test_vllms_default_keeps_it(interval: int | None, scenario: str) -> None:
    """vLLM copies the engine's interval into every config; so does the conversion."""
    assert _judge(DEFAULT, interval, scenario) == []


@pytest.mark.parametrize("interval", [0, 2048])
@pytest.mark.parametrize("scenario", ["placement", "core"])
def test_a_helper_that_drops_it_fails(interval: int | None, scenario: str) -> None:
    """The helper's configs say None (dense) where the engine said otherwise."""
    found = _judge(DROPS, interval, scenario)
    assert isinstance(found, list) and found
    assert "None" in found[0].message
