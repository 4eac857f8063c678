"""The profiling scenario: one worker's slice grouped and placed by a freshly resolved builder."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
import pytest
import torch
from hypothesis import HealthCheck, given, seed, settings

from conformance.check.catalog import Unjudged, by_id, catalog
from conformance.check.observations import ConstructFailure, ProfilingObservation
from conformance.harness.builder_identity import isolated_resolver, resolvable_qualname
from conformance.harness.guard import Guard
from conformance.harness.hooks import Context, make_factory
from conformance.run.runner import builder_name, check_builder
from conformance.scenarios.examples import Example
from conformance.scenarios.profiling import profiling_block_count
from conformance.scenarios.registry import examples, observe_in
from kvref import ReferenceKVCacheConfigBuilder
from kvref.config import PlanningConfig
from kvref.records import KVCacheGroupSpec
from kvref.specs import FullAttentionSpec, KVCacheSpec

# Whole kit runs: too costly for every CI submission (tox -e slow, pytest -m slow).
pytestmark = pytest.mark.slow

FULL = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=64, dtype=torch.bfloat16)


class PerStageGroups(ReferenceKVCacheConfigBuilder):
    """Cuts a uniform model into one group per pipeline stage, assuming it sees every stage.

    Planning passes all workers' layers, so there are always at least
    ``pipeline_parallel_size`` of them; the profiling call passes one
    worker's, and a short slice gets empty groups.
    """

    def get_kv_cache_groups(
        self, config: PlanningConfig, kv_cache_spec: Mapping[str, KVCacheSpec]
    ) -> list[KVCacheGroupSpec]:
        groups = super().get_kv_cache_groups(config, kv_cache_spec)
        stages = config.pipeline_parallel_size
        if len(groups) != 1 or stages == 1 or groups[0].host_resident:
            return groups
        (group,) = groups
        names = list(group.layer_names)
        size, extra = divmod(len(names), stages)
        out, start = [], 0
        for stage in range(stages):
            end = start + size + (1 if stage < extra else 0)
            out.append(attrs.evolve(group, layer_names=tuple(names[start:end])))
            start = end
        return out


class ForeignInstance(ReferenceKVCacheConfigBuilder):
    """Construction hands back an instance of its parent class, not of itself."""

    def __new__(cls) -> Any:
        return ReferenceKVCacheConfigBuilder()


class InstanceState(ReferenceKVCacheConfigBuilder):
    """Legal: keeps per-instance state (a call counter) that never changes an answer."""

    def __init__(self) -> None:
        self.calls = 0

    def get_kv_cache_groups(
        self, config: PlanningConfig, kv_cache_spec: Mapping[str, KVCacheSpec]
    ) -> list[KVCacheGroupSpec]:
        self.calls += 1
        return super().get_kv_cache_groups(config, kv_cache_spec)


def _ctx(builder: Any) -> Context:
    guard = Guard(10.0)
    qualname, note = resolvable_qualname(builder, builder_name(builder))
    return Context(
        factory=make_factory(builder, guard), guard=guard, qualname=qualname, qualname_note=note
    )


def _two_workers(first: int, second: int) -> Example:
    names = [f"model.layers.{i}.self_attn.attn" for i in range(first + second)]
    workers = (dict.fromkeys(names[:first], FULL), dict.fromkeys(names[first:], FULL))
    return Example(
        config=PlanningConfig(pipeline_parallel_size=2, max_model_len=1024),
        workers=workers,
        available_memory=(2**28, 2**28),
        num_blocks=profiling_block_count(256, 512),
        description="two workers",
    )


def _judge(builder: Any, example: Example, invariant: str) -> Any:
    return by_id()[invariant].check(observe_in(_ctx(builder), "profiling", example))


class TestBlockCount:
    """One block per sequence a captured graph may run, never 0."""

    @pytest.mark.parametrize(
        ("reqs", "capture", "blocks"), [(256, 512, 256), (1024, 512, 512), (8, 0, 1), (0, 0, 1)]
    )
    def test_worked_numbers(self, reqs: int, capture: int, blocks: int) -> None:
        """``min(max_num_reqs, max_cudagraph_capture_size) or 1``."""
        assert profiling_block_count(reqs, capture) == blocks

    @pytest.mark.parametrize("bad", [-1, True, 2.0])
    def test_bad_counts_name_the_field(self, bad: Any) -> None:
        """A typed error naming the argument and its value."""
        with pytest.raises(ValueError, match="max_num_reqs"):
            profiling_block_count(bad, 8)


class TestObservation:
    """What the observer does on a two-worker problem with the reference."""

    def test_each_worker_plans_its_own_slice(self) -> None:
        """Grouping sees one worker's layers; placement asks for the profiling count."""
        obs = observe_in(_ctx(ReferenceKVCacheConfigBuilder), "profiling", _two_workers(3, 1))
        assert isinstance(obs, ProfilingObservation)
        grouped = [c for c in obs.calls if c.hook == "get_kv_cache_groups"]
        placed = [c for c in obs.calls if c.hook == "get_kv_cache_config_from_groups"]
        assert [sorted(n for g in c.value for n in g.layer_names) for c in grouped] == [
            sorted(obs.workers[0]),
            sorted(obs.workers[1]),
        ]
        assert [c.value.num_blocks for c in placed] == [256, 256]
        assert obs.hook_verdicts and not any(obs.hook_verdicts.values())
        assert "KV-GROUP-PARTITION" in obs.hook_verdicts
        assert "KV-PLACE-NUM-BLOCKS" in obs.hook_verdicts

    def test_builders_come_from_resolution(self) -> None:
        """One resolution per worker plus one more, each a distinct instance of the class."""
        obs = observe_in(_ctx(ReferenceKVCacheConfigBuilder), "profiling", _two_workers(2, 2))
        assert obs.qualname == "kvref.builder:ReferenceKVCacheConfigBuilder"
        assert len(obs.resolutions) == 3
        assert len({r.identity for r in obs.resolutions}) == 3
        assert all(r.is_named_class for r in obs.resolutions)
        assert obs.again is not None and obs.again.value == obs.calls[0].value


