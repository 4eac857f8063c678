"""The KV-CORE-ADMISSION counterexample, decided by vLLM 0.33.0 itself.

With the hybrid manager disabled, vLLM allocates the sliding layers of
acme_hydra as full attention: its auto-fit plans max_model_len=8096 into the
253 blocks left after the null block, as kvref does, so the kit's admission
oracle (which once asked 254) was the side that was wrong.
"""

from __future__ import annotations

import pytest
from _vllm_diff import run_kvref, run_vllm
from specs import hydra_layers

from kvref import PlanningConfig

pytestmark = pytest.mark.vllm


def test_vllm_plans_the_counterexample_as_kvref_does() -> None:
    """Same max_model_len, blocks and need on both sides: 8096 tokens in 253 + 1 blocks."""
    layers = hydra_layers()
    config = PlanningConfig(
        auto_fit_max_model_len=True,
        max_num_batched_tokens=8192,
        disable_hybrid_kv_cache_manager=True,
        num_hidden_layers=6,
    )
    ours, theirs = (run(config, [layers], [149815296]) for run in (run_kvref, run_vllm))
    assert ours.plan is not None and theirs.plan is not None, (ours.error, theirs.error)
    assert ours.plan.max_model_len == theirs.plan.max_model_len == 8096
    assert ours.plan.num_blocks == theirs.plan.num_blocks == 254
    assert ours.plan.workers[0].needed_memory == theirs.plan.workers[0].needed_memory
    assert theirs.plan.workers[0].needed_memory == 253 * 589824
