"""Tests of the kit's Hypothesis strategies (conformance.generate, through its facade)."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis import strategies as st

from conformance.generate import strategies as cs
from conformance.generate.estimate import promotion_succeeds
from conformance.generate.families import SPECIALISED
from conformance.generate.families.presets import PRESETS
from conformance.generate.strategies import Model, PlanningProblem
from kvref.builder import ReferenceKVCacheConfigBuilder
from kvref.config import PlanningConfig
from kvref.errors import InsufficientMemoryError
from kvref.layout import KVCacheLayout, compute_layer_kv_cache_shape_bytes
from kvref.planning import plan_kv_cache
from kvref.specs import (
    CircularBufferSpec,
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
    dtype_size,
)

FAST = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FEW = settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# find() must not reuse a stored example: the database would return any old
# example that satisfies the condition instead of shrinking to the minimum.
# Derandomized: a "smallest example" test must not depend on how far one random
# search happened to shrink (a full-suite run once stopped at a 6-layer model).
MINIMAL = settings(database=None, deadline=None, derandomize=True)
# "X occurs" tests need an example, not the smallest one.
OCCURS = settings(database=None, deadline=None, max_examples=500, phases=[Phase.generate])

LAYER_OUTER = {KVCacheLayout.LBHNC, KVCacheLayout.LBNHC, KVCacheLayout.LHBNC}
NOT_BLOCK_COMPACT = {KVCacheLayout.LHBNC, KVCacheLayout.BHLNC}
GOLDEN = Path(__file__).resolve().parents[2] / "data" / "golden"
PLAIN = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=64, dtype=torch.bfloat16)

SPEC_STRATEGIES: dict[str, Callable[..., st.SearchStrategy[Any]]] = {
    "full": cs.full_attention_specs,
    "mla": cs.mla_specs,
    "sliding_window": cs.sliding_window_specs,
    "sliding_window_mla": cs.sliding_window_mla_specs,
    "chunked_local": cs.chunked_local_specs,
    "circular_buffer": cs.circular_buffer_specs,
    "mamba": cs.mamba_specs,
    "cross": cs.cross_attention_specs,
}
FAMILIES = [
    "uniform",
    "hybrid",
    "mla",
    "mamba_hybrid",
    "cross_attention",
    "attention_free",
    "mixed_pages",
    "circular_buffer",
    "realistic",
]


GENERIC = [f for f in cs.DEFAULT_FAMILIES if f not in SPECIALISED]


def _shape(spec: KVCacheSpec) -> tuple[int, int, int]:
    _, heads, states, content = compute_layer_kv_cache_shape_bytes(spec, 1)
    return heads, states, content


class TestDtypes:
    @FAST
    @given(cs.dtypes())
    def test_only_kv_dtypes(self, dtype: torch.dtype) -> None:
        """Only the five KV cache dtypes are generated."""
        assert dtype in {
            torch.bfloat16,
            torch.float16,
            torch.float8_e4m3fn,
            torch.float32,
            torch.uint8,
        }

    def test_shrinks_to_bf16(self) -> None:
        """The minimal dtype is bfloat16."""
        assert find(cs.dtypes(), lambda d: True, settings=MINIMAL) == torch.bfloat16


@pytest.mark.parametrize("strategy", [cs.block_sizes, cs.num_blocks], ids=["sizes", "counts"])
@FAST
@given(data=st.data())
def test_block_sizes_and_counts_stay_in_range(
    strategy: Callable[..., st.SearchStrategy[int]], data: st.DataObject
) -> None:
    """Block sizes and block counts stay within 1..max_value."""
    assert 1 <= data.draw(strategy(max_value=100)) <= 100


class TestBlockSizes:
    def test_non_powers_of_two_occur(self) -> None:
        """Non-powers of two are generated."""
        assert find(cs.block_sizes(), lambda b: b & (b - 1) != 0, settings=OCCURS) > 2

    def test_shrinks_to_16(self) -> None:
        """The minimal block size is vLLM's default of 16."""
        assert find(cs.block_sizes(), lambda b: True, settings=MINIMAL) == 16