class TestReferencePasses:
    """The reference keeps every invariant the profiling scenario judges."""

    def test_generated_examples(self) -> None:
        """Every profiling invariant holds on generated problems, and each is judged."""
        checks = [inv for inv in catalog() if "profiling" in inv.scenarios]
        judged: set[str] = set()
        ctx = _ctx(ReferenceKVCacheConfigBuilder)

        @seed(3)
        @settings(
            max_examples=30, database=None, deadline=None, suppress_health_check=list(HealthCheck)
        )
        @given(examples("profiling"))
        def run(example: Example) -> None:
            obs = observe_in(ctx, "profiling", example)
            for inv in checks:
                outcome = inv.check(obs)
                if isinstance(outcome, list):
                    assert outcome == [], (inv.id, outcome, example)
                    judged.add(inv.id)

        run()
        # Attention-free models never place; every other hook-answer check is reached.
        assert {"KV-CALL-FRESH", "KV-GROUP-PARTITION", "KV-PLACE-NUM-BLOCKS"} <= judged
        assert "KV-PLACE-PAGE-PITCH" in judged


class TestBrokenBuilders:
    """Builders that mishandle the profiling path or resolution are caught; legal ones are not."""

    def test_per_stage_groups_only_breaks_on_one_worker(self) -> None:
        """All workers' layers group fine; worker 1's single layer gets an empty group."""
        example = _two_workers(3, 1)
        grouping = by_id()["KV-GROUP-NONEMPTY"].check(
            observe_in(_ctx(PerStageGroups), "grouping", example)
        )
        assert grouping == []
        found = _judge(PerStageGroups, example, "KV-GROUP-NONEMPTY")
        assert found and {v.worker for v in found} == {1}

    def test_per_stage_groups_caught_in_a_run(self) -> None:
        """A run finds it, in the profiling scenario, with a shrunk counterexample."""
        report = check_builder(
            PerStageGroups, select=["KV-GROUP-NONEMPTY"], max_examples=30, seed=5
        )
        failure = next(r for r in report.results if r.id == "KV-GROUP-NONEMPTY")
        assert failure.status == "fail", failure
        assert failure.scenario == "profiling"
        assert failure.counterexample_python and "pipeline_parallel_size" in (
            failure.counterexample_python
        )

    def test_shared_instance_is_not_fresh(self) -> None:
        """A class whose construction returns one shared object breaks KV-CALL-FRESH."""
        import broken_builders

        found = _judge(broken_builders.SharedInstance, _two_workers(1, 1), "KV-CALL-FRESH")
        assert found and "same object" in found[0].message

    def test_foreign_instance(self) -> None:
        """Construction that yields another class's instance breaks KV-CALL-FRESH."""
        found = _judge(ForeignInstance, _two_workers(1, 1), "KV-CALL-FRESH")
        assert found and "not an instance of the class" in found[0].message

    def test_construction_failure_is_construct_not_fresh(self) -> None:
        """A class that cannot be built twice is a construction failure, not a freshness one."""
        import broken_builders

        obs = observe_in(_ctx(broken_builders.ConstructsOnce), "profiling", _two_workers(1, 1))
        assert isinstance(obs, ConstructFailure)

    def test_legal_instance_state_passes(self) -> None:
        """Per-instance state that never changes an answer is legal."""
        assert _judge(InstanceState, _two_workers(2, 1), "KV-CALL-FRESH") == []

    def test_builder_without_qualname_is_not_applicable(self) -> None:
        """A class defined in a function has no qualname a platform could name."""

        class Local(ReferenceKVCacheConfigBuilder):
            pass

        outcome = _judge(Local, _two_workers(1, 1), "KV-CALL-FRESH")
        assert isinstance(outcome, Unjudged) and not outcome.applicable


