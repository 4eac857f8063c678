"""Each planning change of vLLM 0.34.0, planned by kvref as both releases (no vLLM needed).

Every test plans one golden problem made for the change (``golden/versions.json``,
expressible in both releases, and ``golden/vllm-0.34.0/fields_0_34.json``,
fields only 0.34.0 has) and checks the figure the change is about against
what each release's own planning code returned (the stored outputs; the
same problems against the installed vLLM are ``tests/vllm/test_version_changes_vllm.py``).
The numbers in the docstrings are those outputs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import pytest
from golden import GoldenProblem, find_golden_dir, load_problem, version_dir

from kvref import (
    ConfigError,
    FullAttentionSpec,
    HiSparseError,
    MLAAttentionSpec,
    PageSizeUnificationError,
    PlanningConfig,
    ReferenceKVCacheConfigBuilder,
    SpecError,
    UniformTypeKVCacheSpecs,
    plan_kv_cache,
    plan_profiling_kv_cache,
)
from kvref.planning import KVCachePlan
from kvref.versions import V0_33, V0_34, VllmVersion

GOLDEN = find_golden_dir()
pytestmark = pytest.mark.skipif(GOLDEN is None, reason="golden files not found")


def _shared(name: str, version: VllmVersion) -> GoldenProblem:
    assert GOLDEN is not None
    return load_problem(GOLDEN / "versions.json", name, version)


def _fields(name: str, version: VllmVersion = V0_34) -> GoldenProblem:
    assert GOLDEN is not None
    return load_problem(version_dir(GOLDEN, V0_34) / "fields_0_34.json", name, version)


def _plan(problem: GoldenProblem) -> KVCachePlan:
    memory: Any = problem.available_memory
    return plan_kv_cache(
        ReferenceKVCacheConfigBuilder,
        problem.config,
        list(problem.workers),
        memory if isinstance(memory, int) else list(memory),
    )


def _names(plan: KVCachePlan) -> list[list[str]]:
    return [list(g.layer_names) for g in plan.global_groups]


def _golden_names(problem: GoldenProblem) -> list[list[str]]:
    return [g["layer_names"] for g in problem.expected["core"]["global_groups"]]


def _zeroing(problem: GoldenProblem) -> list[bool]:
    return [w["config"]["needs_kv_cache_zeroing"] for w in problem.expected["core"]["workers"]]


class TestSlidingWindowMLAMerge:
    @pytest.mark.parametrize("name", ["swmla_quant_modes", "swmla_alignments"])
    def test_unequal_keys_split_the_bucket_in_0_34(self, name: str) -> None:
        """SW-MLA layers of two quant modes (or alignments): 2 groups and 3,640 blocks in
        0.33.0, 4 groups and 7,281 blocks in 0.34.0, as each release planned them."""
        old, new = _shared(name, V0_33), _shared(name, V0_34)
        old_plan, new_plan = _plan(old), _plan(new)
        assert len(old_plan.global_groups) == 2 and len(new_plan.global_groups) == 4
        assert _names(old_plan) == _golden_names(old)
        assert _names(new_plan) == _golden_names(new)
        assert (old_plan.num_blocks, new_plan.num_blocks) == (
            old.expected["core"]["num_blocks"],
            new.expected["core"]["num_blocks"],
        )

    def test_all_fp8_model_needs_no_zeroing_in_0_34(self) -> None:
        """All fp8: 0.33.0's merge dropped the SW-MLA quant mode, so it zeroed; 0.34.0 does not."""
        old, new = _shared("all_fp8_mla", V0_33), _shared("all_fp8_mla", V0_34)
        assert _zeroing(old) == [True] and _zeroing(new) == [False]
        assert [c.needs_kv_cache_zeroing for c in _plan(old).configs] == [True]
        assert [c.needs_kv_cache_zeroing for c in _plan(new).configs] == [False]
        merged = _plan(new).global_groups[1].kv_cache_spec
        assert getattr(merged, "kv_quant_mode", None) == "FP8_PER_TENSOR"

    def test_non_causal_multi_token_decode_is_or_ed(self) -> None:
        """One SW-MLA layer flattening non-causal decode makes its group's spec do so."""
        problem = _fields("swmla_non_causal_multi_token_decode")
        plan = _plan(problem)
        window = plan.global_groups[1].kv_cache_spec
        assert getattr(window, "non_causal_multi_token_decode", None) is True
        golden = problem.expected["core"]["global_groups"][1]["spec"]["fields"]
        assert golden["non_causal_multi_token_decode"] is True
        assert plan.num_blocks == problem.expected["core"]["num_blocks"]