class TestSpecStrategies:
    @pytest.mark.parametrize("kind", SPEC_STRATEGIES)
    def test_valid_bounded_and_aligned(self, kind: str) -> None:
        """Every spec constructs, has a page within the limit and dtype-aligned geometry."""

        @FAST
        @given(SPEC_STRATEGIES[kind]())
        def check(spec: KVCacheSpec) -> None:
            assert 0 < spec.page_size_bytes <= cs.MAX_PAGE_BYTES
            if isinstance(spec, MambaSpec):
                assert spec.page_size_bytes % 8 == 0
            else:
                # Typed views need C and every stride divisible by sizeof(dtype) (P10).
                size = dtype_size(spec.dtype)  # type: ignore[attr-defined]
                assert spec.state_content_size_bytes % size == 0
                assert spec.page_size_bytes % size == 0
                assert spec.block_stride % size == 0

        check()

    @pytest.mark.parametrize("kind", SPEC_STRATEGIES)
    def test_forced_block_size_is_kept(self, kind: str) -> None:
        """A given block_size is used as is."""
        spec = find(SPEC_STRATEGIES[kind](block_size=64), lambda s: True, settings=OCCURS)
        assert spec.block_size == 64

    @pytest.mark.parametrize("kind", SPEC_STRATEGIES)
    def test_minimal_spec_is_plain(self, kind: str) -> None:
        """The minimal spec has block 16 and none of the opaque backend fields."""
        spec = find(SPEC_STRATEGIES[kind](), lambda s: True, settings=MINIMAL)
        assert spec.block_size == 16
        assert spec.block_stride_alignment is None
        assert spec.padded_page_size is None
        assert getattr(spec, "num_head_slots", None) is None

    def test_minimal_full_attention(self) -> None:
        """The minimal full-attention spec is one bf16 head of 64 in blocks of 16."""
        spec = find(cs.full_attention_specs(), lambda s: True, settings=MINIMAL)
        assert spec == FullAttentionSpec(
            block_size=16, num_kv_heads=1, head_size=64, dtype=torch.bfloat16
        )

    @FAST
    @given(cs.mla_specs())
    def test_mla_geometry(self, spec: MLAAttentionSpec) -> None:
        """MLA specs have one 576-wide latent head and no value head; fp8_ds_mla is uint8 x 656."""
        assert (spec.num_kv_heads, spec.head_size, spec.head_size_v) == (1, 576, 0)
        if spec.cache_dtype_str == "fp8_ds_mla":
            assert spec.dtype == torch.uint8
            assert spec.state_content_bytes in {656, 584}

    def test_fp8_ds_mla_occurs(self) -> None:
        """The fp8_ds_mla variant with 656-byte states is generated."""
        spec = find(cs.mla_specs(), lambda s: s.state_content_bytes == 656, settings=OCCURS)
        assert spec.cache_dtype_str == "fp8_ds_mla"

    @FAST
    @given(cs.mamba_specs())
    def test_mamba_is_conv_plus_ssm(self, spec: MambaSpec) -> None:
        """Mamba specs have a 2-D conv state and an SSM state, in bf16 or fp32, and a known mode."""
        assert len(spec.shapes) == 2
        assert len(spec.shapes[0]) == 2
        assert set(spec.dtypes) <= {torch.bfloat16, torch.float32}
        assert spec.mamba_cache_mode in {"none", "align", "all"}
        if spec.page_size_padded is not None:
            assert spec.page_size_padded >= spec.real_page_size_bytes

    def test_padded_mamba_occurs(self) -> None:
        """Padded Mamba pages and speculative blocks are generated."""
        find(cs.mamba_specs(), lambda s: s.page_size_padded is not None, settings=OCCURS)
        find(cs.mamba_specs(), lambda s: s.num_speculative_blocks > 0, settings=OCCURS)


