"""The kit on HiSparse-served, hidden-state and grouping-declaring models."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import pytest
import torch
from draws import draws

from conformance.check.catalog import Unjudged, by_id
from conformance.check.observations import HostObservation
from conformance.check.residency import host_layers
from conformance.generate import strategies as kst
from conformance.generate.families.declared import declared_grouping_models
from conformance.generate.families.extras import RunsOfKindGrouping
from conformance.generate.families.hidden_state import hidden_state_models
from conformance.generate.families.hisparse import hisparse_models
from conformance.generate.records import PlanningProblem
from conformance.harness.guard import Guard
from conformance.harness.hooks import Context, make_factory
from conformance.run.runner import check_builder
from conformance.scenarios.examples import Example
from conformance.scenarios.registry import observe_in
from kvref import ReferenceKVCacheConfigBuilder
from kvref.config import HiSparseConfig, PlanningConfig
from kvref.extra_specs import HiddenStateCacheSpec, HiSparseHotSpec, HiSparseResidentSpec
from kvref.hisparse import resolve_hisparse_specs
from kvref.layout import KVCacheLayout
from kvref.records import KVCacheConfig, KVCacheGroupSpec
from kvref.specs import FullAttentionSpec, MLAAttentionSpec, SlidingWindowSpec

# Whole kit runs: too costly for every CI submission (tox -e slow, pytest -m slow).
pytestmark = pytest.mark.slow

LATENT = MLAAttentionSpec(
    block_size=64, num_kv_heads=1, max_tp_shards=1, head_size=576, dtype=torch.bfloat16
)  # 1152 B per token, 73,728 B per block
INDEXER = MLAAttentionSpec(
    block_size=64,
    num_kv_heads=1,
    max_tp_shards=1,
    head_size=132,
    dtype=torch.uint8,
    cache_role="INDEXER",
)
FULL = FullAttentionSpec(block_size=16, num_kv_heads=8, head_size=128, dtype=torch.bfloat16)
SWA = SlidingWindowSpec(
    block_size=16, num_kv_heads=8, head_size=128, dtype=torch.bfloat16, sliding_window=128
)


class HiSparseSourceOnDevice(ReferenceKVCacheConfigBuilder):
    """Places HiSparse's sparse-MLA source group in device tensors instead of the host pool."""

    def get_kv_cache_config_from_groups(
        self, config: PlanningConfig, kv_cache_groups: Sequence[KVCacheGroupSpec], num_blocks: int
    ) -> KVCacheConfig:
        result = super().get_kv_cache_config_from_groups(config, kv_cache_groups, num_blocks)
        if config.hisparse is None:
            return result
        tensors = [attrs.evolve(t, host_resident=False) for t in result.kv_cache_tensors]
        return attrs.evolve(result, kv_cache_tensors=tensors)


def _hisparse_example(pool_blocks: int = 80, *, shared: bool = False) -> Example:
    specs = {}
    for i in range(2):
        specs[f"model.layers.{i}.self_attn.attn"] = LATENT
        specs[f"model.layers.{i}.self_attn.indexer.k_cache"] = INDEXER
    config = PlanningConfig(
        hisparse=HiSparseConfig(index_topk=2048, shared_host_pool=shared),
        # Two source layers: 2 x 73,728 = 147,456 B per host block (+ 100 B of slack).
        host_pool_bytes=pool_blocks * 147_456 + 100,
        kv_cache_layout=KVCacheLayout.BLHNC,
        max_model_len=4096,
    )
    worker = resolve_hisparse_specs(config, specs)
    return Example(
        config=config,
        workers=(worker,),
        available_memory=(2**30,),
        num_blocks=5,
        description="two HiSparse layers",
    )


def _observe(builder: Any, scenario: str, example: Example) -> Any:
    guard = Guard(10.0)
    return observe_in(Context(factory=make_factory(builder, guard), guard=guard), scenario, example)


def _problems(strategy: Any, n: int = 15) -> list[PlanningProblem]:
    return draws(kst.planning_problems(models_strategy=strategy), n, at=2)