class TestFallback:
    def test_sliding_window_mla_gets_one_full_group_in_0_34(self) -> None:
        """MLA beside SW-MLA whose pages do not unify: an error in 0.33.0; one uniform-type
        group of MLA specs (the replay bound dropped) and 4,639 blocks in 0.34.0."""
        old, new = _shared("swmla_fallback", V0_33), _shared("swmla_fallback", V0_34)
        assert old.expected["core"]["error"]["type"] == "NotImplementedError"
        with pytest.raises(PageSizeUnificationError):
            _plan(old)
        plan = _plan(new)
        assert _names(plan) == _golden_names(new) == [["m0", "m1", "w0", "w1"]]
        [group] = plan.global_groups
        assert isinstance(group.kv_cache_spec, UniformTypeKVCacheSpecs)
        promoted = group.kv_cache_spec.kv_cache_specs["w0"]
        assert type(promoted) is MLAAttentionSpec and promoted.sliding_window == 128
        assert plan.num_blocks == new.expected["core"]["num_blocks"] == 4639


class TestZeroing:
    def test_resolved_across_workers_in_0_34(self) -> None:
        """Mixed precision on worker 0 only: [True, False] in 0.33.0, [True, True] in 0.34.0."""
        old, new = (
            _shared("zeroing_across_workers", V0_33),
            _shared("zeroing_across_workers", V0_34),
        )
        assert _zeroing(old) == [True, False] and _zeroing(new) == [True, True]
        assert [c.needs_kv_cache_zeroing for c in _plan(old).configs] == [True, False]
        assert [c.needs_kv_cache_zeroing for c in _plan(new).configs] == [True, True]


class TestDrafterSlot:
    def test_draft_model_decode_query_length(self) -> None:
        """Two draft tokens: vLLM 0.33.0 derives a decode query of 3, 0.34.0 of 4."""
        for version, expected in ((V0_33, 3), (V0_34, 4)):
            problem = _shared("draft_model_decode_slot", version)
            assert problem.expected["resolved"]["max_decode_query_len"] == expected
            assert problem.config.derived_max_decode_query_len == expected

    def test_hisparse_buffer_check_counts_the_slot(self) -> None:
        """A hot buffer of 3 x 2,048 rows serves 0.33.0's 3 queries, not 0.34.0's 4."""
        old = _shared("hisparse_draft_model_buffer", V0_33)
        new = _shared("hisparse_draft_model_buffer", V0_34)
        assert _plan(old).num_blocks == old.expected["core"]["num_blocks"]
        assert "device_buffer_size" in new.expected["core"]["error"]["message"]
        with pytest.raises(HiSparseError, match="device_buffer_size"):
            _plan(new)


class TestNewSpecFields:
    def test_state_alignment_rounds_each_state(self) -> None:
        """States of 8,000 and 131,072 bytes aligned to 256: a 139,264-byte page, 3,855 blocks."""
        problem = _fields("mamba_state_alignment")
        plan = _plan(problem)
        assert {s.page_size_bytes for g in plan.global_groups for _, s in g.layer_specs()} == {
            139_264
        }
        assert _names(plan) == _golden_names(problem)
        assert plan.num_blocks == problem.expected["core"]["num_blocks"] == 3855

    def test_kv_head_major_slots_is_part_of_identity(self) -> None:
        """Two layers with head-major slots do not merge with two without: one uniform-type
        group of two specs, as vLLM 0.34.0 planned it."""
        problem = _fields("kv_head_major_slots")
        plan = _plan(problem)
        [group] = plan.global_groups
        assert isinstance(group.kv_cache_spec, UniformTypeKVCacheSpecs)
        flags = {n: s.kv_head_major_slots for n, s in group.kv_cache_spec.kv_cache_specs.items()}  # type: ignore[attr-defined]
        assert flags == {"f0": False, "f1": False, "h0": True, "h1": True}
        golden = problem.expected["core"]["global_groups"][0]["spec"]["layer_specs"]
        assert [e["layers"] for e in golden] == [["f0", "f1"], ["h0", "h1"]]
        assert plan.num_blocks == problem.expected["core"]["num_blocks"]

    @pytest.mark.parametrize(
        ("name", "field"),
        [
            ("mamba_state_alignment", "MambaSpec.state_alignment=256"),
            ("kv_head_major_slots", "FullAttentionSpec.kv_head_major_slots=True"),
            (
                "swmla_non_causal_multi_token_decode",
                "SlidingWindowMLASpec.non_causal_multi_token_decode=True",
            ),
        ],
    )
    def test_refused_as_0_33(self, name: str, field: str) -> None:
        """Planned as 0.33.0, a 0.34.0 field is refused, naming the field, value and releases."""
        problem = _fields(name, V0_33)
        with pytest.raises(SpecError) as caught:
            _plan(problem)
        message = str(caught.value)
        assert field in message and "vLLM 0.34.0" in message and "vLLM 0.33.0" in message


