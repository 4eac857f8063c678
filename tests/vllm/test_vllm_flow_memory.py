"""Memory safety is judged wherever a vLLM-native builder places: vLLM's Core flow, profiling.

vLLM's Core flow asks a vLLM-native builder's hooks itself (through the
kit's adapter), and the profiling path places each worker's own groups.
Both are placements vLLM allocates and runs, so the memory-safety
invariants judge them as they judge the placement scenario's.  Before,
the Core flow judged no hook answer of a vLLM-native builder and the
profiling path's memory verdicts were computed and dropped: a chunked
descriptor that overwrote layers passed whenever only those flows drew
a model long enough to open its gate.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("vllm.v1.core.kv_cache_planning")

from _native import native_context
from _vllm_diff import INSTALLED

from conformance.check.catalog import by_id
from conformance.harness.hooks import Context
from conformance.scenarios.core import IN_VLLM_FLOW, observe_core
from conformance.scenarios.profiling import observe_profiling
from kvref import FullAttentionSpec, KVCacheLayout, PlanningConfig
from kvref.specs import KVCacheSpec

pytestmark = pytest.mark.vllm

GIB = 2**30
PKG = "tests.vllm.native_builders.descriptors"
OVERLAP = "KV-PLACE-NO-LAYER-OVERLAP"
FULL = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=64, dtype="bfloat16")  # type: ignore[arg-type]


def _ctx(name: str) -> Context:
    return native_context(f"{PKG}:{name}")


def _workers(sizes: tuple[int, ...]) -> list[dict[str, KVCacheSpec]]:
    out: list[dict[str, KVCacheSpec]] = []
    first = 0
    for size in sizes:
        out.append({f"model.layers.{i}.self_attn.attn": FULL for i in range(first, first + size)})
        first += size
    return out


def _config(sizes: tuple[int, ...]) -> PlanningConfig:
    return PlanningConfig(
        kv_cache_layout=KVCacheLayout.BLHNC,
        max_model_len=2048,
        pipeline_parallel_size=len(sizes),
        num_hidden_layers=sum(sizes),
        vllm_version=INSTALLED,  # vLLM's Core flow plans only as itself
    )


@pytest.mark.parametrize("sizes", [(12,), (10, 11)], ids=["one-worker", "two-stages"])
def test_core_flow_judges_memory(sizes: tuple[int, ...]) -> None:
    """Inside vLLM's Core flow the stale chunk offsets are caught, the advanced ones pass."""
    verdicts: dict[str, Any] = {}
    for name in ("StaleChunkOffsetBuilder", "DescriptorChunksBuilder"):
        obs = observe_core(_ctx(name), _config(sizes), _workers(sizes), [GIB] * len(sizes))
        assert set(obs.hook_verdicts) == IN_VLLM_FLOW, obs.hook_verdicts
        verdicts[name] = by_id()[OVERLAP].check(obs)
    broken = verdicts["StaleChunkOffsetBuilder"]
    assert broken, "the overwritten layers must be reported inside vLLM's Core flow"
    assert "model.layers." in broken[0].message
    assert verdicts["DescriptorChunksBuilder"] == []


@pytest.mark.parametrize("sizes", [(12,), (10, 11)], ids=["one-worker", "two-stages"])
def test_profiling_judges_memory(sizes: tuple[int, ...]) -> None:
    """The profiling path's placements are judged by the memory-safety invariants too."""
    found = {}
    for name in ("StaleChunkOffsetBuilder", "DescriptorChunksBuilder"):
        obs = observe_profiling(_ctx(name), _config(sizes), _workers(sizes), 4)
        found[name] = by_id()[OVERLAP].check(obs)
    assert found["StaleChunkOffsetBuilder"], "the profiling placement overwrites layers"
    assert found["DescriptorChunksBuilder"] == []