class CountsConstructions(ReferenceKVCacheConfigBuilder):
    """Legal: counts its constructions per process (shows where resolution constructs)."""

    made = 0

    def __init__(self) -> None:
        type(self).made += 1


class TestIsolatedResolution:
    """Under ``--isolate`` (the CLI default) resolution runs in the builder's worker process."""

    @staticmethod
    def _observe(builder: type, name: str) -> Any:
        from conformance.harness.isolate import isolated

        proxy = isolated(builder, name)
        try:
            obs = observe_in(_ctx_named(proxy, name), "profiling", _two_workers(1, 1))
            return obs, by_id()["KV-CALL-FRESH"].check(obs)
        finally:
            proxy.close()

    def test_shared_instance_is_not_fresh(self) -> None:
        """One object handed out by every resolution in the worker breaks KV-CALL-FRESH."""
        import broken_builders

        _, found = self._observe(broken_builders.SharedInstance, "broken_builders:SharedInstance")
        assert isinstance(found, list) and found, found
        assert "same object" in found[0].message

    def test_reference_passes_and_the_kit_constructs_nothing(self) -> None:
        """Distinct instances of the named class, each made in the worker, never in the kit."""
        before = CountsConstructions.made
        obs, found = self._observe(
            CountsConstructions, "test_profiling_scenario:CountsConstructions"
        )
        assert found == []
        assert len({r.identity for r in obs.resolutions}) == len(obs.resolutions) == 3
        assert all(r.is_named_class for r in obs.resolutions)
        assert CountsConstructions.made == before
        assert obs.again is not None and obs.again.value == obs.calls[0].value

    @pytest.mark.parametrize(
        ("builder", "status"),
        [("SharedInstance", "fail"), ("ReferenceKVCacheConfigBuilder", "pass")],
    )
    def test_an_isolated_run_judges_it(self, builder: str, status: str) -> None:
        """``check_builder(isolate=True)`` judges KV-CALL-FRESH instead of leaving it N/A."""
        import broken_builders

        cls = getattr(broken_builders, builder, ReferenceKVCacheConfigBuilder)
        report = check_builder(
            cls, select=["KV-CALL-FRESH"], max_examples=5, seed=3, isolate=True, shrink=False
        )
        result = next(r for r in report.results if r.id == "KV-CALL-FRESH")
        assert result.status == status, result


def _ctx_named(builder: Any, name: str) -> Context:
    guard = Guard(10.0)
    qualname, note = resolvable_qualname(builder, name)
    assert qualname == name, note
    return Context(
        factory=make_factory(builder, guard),
        guard=guard,
        qualname=qualname,
        qualname_note=note,
        resolver=isolated_resolver(builder),
    )
