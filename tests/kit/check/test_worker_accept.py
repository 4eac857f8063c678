"""The KV-WORKER-* invariants: what vLLM's GPU worker accepts, and the extensible KV cache.

Each invariant fails on a builder that breaks its rule, under every vLLM
release whose worker has the rule, is not applicable (never a pass) under
the others, and does not fail legal builders that differ from the
reference.  Judged on observations first (cheap), then in two lean runs of
the whole kit.  The vLLM-native forms are tests/vllm/test_worker_accept_native.py's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
import broken_builders
import legal_builders
import pytest
import worker_builders
from drawn import drawn_examples
from kit_runs import quick_check
from specs import MIXED_LAYERS as _MIXED
from specs import UNIFORM_LAYERS as _UNIFORM
from specs import WIDE as _WIDE
from specs import compressed_mla, mla

from conformance.check import memory
from conformance.check.catalog import Unjudged, by_id
from conformance.check.extensible import committed_counts, shrunk
from conformance.check.observations import PlacementObservation
from conformance.harness.guard import Guard
from conformance.harness.hooks import Context, make_factory
from conformance.scenarios.examples import Example
from conformance.scenarios.placement import observe_placement
from conformance.scenarios.registry import observe_in
from kvref import (
    PlanningConfig,
    ReferenceKVCacheConfigBuilder,
)
from kvref.specs import KVCacheSpec

WORKER = (
    "KV-WORKER-ONE-BACKING",
    "KV-WORKER-LAYER-REGIONS",
    "KV-WORKER-BLOCK-SEGMENTS",
    "KV-WORKER-COMMITTED",
    "KV-WORKER-POOL-BYTES",
)
RELEASES = ("0.33.0", "0.34.0")
#: The invariants of the extensible KV cache: vLLM 0.34.0 on.
EXTENSIBLE = frozenset(WORKER) - {"KV-WORKER-ONE-BACKING"}


#: A compressed MLA model (four tokens a state, pages padded to 576 bytes).
_COMPRESSED: dict[str, KVCacheSpec] = {
    f"model.layers.{i}.self_attn.attn": compressed_mla() for i in range(2)
}


def observe(
    builder: Any, layout: str, specs: Mapping[str, KVCacheSpec], release: str, num_blocks: int = 8
) -> PlacementObservation:
    """The placement scenario's observation of ``builder`` on one model."""
    guard = Guard(10.0)
    ctx = Context(factory=make_factory(builder, guard), guard=guard)
    config = PlanningConfig(kv_cache_layout=layout, max_model_len=256, vllm_version=release)
    return observe_placement(ctx, config, dict(specs), num_blocks)


def judge(invariant: str, obs: Any) -> Any:
    """The catalog's verdict of ``invariant`` on ``obs``."""
    return by_id()[invariant].check(obs)


def fails(invariant: str, obs: Any) -> str:
    """The first violation's text; fails the test when the invariant held."""
    outcome = judge(invariant, obs)
    assert isinstance(outcome, list) and outcome, outcome
    return str(outcome[0])


def not_applicable(invariant: str, obs: Any, release: str) -> None:
    """The invariant's rule is not in ``release``: N/A with the release named, never a pass."""
    outcome = judge(invariant, obs)
    assert isinstance(outcome, Unjudged) and not outcome.applicable, outcome
    assert release in outcome.reason


def holds(invariant: str, obs: Any) -> None:
    """The invariant judged ``obs`` and found nothing."""
    assert judge(invariant, obs) == [], judge(invariant, obs)


class TestOneBacking:
    """Several device allocations: legal by the interface's text, refused by every worker."""

    @pytest.mark.parametrize("release", RELEASES)
    def test_separate_allocations_refused(self, release: str) -> None:
        """Two allocations of different sizes fail, the message naming vLLM and its assertion."""
        obs = observe(legal_builders.SeparateAllocations, "LBNHC", _UNIFORM, release)
        assert obs.declared_pool_bytes is not None
        text = fails("KV-WORKER-ONE-BACKING", obs)
        assert f"vLLM {release}" in text
        assert "KV cache tensors must share one backing allocation." in text
        assert "allocate_kv_cache" in text and "_get_pool_bytes_per_block" in text
        # The interface's own verdict on the same placement: it holds.
        assert judge("KV-PLACE-SINGLE-BACKING", obs) == []
        assert judge("KV-PLACE-POOL-BYTES", obs) == []

    @pytest.mark.parametrize("release", RELEASES)
    def test_one_tensor_per_layer_accepted(self, release: str) -> None:
        """Tensors of one size, however many, are one backing."""
        holds(
            "KV-WORKER-ONE-BACKING", observe(legal_builders.SplitTensors, "LBNHC", _MIXED, release)
        )


