"""The profiling path (contract.md#profiling-path): one worker's specs, one block per sequence."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest
from _hooked import hooked
from specs import MODEL_A_FULL as FULL
from specs import MODEL_A_PP0 as W0
from specs import MODEL_A_PP1 as W1
from specs import MODEL_A_SWA as SWA
from specs import full

from kvref import (
    EncoderOnlyAttentionSpec,
    PlanningConfig,
    ReferenceKVCacheConfigBuilder,
    SlidingWindowSpec,
    plan_kv_cache,
)
from kvref.errors import ConfigError, PartitionError, PlanningError, SpecError
from kvref.profiling import plan_profiling_kv_cache, profiling_num_blocks
from kvref.records import KVCacheConfig, KVCacheGroupSpec
from kvref.specs import KVCacheSpec

CONFIG = PlanningConfig(max_model_len=32768, max_num_batched_tokens=1024)
B = ReferenceKVCacheConfigBuilder
Groups = list[KVCacheGroupSpec]


def retained_by_windows(groups: Sequence[KVCacheGroupSpec]) -> list[int]:
    """``extra_retained_tokens`` of every sliding-window layer of ``groups``, in order."""
    return [
        s.extra_retained_tokens
        for g in groups
        for _, s in g.layer_specs()
        if isinstance(s, SlidingWindowSpec)
    ]


class TestNumBlocks:
    """``min(max_num_reqs, max_cudagraph_capture_size) or 1``."""

    @pytest.mark.parametrize(
        ("reqs", "capture", "blocks"), [(128, 512, 128), (256, 64, 64), (128, 0, 1), (0, 0, 1)]
    )
    def test_values(self, reqs: int, capture: int, blocks: int) -> None:
        """One block per sequence, at least one."""
        assert profiling_num_blocks(reqs, capture) == blocks

    @pytest.mark.parametrize(("reqs", "capture"), [(-1, 8), (8, -1), (True, 8), (8, 2.0)])
    def test_bad_counts(self, reqs: object, capture: object) -> None:
        """A negative or non-int count is a ``ConfigError`` naming it."""
        with pytest.raises(ConfigError, match="must be an int >= 0"):
            profiling_num_blocks(reqs, capture)  # type: ignore[arg-type]


class TestOneWorker:
    """The builder sees the worker's own PP slice, not the global groups projected."""

    def test_worker0_groups_its_own_layers(self) -> None:
        """w0 holds F x 6 and S x 10: m=6, M=10 >= 9, so group size 6: F[6], S[5], S[5].

        bpb = 6 * 65,536 = 393,216 and 128 blocks give 50,331,648 bytes.
        """
        plan = plan_profiling_kv_cache(
            B, CONFIG, W0, max_num_reqs=128, max_cudagraph_capture_size=512
        )
        assert [len(g.layer_names) for g in plan.groups] == [6, 5, 5]
        assert plan.num_blocks_requested == plan.config.num_blocks == 128
        assert {t.size for t in plan.config.kv_cache_tensors} == {128 * 393_216}
        assert 128 * 393_216 == 50_331_648

    def test_worker1_differs_from_the_projection(self) -> None:
        """w1 holds S x 10 (first, l16) and F x 4: M=10 >= 6, so size 4: S[4], S[3], S[3], F[4].

        Its own bpb is 4 * 65,536 = 262,144, where planning's projection of
        the global groups gives 5 * 65,536 = 327,680 (contract.md#core-flow).
        """
        plan = plan_profiling_kv_cache(
            B, CONFIG, W1, max_num_reqs=256, max_cudagraph_capture_size=64
        )
        assert [len(g.layer_names) for g in plan.groups] == [4, 3, 3, 4]
        assert {t.size for t in plan.config.kv_cache_tensors} == {64 * 262_144}
        planned = plan_kv_cache(B, CONFIG, [W0, W1], [2_147_483_648, 1_610_612_736])
        assert planned.workers[1].pool_bytes_per_block == 327_680

    def test_no_window_tagging_and_no_eagle_flag(self) -> None:
        """Lookahead 3 tags windows with 2 retained tokens in planning, not in profiling."""
        draft = full(is_draft=True)
        specs = {"s0": SWA, "f0": FULL, "d0": draft}
        config = PlanningConfig(num_prefill_lookahead_tokens=3, eagle_block_drop=True)
        plan = plan_profiling_kv_cache(
            B, config, specs, max_num_reqs=4, max_cudagraph_capture_size=8
        )
        assert retained_by_windows(plan.groups) == [0]
        assert not any(g.is_eagle_group for g in plan.groups)
        planned = plan_kv_cache(B, config, [specs], 1 << 30)
        assert retained_by_windows(planned.global_groups) == [2]
        assert any(g.is_eagle_group for g in planned.global_groups)

    def test_exact_blocks_under_override(self) -> None:
        """Deliberate difference: the reference places the 4 blocks asked for, not the override."""
        config = PlanningConfig(num_gpu_blocks_override=1000)
        plan = plan_profiling_kv_cache(B, config, W0, max_num_reqs=4, max_cudagraph_capture_size=8)
        assert plan.config.num_blocks == 4

    def test_input_is_not_mutated(self) -> None:
        """The worker's dict is the caller's: the builder gets a copy."""
        specs = dict(W0)
        plan_profiling_kv_cache(B, CONFIG, specs, max_num_reqs=4, max_cudagraph_capture_size=8)
        assert specs == W0