class TestModels:
    @pytest.mark.parametrize("family", FAMILIES)
    def test_families_construct(self, family: str) -> None:
        """Every family gives valid models with vLLM-like names and no mixed-page state kind."""

        @FEW
        @given(cs.models(families=[family]))
        def check(model: Model) -> None:
            assert all(".layers." in name for name in model.specs)
            for kind in (MambaSpec, SlidingWindowSpec, CircularBufferSpec):
                pages = {s.page_size_bytes for s in model.specs.values() if isinstance(s, kind)}
                assert len(pages) <= 1

        check()

    def test_unknown_family(self) -> None:
        """An unknown family name is a ValueError naming it."""
        with pytest.raises(ValueError, match="'llama'"):
            cs.models(families=["llama"])

    def test_minimal_two_layer_model(self) -> None:
        """The smallest model with two layers has exactly two plain layers in blocks of 16."""
        model = find(cs.models(), lambda m: len(m.specs) >= 2, settings=MINIMAL)
        specs = list(model.specs.values())
        assert len(specs) == 2
        assert all(s.block_size == 16 and s.padded_page_size is None for s in specs)

    @FAST
    @given(cs.hybrid_models())
    def test_hybrids_have_full_and_local_layers(self, model: Model) -> None:
        """Hybrids hold full and local layers with one page size."""
        kinds = {type(s) for s in model.specs.values()}
        assert FullAttentionSpec in kinds
        assert len(kinds) == 2
        assert len({s.page_size_bytes for s in model.specs.values()}) == 1

    @FAST
    @given(cs.hybrid_models())
    def test_drafts_are_full_and_marked(self, model: Model) -> None:
        """Draft layers are full attention marked is_draft, after the target's layers."""
        drafts = [name for name, s in model.specs.items() if s.is_draft]
        assert all(type(model.specs[n]) is FullAttentionSpec for n in drafts)
        assert list(model.specs)[len(model.specs) - len(drafts) :] == drafts

    def test_twelve_versus_thirteen(self) -> None:
        """The gpt-oss + EAGLE preset is the contract's 12 sliding vs 13 full layers.

        See contract.md#grouping-examples, model (b).
        """
        model = find(cs.realistic_models(), lambda m: "gpt-oss" in m.description, settings=OCCURS)
        local = sum(1 for s in model.specs.values() if isinstance(s, SlidingWindowSpec))
        assert (local, len(model.specs) - local) == (12, 13)
        assert sum(s.is_draft for s in model.specs.values()) == 1

    @FAST
    @given(cs.mamba_hybrid_models())
    def test_platform_prepadded_mamba(self, model: Model) -> None:
        """Pre-shaped Mamba pages equal the attention page, which holds the whole state."""
        mamba = [s for s in model.specs.values() if isinstance(s, MambaSpec)]
        attention = [s for s in model.specs.values() if not isinstance(s, MambaSpec)]
        assert mamba
        assert attention
        if mamba[0].page_size_padded is not None:
            assert mamba[0].page_size_bytes == attention[0].page_size_bytes
            assert attention[0].page_size_bytes >= mamba[0].real_page_size_bytes
            assert attention[0].block_size % 16 == 0

    def test_nemotron_preset_matches_golden(self) -> None:
        """The Nemotron-H preset has the golden problem's layer names and pages."""
        golden = json.loads((GOLDEN / "nemotron_h_8b_like_hybrid.json").read_text())
        model = next(m for m in (p() for p in PRESETS) if "Nemotron" in m.description)
        assert list(model.specs) == list(golden["workers"][0])
        assert {s.page_size_bytes for s in model.specs.values()} == {2162688}

    def test_specs_are_read_only(self) -> None:
        """A model's specs cannot be changed through the record."""
        model = Model(
            {
                "model.layers.0.self_attn.attn": FullAttentionSpec(
                    block_size=16, num_kv_heads=1, head_size=64, dtype=torch.bfloat16
                )
            }
        )
        with pytest.raises(TypeError):
            model.specs["x"] = model.specs["model.layers.0.self_attn.attn"]  # type: ignore[index]


