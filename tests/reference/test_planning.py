"""Core's flow: the PP worked example, override, auto-fit, errors, projection.

See contract.md#core-flow.
"""

from __future__ import annotations

import copy

import attrs
import pytest
from specs import MODEL_A as LAYERS
from specs import MODEL_A_FULL as FULL
from specs import MODEL_A_PP0 as W0
from specs import MODEL_A_PP1 as W1
from specs import MODEL_A_SWA as SWA
from specs import projection_repro

from kvref import (
    EncoderOnlyAttentionSpec,
    InsufficientMemoryError,
    PlanningConfig,
    ReferenceKVCacheConfigBuilder,
    SlidingWindowSpec,
    get_kv_cache_configs,
    plan_kv_cache,
)
from kvref.errors import ConfigError, SpecError, WorkerSpecMismatchError

MEMORY = [2_147_483_648, 1_610_612_736]
CONFIG = PlanningConfig(max_model_len=32768, max_num_batched_tokens=1024)
B = ReferenceKVCacheConfigBuilder


class TestPipelineExample:
    """Model (a) of the contract on two PP workers with 2 and 1.5 GiB.

    See contract.md#core-flow.
    """

    def test_figures(self) -> None:
        """Bytes per block, admission figures and block counts match contract.md#core-flow."""
        assert CONFIG.max_in_flight_tokens == 2048
        plan = plan_kv_cache(B, CONFIG, [W0, W1], MEMORY)
        assert [len(g.layer_names) for g in plan.global_groups] == [10, 10, 10]
        w0, w1 = plan.workers
        assert (w0.pool_bytes_per_block, w1.pool_bytes_per_block) == (393_216, 327_680)
        assert (w0.check_memory, w1.check_memory) == (2_147_090_432, 1_610_285_056)
        assert (w0.needed_memory, w1.needed_memory) == (957_087_744, 797_573_120)
        assert (w0.num_blocks_before_min, w1.num_blocks_before_min) == (5461, 4915)
        assert plan.num_blocks == 4915

    def test_replanned_worker(self) -> None:
        """Worker 0 is re-planned at 4,915 blocks: size, layer stride, block stride, offset."""
        c0, c1 = get_kv_cache_configs(B, CONFIG, [W0, W1], MEMORY)
        assert {t.size for t in c0.kv_cache_tensors} == {1_932_656_640}
        assert {t.size for t in c1.kv_cache_tensors} == {1_610_547_200}
        for t in c0.kv_cache_tensors:
            assert (t.layer_stride, t.block_stride, t.offset) == (322_109_440, 65_536, 0)

    def test_override_3000(self) -> None:
        """num_gpu_blocks_override=3000 gives 3,000 blocks on both workers."""
        configs = get_kv_cache_configs(
            B, attrs.evolve(CONFIG, num_gpu_blocks_override=3000), [W0, W1], MEMORY
        )
        assert [c.num_blocks for c in configs] == [3000, 3000]
        assert [c.device_size for c in configs] == [1_179_648_000, 983_040_000]

    def test_override_2000_is_too_small(self) -> None:
        """num_gpu_blocks_override=2000: 0.89 GiB needed > 0.73 GiB available, estimated 25,808."""
        with pytest.raises(InsufficientMemoryError) as info:
            plan_kv_cache(B, attrs.evolve(CONFIG, num_gpu_blocks_override=2000), [W0, W1], MEMORY)
        err = info.value
        assert (err.needed_gib, err.available_gib, err.estimated_max_model_len) == (
            0.89,
            0.73,
            25808,
        )
        assert "25808" in str(err) and "0.89 GiB" in str(err)

    def test_auto_fit(self) -> None:
        """Auto-fit from 131,072 lowers max_model_len to 72,448 and keeps 4,915 blocks."""
        config = attrs.evolve(CONFIG, max_model_len=131072, auto_fit_max_model_len=True)
        plan = plan_kv_cache(B, config, [W0, W1], MEMORY)
        assert (plan.max_model_len, plan.num_blocks) == (72448, 4915)


