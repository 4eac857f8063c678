"""Hidden-state specs, HiSparse, model-declared grouping and profiling against the live vLLM.

Two checks: the committed golden files of ``scripts/make_golden.py`` are
what vLLM 0.33.0 produces (so the default test run, which reads them
without vLLM, checks current facts; another release's are checked by
``test_version_changes_vllm.py``), and kvref's Core flow and profiling path,
planning as the installed release, equal vLLM's on every problem vLLM plans,
compared as kvref records.

Run: ``/work/vllm-venv/bin/python -m pytest -m vllm tests/vllm`` (or ``tox -e vllm``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm.v1.core.kv_cache_planning")

import golden
from _vllm_diff import INSTALLED

from kvref import ReferenceKVCacheConfigBuilder, plan_kv_cache
from kvref.interop import vllm as iv
from kvref.profiling import plan_profiling_kv_cache

pytestmark = pytest.mark.vllm

MG = golden.load_script("make_golden")
PROBLEMS = [pytest.param(raw, id=raw["name"]) for make in MG.FILES.values() for raw in make()]


def _resolved(raw: dict[str, Any]) -> dict[str, Any]:
    return MG._resolve_hisparse(raw) if raw.get("resolve_hisparse") else raw


def test_golden_files_are_current(tmp_path: Path) -> None:
    """Regenerating every file with vLLM 0.33.0 reproduces the committed ones.

    With another release installed the script refuses (exit 2) rather than
    write that release's outputs over 0.33.0's.
    """
    assert MG.main(["--check"]) == (0 if INSTALLED == golden.BASE_VERSION else 2)


@pytest.mark.parametrize("raw", PROBLEMS)
def test_core_flow_agrees(raw: dict[str, Any]) -> None:
    """kvref and vLLM plan alike, or both refuse."""
    problem = golden.problem_from_dict(_resolved(raw), version=INSTALLED)
    memory = [problem.memory_of(i) for i in range(len(problem.workers))]
    builder = iv.vllm_modules().kvp.DefaultKVCacheConfigBuilder
    try:
        theirs = iv.plan_with_vllm(builder, problem.config, list(problem.workers), memory)
    except (ValueError, AssertionError, NotImplementedError) as exc:
        with pytest.raises(ValueError):
            plan_kv_cache(
                ReferenceKVCacheConfigBuilder, problem.config, list(problem.workers), memory
            )
        pytest.skip(f"both refuse ({type(exc).__name__})")
    ours = plan_kv_cache(
        ReferenceKVCacheConfigBuilder, problem.config, list(problem.workers), memory
    )
    assert ours.global_groups == theirs.global_groups
    assert ours.configs == theirs.configs
    assert ours.workers == theirs.workers
    assert (ours.num_blocks, ours.max_model_len) == (theirs.num_blocks, theirs.max_model_len)


@pytest.mark.parametrize("raw", [p for p in PROBLEMS if "profiling" in p.values[0]])
def test_profiling_agrees(raw: dict[str, Any]) -> None:
    """kvref's profiling path equals vLLM's V1 runner path, worker by worker."""
    problem = golden.problem_from_dict(_resolved(raw), version=INSTALLED)
    assert problem.profiling is not None
    for worker in problem.workers:
        theirs = MG._profile(iv.specs_to_vllm(worker), problem)
        ours = plan_profiling_kv_cache(
            ReferenceKVCacheConfigBuilder,
            problem.config,
            worker,
            max_num_reqs=problem.profiling["max_num_reqs"],
            max_cudagraph_capture_size=problem.profiling["max_cudagraph_capture_size"],
        )
        placed = MG.config_record(
            iv.config_to_vllm(ours.config), problem.config.kv_cache_layout.name
        )
        assert [MG.group_record(g) for g in iv.groups_to_vllm(list(ours.groups))] == theirs[
            "groups"
        ]
        assert placed == theirs["config"]