class TestAllowedLayouts:
    @FAST
    @given(cs.models())
    def test_conservative_rule(self, model: Model) -> None:
        """Multi-shape models never get LHBNC/BHLNC; LBNHC is always allowed."""
        specs = list(model.specs.values())
        allowed = set(cs.allowed_layouts(model))
        assert allowed
        if len({_shape(s) for s in specs}) > 1:
            assert not allowed & NOT_BLOCK_COMPACT
        if any(isinstance(s, CircularBufferSpec) for s in specs):
            assert allowed == {KVCacheLayout.BLHNC}
        elif any(getattr(s, "model_version", None) == "deepseek_v4" for s in specs):
            # DeepSeek-V4's backends; other compressed MLA caches take any layout.
            assert allowed == {KVCacheLayout.BLNHC, KVCacheLayout.BLHNC}
        elif any(isinstance(s, MambaSpec) for s in specs) and any(
            isinstance(s, MLAAttentionSpec)
            and max(t.page_size_bytes for t in specs) % s.page_size_bytes
            for s in specs
        ):
            # A hybrid whose MLA page layer-outer unification cannot pad (GLM-5's indexer).
            assert allowed == {KVCacheLayout.BLNHC, KVCacheLayout.BLHNC}
        else:
            assert KVCacheLayout.LBNHC in allowed

    @FAST
    @given(cs.models().flatmap(lambda m: st.tuples(st.just(m), cs.layouts_for(m))))
    def test_layouts_for_draws_allowed(self, drawn: tuple[Model, KVCacheLayout]) -> None:
        """layouts_for only draws allowed layouts."""
        model, layout = drawn
        assert layout in cs.allowed_layouts(model)

    def test_single_shape_model_allows_all_in_vllm_order(self) -> None:
        """A Llama-like model may use every layout, in vLLM's preference order."""
        model = next(m for m in (p() for p in PRESETS) if "Llama" in m.description)
        assert [x.name for x in cs.allowed_layouts(model)] == [
            "LBNHC",
            "LBHNC",
            "BLNHC",
            "BLHNC",
            "BHLNC",
            "LHBNC",
        ]

    def test_mixed_pages_allow_layer_outer(self) -> None:
        """The contract's mixed-page model may use LB* (unification) and BL* (packing).

        See contract.md#grouping-examples, model (c).
        """
        kw: dict[str, Any] = {"block_size": 16, "head_size": 128, "dtype": "bfloat16"}
        model = {
            "l0": FullAttentionSpec(num_kv_heads=8, **kw),
            "l1": SlidingWindowSpec(num_kv_heads=4, sliding_window=1024, **kw),
        }
        assert cs.allowed_layouts(model) == (
            KVCacheLayout.LBNHC,
            KVCacheLayout.LBHNC,
            KVCacheLayout.BLNHC,
            KVCacheLayout.BLHNC,
        )

    def test_attention_free_allows_everything(self) -> None:
        """The attention-free model allows every layout."""
        assert len(cs.allowed_layouts({})) == 6

    def test_first_choice_is_lbnhc(self) -> None:
        """The minimal layout for a single-page model is vLLM's first preference, LBNHC."""
        model = Model(dict.fromkeys(["l0", "l1"], PLAIN))
        assert find(cs.layouts_for(model), lambda x: True, settings=MINIMAL) is KVCacheLayout.LBNHC


class TestVllmP3Alias:
    @FAST
    @given(cs.vllm_p3_alias_models())
    def test_strides_differ_and_general_rule_allows(self, model: Model) -> None:
        """Alias models share one page but not one block stride; the general rule allows LB*."""
        specs = list(model.specs.values())
        assert len({s.page_size_bytes for s in specs}) == 1
        assert len({s.block_stride for s in specs}) == 2
        assert set(cs.allowed_layouts(model)) & LAYER_OUTER

    @FEW
    @given(cs.vllm_p3_alias_problems())
    def test_problems_use_layer_outer_layouts(self, problem: PlanningProblem) -> None:
        """Alias problems are placed in LBNHC or LBHNC, the layouts where vLLM aliases."""
        assert problem.config.kv_cache_layout in {KVCacheLayout.LBNHC, KVCacheLayout.LBHNC}