class TestChecks:
    """Registry and partition checks, and a builder's bad output."""

    def test_registry_check(self) -> None:
        """An encoder-only layer is refused (V1 runner); the V2 path skips the check."""
        enc = EncoderOnlyAttentionSpec(
            block_size=16, num_kv_heads=8, head_size=128, dtype="bfloat16"
        )
        with pytest.raises(SpecError, match="not registered"):
            plan_profiling_kv_cache(
                B, CONFIG, {"e": enc}, max_num_reqs=1, max_cudagraph_capture_size=1
            )
        plan = plan_profiling_kv_cache(
            B,
            CONFIG,
            {"e": enc},
            max_num_reqs=1,
            max_cudagraph_capture_size=1,
            check_registry=False,
        )
        assert [list(g.layer_names) for g in plan.groups] == [["e"]]

    def test_partition_check(self) -> None:
        """A builder that drops a layer fails Core's partition check."""
        drops = hooked(groups=lambda b, config, specs: B.get_kv_cache_groups(b, config, specs)[1:])
        with pytest.raises(PartitionError, match="miss layers"):
            plan_profiling_kv_cache(drops, CONFIG, W0, max_num_reqs=1, max_cudagraph_capture_size=1)

    def test_placement_must_be_a_config(self) -> None:
        """A placement that is not a ``KVCacheConfig`` is a ``PlanningError``."""
        bad = hooked(place=lambda *_: None)  # type: ignore[arg-type,return-value]
        with pytest.raises(PlanningError, match="not a KVCacheConfig"):
            plan_profiling_kv_cache(bad, CONFIG, W0, max_num_reqs=1, max_cudagraph_capture_size=1)

    def test_same_builder_for_both_hooks(self) -> None:
        """One fresh builder groups and places (vLLM resolves once per profiling call)."""
        seen: list[int] = []

        def groups(b: B, config: PlanningConfig, specs: Mapping[str, KVCacheSpec]) -> Groups:
            seen.append(id(b))
            return B.get_kv_cache_groups(b, config, specs)

        def place(b: B, config: PlanningConfig, kv_groups: Groups, n: int) -> KVCacheConfig:
            seen.append(id(b))
            return B.get_kv_cache_config_from_groups(b, config, kv_groups, n)

        tracks = hooked(groups=groups, place=place)
        plan_profiling_kv_cache(tracks, CONFIG, W0, max_num_reqs=1, max_cudagraph_capture_size=1)
        assert len(seen) == 2 and seen[0] == seen[1]

    def test_bad_worker_specs(self) -> None:
        """A non-spec value is a ``SpecError`` naming the layer."""
        with pytest.raises(SpecError, match="'x'"):
            plan_profiling_kv_cache(
                B,
                CONFIG,
                {"x": 3},
                max_num_reqs=1,
                max_cudagraph_capture_size=1,  # type: ignore[dict-item]
            )