class TestLayerRegions:
    """LBNHC and LBHNC: regions of num_blocks blocks that tile the backing from byte 0."""

    @pytest.mark.parametrize("layout", ["LBNHC", "LBHNC"])
    def test_leading_scratch(self, layout: str) -> None:
        """Scratch before the first region: refused by 0.34.0, not applicable under 0.33.0."""
        text = fails(
            "KV-WORKER-LAYER-REGIONS",
            observe(worker_builders.LeadingScratch, layout, _UNIFORM, "0.34"),
        )
        assert "vLLM 0.34.0" in text and "KV cache tensors do not tile the allocation." in text
        assert "pad_kv_cache_segments" in text and "starts at byte" in text
        old = observe(worker_builders.LeadingScratch, layout, _UNIFORM, "0.33")
        not_applicable("KV-WORKER-LAYER-REGIONS", old, "0.33.0")
        # vLLM 0.33.0's worker runs it: the interface's memory checks hold.
        for inv in ("KV-PLACE-IN-BOUNDS", "KV-PLACE-NO-BLOCK-ALIAS", "KV-PLACE-BACKING-SIZE"):
            assert judge(inv, old) == [], inv

    def test_trailing_scratch_used_by_pages(self) -> None:
        """The last region moved past scratch: its pages are in bytes the worker drops."""
        obs = observe(worker_builders.ScratchGap, "LBNHC", _UNIFORM, "0.34")
        assert "do not tile" in fails("KV-WORKER-LAYER-REGIONS", obs)

    def test_trailing_scratch_unused_is_dropped(self) -> None:
        """Padding no page uses after the regions: the worker drops it; the regions are fine."""
        obs = observe(legal_builders.Padded4KiB, "LBNHC", _MIXED, "0.34")
        (config,) = [obs.config_at(8)]
        assert config is not None
        pages = sum(t.layer_stride * len(t.layers) for t in config.device_tensors)
        assert config.device_tensors[0].size > pages  # there is trailing scratch
        holds("KV-WORKER-LAYER-REGIONS", obs)

    def test_layer_stride_must_be_num_blocks_regions(self) -> None:
        """Layers spaced further than num_blocks x block_stride: vLLM's assertion."""
        obs = _respaced("LBNHC", "0.34")
        text = fails("KV-WORKER-LAYER-REGIONS", obs)
        assert "layer_stride=" in text and "not num_blocks x block_stride" in text

    def test_block_outermost_is_not_its_rule(self) -> None:
        """BLHNC: not applicable, naming the invariant that judges it."""
        obs = observe(ReferenceKVCacheConfigBuilder, "BLHNC", _UNIFORM, "0.34")
        outcome = judge("KV-WORKER-LAYER-REGIONS", obs)
        assert isinstance(outcome, Unjudged) and not outcome.applicable
        assert "KV-WORKER-BLOCK-SEGMENTS" in outcome.reason


def _respaced(layout: str, release: str) -> PlacementObservation:
    """The reference's plan with one page per block of gap between its layer regions."""

    class Respaced(ReferenceKVCacheConfigBuilder):
        def get_kv_cache_config_from_groups(self, config: Any, groups: Any, n: int) -> Any:
            result = super().get_kv_cache_config_from_groups(config, groups, n)
            tensors = [
                attrs.evolve(t, layer_stride=t.layer_stride + n * t.block_stride, size=2 * t.size)
                for t in result.kv_cache_tensors
            ]
            return attrs.evolve(result, kv_cache_tensors=tensors)

    return observe(Respaced, layout, _UNIFORM, release)