class TestPlanningConfigs:
    @FAST
    @given(cs.models().flatmap(lambda m: st.tuples(st.just(m), cs.planning_configs(m))))
    def test_consistent_with_model(self, drawn: tuple[Model, PlanningConfig]) -> None:
        """Configs use an allowed layout, the model's Mamba mode and a host set of one spec."""
        model, config = drawn
        specs = model.specs
        assert config.kv_cache_layout in cs.allowed_layouts(model)
        modes = {s.mamba_cache_mode for s in specs.values() if isinstance(s, MambaSpec)}
        assert config.mamba_cache_mode == (modes.pop() if modes else "none")
        if config.disable_hybrid_kv_cache_manager:
            assert promotion_succeeds(list(specs.values()))
        if config.host_resident_layers:
            assert config.host_resident_layers < set(specs)
            assert len({specs[n] for n in config.host_resident_layers}) == 1
            assert config.host_pool_bytes

    def test_minimal_config_is_default(self) -> None:
        """The minimal config for a plain model is vLLM's default config, describing the model."""
        model = Model(dict.fromkeys(["l0", "l1"], PLAIN))
        config = find(cs.planning_configs(model), lambda c: True, settings=MINIMAL)
        assert config == PlanningConfig(num_hidden_layers=2)

    def test_promotion_rule(self) -> None:
        """Promotion is allowed for full + one window, not for two windows or Mamba + full."""
        kw: dict[str, Any] = {
            "block_size": 16,
            "num_kv_heads": 8,
            "head_size": 128,
            "dtype": "bfloat16",
        }
        full = FullAttentionSpec(**kw)
        sw = SlidingWindowSpec(sliding_window=1024, **kw)
        sw2 = SlidingWindowSpec(sliding_window=512, **kw)
        mamba = MambaSpec(block_size=16, shapes=((3, 64),), dtypes=("bfloat16",))
        assert promotion_succeeds([full, sw, sw])
        assert not promotion_succeeds([full, sw, sw2])
        assert not promotion_succeeds([full, mamba])


class TestPPSplits:
    @FAST
    @given(
        cs.models(max_layers=16).flatmap(
            lambda m: st.tuples(st.just(m), cs.pp_splits(m, max_workers=3))
        )
    )
    def test_contiguous_partition(self, drawn: tuple[Model, list[dict[str, KVCacheSpec]]]) -> None:
        """Workers partition the layers in order, none empty, at most max_workers of them."""
        model, workers = drawn
        assert 1 <= len(workers) <= 3
        joined = [item for worker in workers for item in worker.items()]
        assert joined == list(model.specs.items())
        if model.specs:
            assert all(workers)
        else:
            assert not any(workers)

    def test_uneven_splits_occur(self) -> None:
        """Uneven splits are generated."""
        model = Model(
            dict.fromkeys(
                [f"l{i}" for i in range(8)],
                FullAttentionSpec(
                    block_size=16, num_kv_heads=1, head_size=64, dtype=torch.bfloat16
                ),
            )
        )
        workers = find(
            cs.pp_splits(model), lambda w: len(w) == 2 and len(w[0]) != 4, settings=OCCURS
        )
        assert len(workers[0]) + len(workers[1]) == 8

    def test_rejects_zero_workers(self) -> None:
        """max_workers below one is a ValueError."""
        with pytest.raises(ValueError, match="max_workers"):
            cs.pp_splits({}, max_workers=0)


class TestMemoryBudgets:
    @FAST
    @given(cs.memory_budgets(1000, 7, max_extra_blocks=10))
    def test_range(self, budget: int) -> None:
        """Budgets lie between 0 and exact plus max_extra_blocks blocks."""
        assert 0 <= budget < (7 + 1 + 10 + 1) * 1000

    def test_shrinks_to_exact(self) -> None:
        """The minimal budget is the exact admission boundary: one request plus the null block."""
        assert find(cs.memory_budgets(1000, 7), lambda b: True, settings=MINIMAL) == 8000

    def test_too_small_and_large_occur(self) -> None:
        """Budgets below and above the boundary are generated."""
        assert find(cs.memory_budgets(1000, 7), lambda b: b < 8000, settings=OCCURS) < 8000
        assert find(cs.memory_budgets(1000, 7), lambda b: b > 8000, settings=OCCURS) > 8000

    def test_attention_free(self) -> None:
        """With no bytes per block any budget goes, 0 first."""
        assert find(cs.memory_budgets(0, 0), lambda b: True, settings=MINIMAL) == 0

    def test_rejects_negative(self) -> None:
        """Negative arguments are a ValueError."""
        with pytest.raises(ValueError, match="non-negative"):
            cs.memory_budgets(-1, 3)