class TestDeliberateDifferences:
    """Projection of uniform-type groups with no layer on a worker.

    See contract.md#deliberate-differences.
    """

    def test_empty_uniform_type_group_places_nothing(self) -> None:
        """The contract's repro: worker 1 gets an empty group and only tensors for its own layers.

        See contract.md#memory-safety.
        """
        w0, w1 = projection_repro()
        plan = plan_kv_cache(
            B, PlanningConfig(kv_cache_layout="BLHNC", max_model_len=4096), [w0, w1], 2**30
        )
        c1 = plan.configs[1]
        assert any(not g.layer_names for g in c1.kv_cache_groups)
        placed = {n for t in c1.kv_cache_tensors for n in t.layers}
        assert placed == set(w1)
        assert len({c.num_blocks for c in plan.configs}) == 1

    def test_zero_layer_worker(self) -> None:
        """A worker with no KV layer takes the other workers' block count (vLLM divides by zero)."""
        plan = plan_kv_cache(B, CONFIG, [LAYERS, {}], [2**31, 2**30])
        assert (
            plan.configs[1].kv_cache_tensors == () and plan.configs[1].num_blocks == plan.num_blocks
        )


class TestInputs:
    """Bad input gets a typed error; good input is never changed."""

    def test_not_mutated(self) -> None:
        """The workers' dicts are unchanged by planning."""
        workers = [dict(W0), dict(W1)]
        before = copy.deepcopy(workers)
        plan_kv_cache(B, attrs.evolve(CONFIG, num_prefill_lookahead_tokens=3), workers, MEMORY)
        assert workers == before

    def test_same_layer_different_specs(self) -> None:
        """One layer with two specs on two workers is a WorkerSpecMismatchError naming it."""
        with pytest.raises(WorkerSpecMismatchError, match="'l0'"):
            plan_kv_cache(B, CONFIG, [{"l0": FULL}, {"l0": SWA}], 2**30)

    def test_unregistered_spec(self) -> None:
        """An encoder-only layer fails the registry check with a SpecError naming the layer."""
        enc = EncoderOnlyAttentionSpec(
            block_size=16, num_kv_heads=12, head_size=64, dtype="float32"
        )
        with pytest.raises(SpecError, match=r"encoder\.0"):
            plan_kv_cache(B, CONFIG, [{"encoder.0": enc}], 2**30)

    @pytest.mark.parametrize(
        ("entry", "message"),
        [
            ({3: FULL}, r"kv_cache_specs\[1\]: layer name 3"),
            ({"a": 42}, r"kv_cache_specs\[1\]: layer 'a': 42"),
        ],
    )
    def test_bad_layer_entry(self, entry: dict[object, object], message: str) -> None:
        """A non-str layer name or a non-spec is a SpecError naming the worker, layer and value."""
        with pytest.raises(SpecError, match=message):
            plan_kv_cache(B, CONFIG, [{"l0": FULL}, entry], 2**30)  # type: ignore[list-item]

    @pytest.mark.parametrize("memory", [-1, [2**30], "lots", [2**30, -5]])
    def test_bad_memory(self, memory: object) -> None:
        """A negative, missing or non-int memory figure is a ConfigError."""
        with pytest.raises(ConfigError, match="available_memory"):
            plan_kv_cache(B, CONFIG, [W0, W1], memory)  # type: ignore[arg-type]

    def test_no_memory(self) -> None:
        """Memory that does not even hold the null block is an InsufficientMemoryError."""
        with pytest.raises(InsufficientMemoryError, match="no available memory"):
            plan_kv_cache(B, CONFIG, [W0, W1], [1000, 1000])

    def test_sliding_windows_retain_lookahead(self) -> None:
        """With 3 lookahead tokens, sliding windows keep 2 extra tokens in the global groups."""
        plan = plan_kv_cache(
            B, attrs.evolve(CONFIG, num_prefill_lookahead_tokens=3), [W0, W1], MEMORY
        )
        specs = [g.kv_cache_spec for g in plan.global_groups]
        assert {s.extra_retained_tokens for s in specs if isinstance(s, SlidingWindowSpec)} == {2}

    def test_eagle_groups(self) -> None:
        """With the EAGLE block drop, exactly the groups holding draft layers are marked."""
        draft = attrs.evolve(FULL, is_draft=True)
        layers = {**{f"t{i}": FULL for i in range(4)}, "d0": draft}
        plan = plan_kv_cache(B, attrs.evolve(CONFIG, eagle_block_drop=True), [layers], 2**32)
        assert [g.is_eagle_group for g in plan.global_groups] == [True]

    def test_attention_free(self) -> None:
        """An attention-free model plans one null block and no tensors on every worker."""
        plan = plan_kv_cache(B, CONFIG, [{}, {}], [0, 0])
        assert plan.num_blocks == 1 and all(c.kv_cache_tensors == () for c in plan.configs)