class TestBlockSegments:
    """Every other layout: one block stride, whole num_blocks-block segments."""

    @pytest.mark.parametrize("layout", ["BLHNC", "BLNHC"])
    def test_per_layer_pools_of_different_strides(self, layout: str) -> None:
        """Per-layer pools stepping their own pages: refused by 0.34.0 only."""
        obs = observe(worker_builders.PerLayerPools, layout, _MIXED, "0.34")
        text = fails("KV-WORKER-BLOCK-SEGMENTS", obs)
        assert "with different block strides need a block-compact layer-outermost layout" in text
        old = observe(worker_builders.PerLayerPools, layout, _MIXED, "0.33")
        not_applicable("KV-WORKER-BLOCK-SEGMENTS", old, "0.33.0")
        # The interface's own rule for block-outermost layouts refuses it in every release.
        assert judge("KV-PLACE-BLOCK-STRIDE", old)

    def test_per_layer_pools_of_one_stride_are_segments(self) -> None:
        """Pools of one page are whole segments, one per layer: accepted."""
        obs = observe(worker_builders.PerLayerPools, "BLHNC", _UNIFORM, "0.34")
        for inv in ("KV-WORKER-BLOCK-SEGMENTS", "KV-WORKER-COMMITTED", "KV-WORKER-POOL-BYTES"):
            holds(inv, obs)

    @pytest.mark.parametrize("layout", ["BLHNC", "BHLNC"])
    def test_trailing_scratch(self, layout: str) -> None:
        """Scratch after the blocks: not a whole number of segments under 0.34.0."""
        obs = observe(worker_builders.TrailingScratch, layout, _UNIFORM, "0.34")
        assert "is not a whole number of 8-block segments." in fails(
            "KV-WORKER-BLOCK-SEGMENTS", obs
        )
        old = observe(worker_builders.TrailingScratch, layout, _UNIFORM, "0.33")
        not_applicable("KV-WORKER-BLOCK-SEGMENTS", old, "0.33.0")
        assert judge("KV-PLACE-BLOCK-STRIDE", old)


class TestCommitted:
    """The capacity lowered in place: pages of the committed blocks stay in committed bytes."""

    def test_safe_at_capacity_unsafe_when_committed(self) -> None:
        """ShiftedHeads is memory safe at N, yet its committed blocks leave their segments."""
        obs = observe(worker_builders.ShiftedHeads, "LHBNC", _UNIFORM, "0.34")
        for inv in ("KV-PLACE-IN-BOUNDS", "KV-PLACE-NO-BLOCK-ALIAS", "KV-PLACE-NO-LAYER-OVERLAP"):
            assert judge(inv, obs) == [], inv
        for inv in ("KV-WORKER-BLOCK-SEGMENTS", "KV-WORKER-POOL-BYTES"):
            holds(inv, obs)
        text = fails("KV-WORKER-COMMITTED", obs)
        assert "committed at N'=1" in text and "shrink_kv_cache_configs" in text
        assert "vLLM 0.34.0" in text
        not_applicable(
            "KV-WORKER-COMMITTED",
            observe(worker_builders.ShiftedHeads, "LHBNC", _UNIFORM, "0.33"),
            "0.33.0",
        )

    def test_counts_and_shrink(self) -> None:
        """N' in {1, 2, N//2, N-1} below N; Core's shrink keeps offsets and strides."""
        assert committed_counts(8) == [1, 2, 4, 7]
        assert committed_counts(2) == [1]
        assert committed_counts(1) == []
        obs = observe(worker_builders.ShiftedHeads, "LHBNC", _UNIFORM, "0.34")
        config = obs.config_at(8)
        assert config is not None
        low = shrunk(config, 3)
        assert low.num_blocks == 3
        for before, after in zip(config.kv_cache_tensors, low.kv_cache_tensors, strict=True):
            assert after.size == 3 * before.size // 8
            assert (after.offset, after.layer_stride, after.block_stride) == (
                before.offset,
                before.layer_stride,
                before.block_stride,
            )

    def test_shrunk_layer_outer_sizes_are_never_a_bound(self) -> None:
        """The reference in LBNHC, shrunk: layers start past the shrunk size, and that is fine."""
        obs = observe(ReferenceKVCacheConfigBuilder, "LBNHC", _UNIFORM, "0.34")
        config = obs.config_at(8)
        assert config is not None
        # On the shrunk config's own size the kit's bounds check would cry wolf...
        assert memory.find_out_of_bounds(shrunk(config, 2), "LBNHC")
        # ...while the committed prefixes of the reservation hold every page.
        holds("KV-WORKER-COMMITTED", obs)