def test_golden_problem_files_exist() -> None:
    """The problems this module reads are committed."""
    assert GOLDEN is not None
    assert Path(GOLDEN / "versions.json").is_file()
    assert (version_dir(GOLDEN, V0_34) / "fields_0_34.out.json").is_file()


class TestEntries:
    """Every planning entry refuses a 0.34.0 field planned as 0.33.0 (and plans it as 0.34.0)."""

    PLAIN = FullAttentionSpec(block_size=16, num_kv_heads=8, head_size=64, dtype="bf16")

    def _major(self) -> dict[str, FullAttentionSpec]:
        return {"a": attrs.evolve(self.PLAIN, kv_head_major_slots=True)}

    def test_builder_hooks(self) -> None:
        """The reference builder's grouping and placement refuse; under 0.34.0 both work."""
        builder = ReferenceKVCacheConfigBuilder()
        new = PlanningConfig(vllm_version=V0_34)
        groups = builder.get_kv_cache_groups(new, self._major())
        assert builder.get_kv_cache_config_from_groups(new, groups, 4).num_blocks == 4
        old = new.with_vllm_version(V0_33)
        with pytest.raises(SpecError, match="kv_head_major_slots=True"):
            builder.get_kv_cache_groups(old, self._major())
        with pytest.raises(SpecError, match="kv_head_major_slots=True"):
            builder.get_kv_cache_config_from_groups(old, groups, 4)

    def test_core_and_profiling(self) -> None:
        """Core's flow (with or without given groups) and the profiling path refuse."""
        old = PlanningConfig(vllm_version=V0_33)
        groups = ReferenceKVCacheConfigBuilder().get_kv_cache_groups(old, {"a": self.PLAIN})
        with pytest.raises(SpecError, match=r"vLLM 0\.33\.0"):
            plan_kv_cache(None, old, [self._major()], 2**30)
        with pytest.raises(SpecError, match=r"vLLM 0\.33\.0"):
            plan_kv_cache(None, old, [self._major()], 2**30, global_groups=groups)
        with pytest.raises(SpecError, match=r"vLLM 0\.33\.0"):
            plan_profiling_kv_cache(
                None, old, self._major(), max_num_reqs=4, max_cudagraph_capture_size=4
            )


class TestDraftSlotConfig:
    def test_hisparse_decode_queries_follow_the_release(self) -> None:
        """A 2-token draft model: HiSparse's decode queries must be 3 (0.33.0) or 4 (0.34.0)."""
        kw: dict[str, Any] = {"speculative_method": "draft_model", "num_speculative_tokens": 2}
        assert PlanningConfig(vllm_version=V0_33, hisparse={"max_decode_query_len": 3}, **kw)
        assert PlanningConfig(vllm_version=V0_34, hisparse={"max_decode_query_len": 4}, **kw)
        with pytest.raises(ConfigError, match=r"must be 4 \(1 \+ .* \+ 1 drafter slot\)"):
            PlanningConfig(vllm_version=V0_34, hisparse={"max_decode_query_len": 3}, **kw)
        eagle = {**kw, "speculative_method": "eagle", "num_prefill_lookahead_tokens": 1}
        assert PlanningConfig(vllm_version=V0_34, **eagle).derived_max_decode_query_len == 3