class TestFamilies:
    """The new families give the problems their docstrings promise."""

    def test_hisparse_problems(self) -> None:
        """HiSparse on, block-outermost, a pool for one request, derived layers on every worker."""
        for problem in _problems(hisparse_models()):
            config = problem.config
            assert config.hisparse is not None and config.kv_cache_layout.is_block_outermost
            assert not config.host_resident_layers and not config.disable_hybrid_kv_cache_manager
            sources = [n for n in problem.specs if n.endswith(".attn")]
            block = problem.specs[sources[0]].block_size
            source_bytes = sum(problem.specs[n].page_size_bytes for n in sources)
            need = -(-config.max_model_len // block) + 2
            assert config.host_pool_bytes is not None
            assert config.host_pool_bytes >= need * source_bytes
            for worker in problem.workers:
                for name in (n for n in worker if n.endswith(".attn")):
                    assert isinstance(worker[name + ".hisparse_hot"], HiSparseHotSpec)
                    assert isinstance(worker[name + ".hisparse_resident"], HiSparseResidentSpec)

    def test_hidden_state_problems(self) -> None:
        """One hidden-state layer after the target's last layer, on the last worker."""
        for problem in _problems(hidden_state_models()):
            hidden = [n for n, s in problem.specs.items() if isinstance(s, HiddenStateCacheSpec)]
            assert len(hidden) == 1 and hidden[0].startswith("cache_only_layers.")
            assert hidden[0] in problem.workers[-1]

    def test_declared_grouping_problems(self) -> None:
        """The config carries the model's grouping."""
        for problem in _problems(declared_grouping_models()):
            assert isinstance(problem.config.model_kv_cache_grouping, RunsOfKindGrouping)

    def test_runs_of_kind_grouping(self) -> None:
        """Equal specs in first-seen order, cut into runs of at most two layers."""
        specs = {"a": FULL, "b": SWA, "c": FULL, "d": FULL, "e": SWA}
        groups = RunsOfKindGrouping(max_layers=2).get_kv_cache_groups(PlanningConfig(), specs)
        assert [list(g.layer_names) for g in groups] == [["a", "c"], ["d"], ["b", "e"]]
        assert [g.kv_cache_spec for g in groups] == [FULL, FULL, SWA]


class TestHostLayers:
    """HiSparse's source layers count as host layers."""

    def test_worked_example(self) -> None:
        """Sparse-MLA layers when HiSparse is on; nothing from HiSparse when it is off."""
        specs = {"attn": LATENT, "idx": INDEXER, "full": FULL}
        on = PlanningConfig(hisparse=HiSparseConfig(index_topk=8), host_pool_bytes=1)
        assert host_layers(on, specs) == {"attn"}
        off = PlanningConfig(host_resident_layers=frozenset({"full"}), host_pool_bytes=1)
        assert host_layers(off, specs) == {"full"}


class TestHostPool:
    """KV-HOST-HISPARSE-POOL on worked numbers."""

    def test_reference_fills_the_pool(self) -> None:
        """80 blocks of 147,456 B (+100 B) give 80 host blocks of 147,456 B: it holds."""
        obs = _observe(ReferenceKVCacheConfigBuilder, "host", _hisparse_example(80))
        assert isinstance(obs, HostObservation)
        placed = obs.placed.value  # type: ignore[union-attr]
        assert (placed.host_num_blocks, placed.host_block_stride) == (80, 147_456)
        assert by_id()["KV-HOST-HISPARSE-POOL"].check(obs) == []
        assert by_id()["KV-HOST-TENSORS"].check(obs) == []

    def test_shared_pool_rounds_the_stride(self) -> None:
        """Shared pools round the stride to 4,096 B: 147,456 is already a multiple (36 x 4096)."""
        obs = _observe(ReferenceKVCacheConfigBuilder, "host", _hisparse_example(80, shared=True))
        assert by_id()["KV-HOST-HISPARSE-POOL"].check(obs) == []

    def test_index_group_tensors_share_one_backing(self) -> None:
        """A leader and a follower (two specs) get two host views of one 80-block backing."""
        example = _hisparse_example(80)
        leader = attrs.evolve(LATENT, is_index_group_leader=True)
        worker = dict(example.workers[0])
        worker["model.layers.0.self_attn.attn"] = leader
        del worker["model.layers.1.self_attn.indexer.k_cache"]
        obs = _observe(
            ReferenceKVCacheConfigBuilder, "host", attrs.evolve(example, workers=(worker,))
        )
        placed = obs.placed.value
        assert [t.size for t in placed.host_tensors] == [80 * 147_456, 80 * 147_456]
        assert by_id()["KV-HOST-HISPARSE-POOL"].check(obs) == []

    def test_short_pool_is_caught(self) -> None:
        """One host block kept back: 79 of the 80 the setting holds."""
        import broken_builders

        obs = _observe(broken_builders.HiSparsePoolShort, "host", _hisparse_example(80))
        found = by_id()["KV-HOST-HISPARSE-POOL"].check(obs)
        assert found and "host_num_blocks=79" in found[0].message
        assert "holds 80 host blocks of 147456 B" in found[0].message

    def test_non_hisparse_example_is_not_applicable(self) -> None:
        """Without HiSparse the invariant does not apply."""
        example = attrs.evolve(
            _hisparse_example(),
            config=PlanningConfig(host_resident_layers=frozenset({"a"}), host_pool_bytes=2**20),
            workers=({"a": FULL, "b": FULL},),
        )
        outcome = by_id()["KV-HOST-HISPARSE-POOL"].check(
            _observe(ReferenceKVCacheConfigBuilder, "host", example)
        )
        assert isinstance(outcome, Unjudged) and not outcome.applicable


class TestSourceOnDevice:
    """A builder that places HiSparse's source group on the device is caught."""

    def test_host_tensors_and_device_check(self) -> None:
        """KV-HOST-TENSORS and the device check's residency rows both name a source layer."""
        obs = _observe(HiSparseSourceOnDevice, "host", _hisparse_example())
        found = by_id()["KV-HOST-TENSORS"].check(obs)
        assert found and found[0].layer == "model.layers.0.self_attn.attn"
        device = by_id()["KV-DEV-HOST"].check(obs)
        assert isinstance(device, list) and device
        assert "host-resident group" in device[0].message

    def test_caught_in_a_run_on_a_hisparse_model(self) -> None:
        """The default host examples find it; the counterexample turns HiSparse on."""
        report = check_builder(
            HiSparseSourceOnDevice, select=["KV-HOST-TENSORS"], max_examples=20, seed=4
        )
        result = next(r for r in report.results if r.id == "KV-HOST-TENSORS")
        assert result.status == "fail"
        assert result.counterexample_python and "HiSparseConfig" in result.counterexample_python

    def test_reference_passes_the_host_scenario(self) -> None:
        """The reference keeps every host invariant, HiSparse's pool judged on real examples."""
        report = check_builder(
            ReferenceKVCacheConfigBuilder, select=["KV-HOST"], max_examples=20, seed=4
        )
        assert report.ok, report.failed_ids
        statuses = {r.id: r.status for r in report.results}
        assert statuses["KV-HOST-HISPARSE-POOL"] == "pass"


class TestHiddenStateLayerSpec:
    """KV-GROUP-LAYER-SPEC lets a hidden-state layer shrink its block and pad its page."""

    def test_aligned_hidden_state_is_legal(self) -> None:
        """The uniform-page path gives the hidden layer fewer tokens per block on a padded page."""
        hidden = HiddenStateCacheSpec(
            block_size=16, num_kv_heads=3, head_size=4096, dtype=torch.bfloat16
        )
        specs = {"l0": SWA, "l1": FULL, "l2": SWA, "l3": FULL, "cache_only_layers.4": hidden}
        example = Example(
            config=PlanningConfig(),
            workers=(specs,),
            available_memory=(2**30,),
            num_blocks=3,
            description="hidden state beside a hybrid",
        )
        obs = _observe(ReferenceKVCacheConfigBuilder, "grouping", example)
        (group,) = [g for g in obs.first.value if "cache_only_layers.4" in g.layer_names]
        aligned = group.kv_cache_spec
        # Common page: 16 x 8 x 128 x 2 x 2 = 65,536 B; 3 x 4096 x 2 = 24,576 B per token fits 2.
        assert (aligned.block_size, aligned.page_size_padded) == (2, 65_536)
        assert by_id()["KV-GROUP-LAYER-SPEC"].check(obs) == []
        assert by_id()["KV-GROUP-SPEC-MEANING"].check(obs) == []
