"""KV-GROUP-TP-SHARDS on the vLLM-native path.

vLLM's Core derives ``kv_tp_replicas`` from the group specs' ``max_tp_shards``;
its default grouping keeps every layer's count.  A vendor grouping that
records MLA's one shard on GQA attention claims TP ranks identical that hold
different heads (caught); one that drops the count claims no replication
(legal, passes).  Judged on hand-made examples through the vLLM adapter and
by the kit's default run at one seed.
"""

from __future__ import annotations

import pytest

pytest.importorskip("vllm.v1.core.kv_cache_planning")

import torch
from _native import native_context

from conformance import check_builder
from conformance.check.catalog import by_id
from conformance.check.violations import Violation
from conformance.harness.adapters import load_builder
from conformance.scenarios.examples import Example
from conformance.scenarios.registry import observe_in
from kvref import FullAttentionSpec, KVCacheLayout, MLAAttentionSpec, PlanningConfig

pytestmark = pytest.mark.vllm

ID = "KV-GROUP-TP-SHARDS"
DEFAULT = "vllm.v1.core.kv_cache_planning:DefaultKVCacheConfigBuilder"
CLAIMS = "tests.vllm.native_builders.tp_shards:ClaimsReplicatedKVBuilder"
DROPS = "tests.vllm.native_builders.tp_shards:DropsTPShardsBuilder"
GQA = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=64, dtype=torch.bfloat16)
MLA = MLAAttentionSpec(
    block_size=64, num_kv_heads=1, head_size=576, dtype=torch.bfloat16, max_tp_shards=1
)


def _example(spec: FullAttentionSpec) -> Example:
    return Example(
        config=PlanningConfig(
            kv_cache_layout=KVCacheLayout.BLHNC, max_model_len=1024, tensor_parallel_size=4
        ),
        workers=({f"model.layers.{i}.self_attn.attn": spec for i in range(4)},),
        available_memory=(2**28,),
        num_blocks=8,
        description="tp 4",
    )


def _judge(name: str, spec: FullAttentionSpec) -> object:
    ctx = native_context(name)
    return by_id()[ID].check(observe_in(ctx, "grouping", _example(spec)))


@pytest.mark.parametrize("spec", [GQA, MLA], ids=["gqa", "mla"])
@pytest.mark.parametrize("name", [DEFAULT, DROPS], ids=["vllm-default", "drops"])
def test_kept_or_dropped_passes(name: str, spec: FullAttentionSpec) -> None:
    """vLLM's default keeps each count; dropping it claims no replication: both hold."""
    assert _judge(name, spec) == []


def test_mla_count_on_gqa_is_caught() -> None:
    """One shard recorded for GQA heads: the violation names the layer and both counts."""
    found = _judge(CLAIMS, GQA)
    assert isinstance(found, list) and found
    assert all(isinstance(v, Violation) and v.invariant == ID for v in found)
    assert "max_tp_shards=1 where the layer records None" in found[0].message


def test_mla_keeps_its_own_count() -> None:
    """On MLA layers the claimed count is the layer's own: nothing to report."""
    assert _judge(CLAIMS, MLA) == []


@pytest.mark.parametrize(
    ("name", "fails"), [(CLAIMS, True), (DROPS, False)], ids=["claims", "drops"]
)
def test_the_default_run_judges_the_clause(name: str, fails: bool) -> None:
    """At seed 1 the grouping runs reach the vendor's gate: caught or passing, as it should."""
    report = check_builder(
        load_builder(name), seed=1, select=[ID, "KV-GROUP-PARTITION"], shrink=False, reach=False
    )
    result = report.result(ID)
    assert result.examples > 0
    assert (result.status == "fail") is fails, [v.message for v in result.violations]
    assert report.result("KV-GROUP-PARTITION").status == "pass"