def test_absurd_backing_is_judged_without_enumerating_its_segments() -> None:
    """A 2**60-byte backing is 2**43 whole segments at 2 blocks: judged by arithmetic, at once."""
    four = {f"model.layers.{i}.self_attn.attn": _WIDE for i in range(4)}
    # Placed at 1, 2 and 4 blocks: every count divides the backing into whole segments.
    obs = observe(broken_builders.AbsurdSize, "BLHNC", four, "0.34", num_blocks=2)
    config = obs.config_at(2)
    assert config is not None and config.device_tensors[0].size == 2**60
    holds("KV-WORKER-BLOCK-SEGMENTS", obs)
    holds("KV-WORKER-COMMITTED", obs)
    # The probe's backing is 2**60 bytes a block; the worker's segments take 2**60 / 2.
    text = fails("KV-WORKER-POOL-BYTES", obs)
    assert f"with {2**60} bytes per block" in text and f"{2**59} bytes per block in all" in text


class TestPoolBytes:
    """The bytes per block Core plans with are the worker's."""

    def test_probe_counts_dropped_scratch(self) -> None:
        """Padded4KiB in LBNHC: the probe counts the padding, the worker's segments do not."""
        obs = observe(legal_builders.Padded4KiB, "LBNHC", _MIXED, "0.34")
        text = fails("KV-WORKER-POOL-BYTES", obs)
        assert "Core's one-block probe" in text and "ExtensibleKVCache.bytes_per_block" in text
        old = observe(legal_builders.Padded4KiB, "LBNHC", _MIXED, "0.33")
        not_applicable("KV-WORKER-POOL-BYTES", old, "0.33.0")
        assert judge("KV-PLACE-POOL-BYTES", old) == []

    def test_declared_bytes_count_dropped_scratch(self) -> None:
        """A declared answer that matches the backing, not the segments: only 0.34.0 cares."""

        class DeclaresPadded(legal_builders.Padded4KiB, legal_builders.DeclaresPoolBytes):
            pass

        new = observe(DeclaresPadded, "LBNHC", _MIXED, "0.34")
        assert new.declared_pool_bytes is not None
        assert "the builder's _get_pool_bytes_per_block" in fails("KV-WORKER-POOL-BYTES", new)
        old = observe(DeclaresPadded, "LBNHC", _MIXED, "0.33")
        assert judge("KV-PLACE-POOL-BYTES", old) == []
        not_applicable("KV-WORKER-POOL-BYTES", old, "0.33.0")

    def test_padding_inside_the_block_is_the_workers(self) -> None:
        """Padded4KiB in BLHNC pads every block's stride: the worker steps the padded block."""
        holds("KV-WORKER-POOL-BYTES", observe(legal_builders.Padded4KiB, "BLHNC", _MIXED, "0.34"))


class TestWhereTheCacheIsOff:
    """Examples vLLM 0.34.0 runs without the extensible KV cache, or refuses first."""

    def test_block_override_turns_it_off(self) -> None:
        """num_gpu_blocks_override: unjudged, with the reason."""
        obs = observe(worker_builders.LeadingScratch, "LBNHC", _UNIFORM, "0.34")
        off = attrs.evolve(obs, config=attrs.evolve(obs.config, num_gpu_blocks_override=8))
        for inv in sorted(EXTENSIBLE):
            outcome = judge(inv, off)
            assert isinstance(outcome, Unjudged) and "num_gpu_blocks_override" in outcome.reason

    def test_connector_needs_a_block_compact_layout(self) -> None:
        """A KV connector in LHBNC: vLLM 0.34.0 refuses the layout before any placement."""
        obs = observe(worker_builders.ShiftedHeads, "LHBNC", _UNIFORM, "0.34")
        linked = attrs.evolve(obs, config=attrs.evolve(obs.config, kv_connector_layout="LHBNC"))
        outcome = judge("KV-WORKER-COMMITTED", linked)
        assert isinstance(outcome, Unjudged) and "block-compact" in outcome.reason
        # In a block-compact layout the connector changes nothing.
        lb = observe(worker_builders.LeadingScratch, "LBNHC", _UNIFORM, "0.34")
        linked = attrs.evolve(lb, config=attrs.evolve(lb.config, kv_connector_layout="LBNHC"))
        assert "do not tile" in fails("KV-WORKER-LAYER-REGIONS", linked)