class TestNumBlocks:
    def test_shrinks_to_one(self) -> None:
        """The minimal block count is 1."""
        assert find(cs.num_blocks(), lambda n: True, settings=MINIMAL) == 1

    def test_large_occurs(self) -> None:
        """Large block counts are generated."""
        assert find(cs.num_blocks(), lambda n: n > 1000, settings=OCCURS) > 1000


class TestPlanningProblems:
    @FAST
    @given(cs.planning_problems(max_workers=3))
    def test_well_formed(self, problem: PlanningProblem) -> None:
        """Problems have one budget per worker, PP size = workers and a device layer per worker."""
        config = problem.config
        assert len(problem.available_memory) == len(problem.workers)
        assert config.pipeline_parallel_size == len(problem.workers)
        assert config.kv_cache_layout in cs.allowed_layouts(problem.specs)
        assert all(b >= 0 for b in problem.available_memory)
        if problem.specs:
            for worker in problem.workers:
                assert set(worker) - config.host_resident_layers

    def test_repr_is_compact(self) -> None:
        """A 62-layer Gemma-3 problem prints in a few short lines, with runs folded."""
        model = next(m for m in (p() for p in PRESETS) if "Gemma" in m.description)
        problem = PlanningProblem(PlanningConfig(), [model.specs], [2**30], model.description)
        text = repr(problem)
        assert "(A*5 B)*10 A*2" in text
        assert len(text.splitlines()) <= 5
        assert len(text) < 800
        assert "config: PlanningConfig()" in text

    def test_repr_of_encoder_decoder_and_gaps(self) -> None:
        """Layers sharing an index print as A+B, and indices without layers as -."""
        model = find(
            cs.cross_attention_models(),
            lambda m: len(m.specs) == 6,
            settings=settings(MINIMAL, max_examples=2000, derandomize=True),
        )
        assert "[0..2] (A+B)*3" in repr(model)
        nemotron = next(m for m in (p() for p in PRESETS) if "Nemotron" in m.description)
        assert "[0..50] ((A -)*3 A B - A -)*4 (A -)*3 A" in repr(nemotron)

    @FEW
    @given(cs.planning_problems(models_strategy=cs.models(families=GENERIC)))
    def test_repr_shows_only_non_defaults(self, problem: PlanningProblem) -> None:
        """Spec and config reprs leave out fields at their default values (generic families).

        The specialised families set head_size_v and dcp_sharded on purpose.
        """
        text = repr(problem)
        assert "head_size_v" not in text
        assert "dcp_sharded" not in text
        # Parallel sizes appear only when drawn above their default of 1.
        assert re.search(r"(tensor|decode_context)_parallel_size=1\b", text) is None

    def test_workers_are_read_only_copies(self) -> None:
        """worker_specs() hands out fresh dicts; the stored workers cannot be mutated."""
        spec = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=64, dtype="bfloat16")
        problem = PlanningProblem(PlanningConfig(), [{"l0": spec}], [1 << 20])
        copy = problem.worker_specs()[0]
        copy.clear()
        assert dict(problem.workers[0]) == {"l0": spec}
        with pytest.raises(TypeError):
            problem.workers[0]["l1"] = spec  # type: ignore[index]

    def test_budget_count_must_match(self) -> None:
        """A budget list of the wrong length is a ValueError."""
        with pytest.raises(ValueError, match="2 workers but 1"):
            PlanningProblem(PlanningConfig(), [{}, {}], [0])

    def test_regimes_fit_and_fall_short(self) -> None:
        """Some problems have roomy memory and some are short of it."""
        find(cs.planning_problems(), lambda p: "roomy" in p.description, settings=OCCURS)
        find(cs.planning_problems(), lambda p: "short" in p.description, settings=OCCURS)


class TestReferenceAcceptsProblems:
    @FEW
    @given(cs.planning_problems(max_workers=3))
    def test_reference_plans_or_reports_short_memory(self, problem: PlanningProblem) -> None:
        """The reference planner plans every generated problem or reports too little memory."""
        with contextlib.suppress(InsufficientMemoryError):
            plan_kv_cache(
                ReferenceKVCacheConfigBuilder(),
                problem.config,
                problem.worker_specs(),
                list(problem.available_memory),
            )


