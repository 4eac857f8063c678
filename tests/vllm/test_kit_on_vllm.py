"""The kit, pointed at vLLM 0.33.0's default builder, sees vLLM's two the contract defects.

See contract.md#memory-safety.

Full runs (``kvref-conformance vllm.v1.core.kv_cache_planning:DefaultKVCacheConfigBuilder``)
take minutes; these tests feed the invariants the inputs that show each defect.

Run: ``/work/vllm-venv/bin/python -m pytest -m vllm tests/vllm`` (or ``tox -e vllm``).
"""

from __future__ import annotations

import pytest
from _vllm_diff import INSTALLED, VLLMDefault
from hypothesis import HealthCheck, given, settings
from specs import projection_repro

from conformance.check.catalog import by_id
from conformance.generate import strategies as kst
from conformance.harness.adapters import load_builder
from conformance.harness.guard import Guard
from conformance.harness.hooks import Context, make_factory
from conformance.scenarios.core import observe_core
from conformance.scenarios.placement import observe_placement
from kvref import (
    KVCacheConfigBuilder,
    KVCacheLayout,
    PlanningConfig,
)

pytestmark = pytest.mark.vllm

GIB = 2**30
#: The guard's per-call deadline, for a hang only: a call of vLLM's builder may
#: build a VllmConfig first (about 15 s wall on a cold vLLM cache, far more on a
#: loaded machine), and an ordinary slow call must not read as a timeout here.
HANG = 600.0


class TestAdapter:
    """The kit loads vLLM-native builders through the adapter."""

    def test_load_builder_wraps_vllm_native(self) -> None:
        """``module:Class`` of a vLLM builder gives an adapter class that brings vLLM's Core."""
        loaded = load_builder("vllm.v1.core.kv_cache_planning:DefaultKVCacheConfigBuilder")
        assert isinstance(loaded, type)
        assert callable(loaded.kvref_core)  # type: ignore[attr-defined]
        # vLLM keeps layers on the host only as HiSparse's source storage.
        assert loaded.kvref_unsupported == ("host_outside_hisparse",)  # type: ignore[attr-defined]

    def test_fresh_native_per_instance(self) -> None:
        """Each adapter instance owns its own native builder."""
        a, b = VLLMDefault(), VLLMDefault()
        assert a.native is not b.native  # type: ignore[attr-defined]

    def test_no_pool_bytes_override(self) -> None:
        """vLLM's default leaves ``_get_pool_bytes_per_block`` alone, and so does its adapter."""
        assert (
            VLLMDefault._get_pool_bytes_per_block is KVCacheConfigBuilder._get_pool_bytes_per_block
        )


class TestDefects:
    """Each contract.md#memory-safety defect trips the invariant meant to catch it."""

    def test_pp_projection_trips_worker_layers(self) -> None:
        """The contract repro under vLLM's Core: KV-CORE-WORKER-LAYERS reports foreign layers.

        See contract.md#memory-safety.  vLLM 0.34.0 fixed the defect (issue
        54711): under it the same invariant finds nothing.
        """
        config = PlanningConfig(
            max_model_len=8192,
            kv_cache_layout=KVCacheLayout.BLHNC,
            pipeline_parallel_size=2,
            vllm_version=INSTALLED,
        )
        guard = Guard(HANG)
        ctx = Context(
            factory=make_factory(VLLMDefault, guard),
            guard=guard,
            core=VLLMDefault.kvref_core,  # type: ignore[attr-defined]
        )
        obs = observe_core(ctx, config, projection_repro(), [GIB, GIB])
        found = by_id()["KV-CORE-WORKER-LAYERS"].check(obs)
        if config.rules.placement_walks_layer_specs:
            assert found == []
            return
        assert found, "vLLM's PP projection defect must be reported"
        assert "f0" in found[0].message

    @settings(
        max_examples=10, deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )
    @given(problem=kst.vllm_p3_alias_problems())
    def test_layer_outer_alias_trips_block_alias(self, problem: kst.PlanningProblem) -> None:
        """The kit's demo strategy for the contract's alias: KV-PLACE-NO-BLOCK-ALIAS fires on vLLM.

        See contract.md#memory-safety.
        """
        guard = Guard(HANG)
        ctx = Context(factory=make_factory(VLLMDefault, guard), guard=guard)
        obs = observe_placement(ctx, problem.config, problem.specs, num_blocks=4)
        assert by_id()["KV-PLACE-NO-BLOCK-ALIAS"].check(obs)