#: What vLLM's worker makes of the legal builders (and their expected failures).
_LEGAL = (
    ReferenceKVCacheConfigBuilder,
    *legal_builders.ALL,
    *legal_builders.FIELD_REGIMES,
    legal_builders.PadsTwice,
    legal_builders.SeparateAllocations,
)


def worker_failures(builder: type, release: str) -> frozenset[str]:
    """The KV-WORKER-* invariants ``builder`` is expected to fail under ``release``."""
    expected: Mapping[str, frozenset[str]] = getattr(builder, "WORKER_REFUSED", {})
    return expected.get(release, frozenset())


@pytest.fixture(scope="module")
def drawn() -> list[Example]:
    """Placement examples of the default generation (every layout the kit draws)."""
    return drawn_examples(40)


@pytest.mark.parametrize("builder", _LEGAL, ids=lambda b: b.__name__)
def test_legal_builders_fail_only_what_their_release_refuses(
    builder: type, drawn: list[Example]
) -> None:
    """Under each release a legal builder fails no KV-WORKER-* invariant but its expected ones.

    One observation per example serves both releases: the placement does not
    depend on the release here, only the rules judging it.
    """
    guard = Guard(10.0)
    ctx = Context(factory=make_factory(builder, guard), guard=guard)
    failed: dict[str, set[str]] = {r: set() for r in RELEASES}
    for ex in drawn:
        obs = observe_in(ctx, "placement", ex)
        for release in RELEASES:
            as_release = attrs.evolve(obs, config=attrs.evolve(obs.config, vllm_version=release))
            for inv in WORKER:
                outcome = judge(inv, as_release)
                if isinstance(outcome, list) and outcome:
                    failed[release].add(inv)
    for release in RELEASES:
        assert failed[release] <= worker_failures(builder, release), (release, failed)


#: Fifteen MLA layers of one-token blocks: 1,152-byte pages, 17,280 bytes a block
#: that Padded4KiB pads to 20,480 (not a whole number of 1,152-byte pages).
_MLA_ODD_BLOCK: dict[str, KVCacheSpec] = {
    f"model.layers.{i}.self_attn.attn": mla(block_size=1) for i in range(15)
}


@pytest.mark.parametrize(
    ("builder", "cases"),
    [
        (legal_builders.SeparateAllocations, (("LBNHC", _UNIFORM),)),
        # Its pool bytes are refused layer-outer; its padded block cuts LHBNC's
        # segments where the padded block is not a whole number of pages.
        (legal_builders.Padded4KiB, (("LBNHC", _MIXED), ("LHBNC", _MLA_ODD_BLOCK))),
        (legal_builders.SpacedCompressedRuns, (("LBNHC", _COMPRESSED),)),
    ],
    ids=lambda v: getattr(v, "__name__", ""),
)
def test_expected_failures_are_real(
    builder: type, cases: tuple[tuple[str, Mapping[str, KVCacheSpec]], ...]
) -> None:
    """Every expected failure of a legal builder fails on a model and layout that reach it."""
    for release in RELEASES:
        observed = [observe(builder, layout, specs, release) for layout, specs in cases]
        for inv in worker_failures(builder, release):
            outcomes = [judge(inv, obs) for obs in observed]
            assert any(isinstance(o, list) and o for o in outcomes), (release, inv, outcomes)


class TestWholeKit:
    """Two lean runs: the release decides the verdict, the rest of the kit agrees."""

    @pytest.mark.parametrize(("release", "status"), [("0.34", "fail"), ("0.33", "not-applicable")])
    def test_leading_scratch(self, release: str, status: str) -> None:
        """LeadingScratch fails KV-WORKER-LAYER-REGIONS under 0.34 alone; 0.33 has no such rule."""
        report = quick_check(
            worker_builders.LeadingScratch,
            "KV-WORKER",
            examples=12,
            seed=3,
            vllm=release,
            shrink=False,
            isolate=True,
        )
        statuses = {r.id: r.status for r in report.results}
        assert statuses["KV-WORKER-LAYER-REGIONS"] == status, statuses
        assert set(report.failed_ids) <= {"KV-WORKER-LAYER-REGIONS"}, statuses
        if status == "fail":
            found = report.result("KV-WORKER-LAYER-REGIONS")
            assert found is not None and "vLLM 0.34.0" in str(found.violations[0])
            assert "--vllm 0.34.0" in (found.reproduce or "")