SPECIALISED_FAMILIES = sorted(
    {"deepseek_v4", "deepseek_v32", "glm5", "qwen3_next", "nemotron_h", "jamba", "drafts"}
)


class TestSpecialisedFamilies:
    @pytest.mark.parametrize("family", SPECIALISED_FAMILIES)
    def test_reference_plans_them(self, family: str) -> None:
        """Each family's problems are ones the reference groups and places (valid inputs)."""
        from conformance.scenarios.examples import reference_accepts

        @FEW
        @given(cs.planning_problems(models_strategy=cs.models(families=[family])))
        def check(problem: PlanningProblem) -> None:
            assert reference_accepts(problem.config, problem.workers), repr(problem)

        check()

    @pytest.mark.parametrize("family", SPECIALISED_FAMILIES)
    def test_docstring_names_real_models(self, family: str) -> None:
        """Every family says which real models it stands for."""
        doc = cs.FAMILIES[family].__doc__ or ""
        assert any(c.isdigit() for c in doc.split("(")[1]), doc

    def test_deepseek_v4_shapes(self) -> None:
        """V4: compressed latents (tokens_per_state 4/128), indexers, SWA MLA, MTP with caches."""
        model = find(
            cs.deepseek_v4_models(),
            lambda m: "C4" in m.description and any(".indexer." in n for n in m.specs),
            settings=OCCURS,
        )
        ratios = {
            s.tokens_per_state for s in model.specs.values() if isinstance(s, MLAAttentionSpec)
        }
        assert ratios & {4, 128}
        drafts = [n for n, s in model.specs.items() if s.is_draft]
        assert len(drafts) > 1  # an MTP layer that carries several caches
        assert all(n.startswith(drafts[0].split(".mtp_block")[0]) for n in drafts)

    def test_glm5_shapes(self) -> None:
        """GLM-5: KDA states, MLA, a kpool indexer with 16 tokens per state, a tail ring."""

        def ringed(model: Model) -> bool:
            return any(isinstance(s, CircularBufferSpec) for s in model.specs.values())

        # The simplest GLM-5 keeps its rings: an absent part is not the minimum.
        model = find(cs.glm5_models(), lambda m: True, settings=OCCURS)
        assert ringed(model)
        kinds = {type(s).__name__ for s in model.specs.values()}
        assert kinds == {"MambaSpec", "MLAAttentionSpec", "CircularBufferSpec"}
        indexers = [s for n, s in model.specs.items() if n.endswith("indexer.k_cache")]
        assert indexers
        assert all(s.tokens_per_state_value == 16 for s in indexers)
        # One tail ring per indexer, or none (the indexer recomputes its tail).
        rings = [n for n in model.specs if n.endswith("indexer.tail_cache")]
        assert len(rings) == len(indexers)

    def test_glm5_ringless_variant_takes_both_block_outer_layouts(self) -> None:
        """GLM-5 without tail rings is drawn; BLNHC opens to it, layer-outer stays shut.

        vLLM 0.33.0's layer-outer placement unifies a hybrid's page sizes and
        refuses the indexer's page (it divides no state page), as kvref does.
        """
        model = find(cs.glm5_models(), lambda m: "no tail ring" in m.description, settings=OCCURS)
        assert not any(n.endswith("tail_cache") for n in model.specs)
        assert set(cs.allowed_layouts(model)) == {KVCacheLayout.BLNHC, KVCacheLayout.BLHNC}

    def test_every_kind_and_dtype_reachable_by_default(self) -> None:
        """The default models reach every planned spec kind and every KV dtype."""
        kinds: set[str] = set()
        dtypes: set[torch.dtype] = set()

        # Derandomized: the figure is about the default stream, not one lucky draw.
        @settings(
            database=None,
            deadline=None,
            max_examples=600,
            phases=[Phase.generate],
            derandomize=True,
        )
        @given(cs.models())
        def collect(model: Model) -> None:
            for spec in model.specs.values():
                kinds.add(type(spec).kind)
                dtypes.update(d for d in (getattr(spec, "dtype", None),) if d is not None)
                dtypes.update(getattr(spec, "dtypes", ()))

        collect()
        assert {
            "full_attention",
            "mla",
            "sliding_window",
            "sliding_window_mla",
            "chunked_local",
            "circular_buffer",
            "mamba",
            "cross_attention",
        } <= kinds
        assert {
            torch.bfloat16,
            torch.float16,
            torch.float8_e4m3fn,
            torch.float32,
            torch.uint8,
        } <= dtypes


class TestDecoderLayerSplits:
    @FAST
    @given(
        cs.models(max_layers=16).flatmap(
            lambda m: st.tuples(st.just(m), cs.pipeline_splits(m, max_workers=4))
        )
    )
    def test_decoder_layers_stay_whole(self, drawn: tuple[Model, cs.PipelineSplit]) -> None:
        """All caches of one decoder layer share a worker; drafts run with the last stage."""
        model, split = drawn
        layers = cs.decoder_layers(model)
        owner = {n: k for k, w in enumerate(split.workers) for n in w}
        assert set(owner) == set(model.specs)
        for names in layers.by_index.values():
            assert len({owner[n] for n in names}) == 1
        assert all(owner[n] == len(split.workers) - 1 for n in layers.tail)
        assert sum(split.partition) == layers.num_hidden_layers
        if model.specs:
            assert all(split.workers)

    @pytest.mark.parametrize(
        ("hidden", "stages", "expected"),
        [(31, 4, (8, 8, 8, 7)), (10, 4, (2, 3, 3, 2)), (8, 2, (4, 4)), (7, 3, (2, 3, 2))],
    )
    def test_vllm_partition(self, hidden: int, stages: int, expected: tuple[int, ...]) -> None:
        """vLLM's default: even shares, the remainder on the stages before the last."""
        assert cs.vllm_partition(hidden, stages) == expected

    def test_default_partition_and_uneven_custom_ones(self) -> None:
        """Splits shrink to vLLM's partition; uneven custom partitions occur."""
        model = Model(dict.fromkeys([f"model.layers.{i}.attn" for i in range(8)], PLAIN))
        minimal = find(
            cs.pipeline_splits(model),
            lambda s: len(s.workers) == 3,
            settings=MINIMAL,
        )
        assert (minimal.kind, minimal.partition) == ("vllm", (3, 3, 2))
        custom = find(
            cs.pipeline_splits(model),
            lambda s: s.kind == "custom" and s.partition[0] == 1,
            settings=OCCURS,
        )
        assert sum(custom.partition) == 8

    def test_layers_without_cache_count(self) -> None:
        """Nemotron-H's MLP layers count as decoder layers, and no worker is left empty."""
        model = find(cs.nemotron_h_models(), lambda m: True, settings=MINIMAL)
        layers = cs.decoder_layers(model)
        assert layers.num_hidden_layers > len(layers.by_index)
        split = find(
            cs.pipeline_splits(model, max_workers=4),
            lambda s: len(s.workers) >= 3,
            settings=OCCURS,
        )
        assert all(split.workers)
        assert sum(split.partition) == layers.num_hidden_layers


class TestBlockCounts:
    def test_buckets_occur(self) -> None:
        """1, 2..4, odd, 17..1024, large, 2..4 GiB and >4 GiB counts are all drawn."""
        strategy = cs.num_blocks_for(1 << 20)
        for predicate in (
            lambda n: n == 1,
            lambda n: 2 <= n <= 4,
            lambda n: n > 4 and n % 2 == 1 and n < 64,
            lambda n: 17 <= n <= 1024,
            lambda n: 1024 < n <= 1 << 16,
            lambda n: 1 << 31 < n * (1 << 20) < 1 << 32,
            lambda n: n * (1 << 20) > 1 << 32,
        ):
            find(strategy, predicate, settings=OCCURS)

    def test_no_huge_bucket_when_unreachable(self) -> None:
        """Tiny blocks would need too many blocks for 4 GiB: that bucket is left out."""
        from hypothesis.errors import NoSuchExample

        with pytest.raises(NoSuchExample):
            find(cs.num_blocks_for(8), lambda n: n > 1 << 16, settings=OCCURS)

    def test_rejects_bad_arguments(self) -> None:
        """Negative weights are a ValueError."""
        with pytest.raises(ValueError, match="non-negative"):
            cs.num_blocks_for(-1)
