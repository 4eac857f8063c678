"""The problems made for vLLM 0.34.0's planning changes, against the installed vLLM itself.

``tests/reference/test_version_changes.py`` checks kvref against the stored outputs of
both releases; here the same problems (``golden/versions.json`` and
``golden/vllm-0.34.0/fields_0_34.json``) go through the installed vLLM's own
Core flow, and kvref, planning as that release, must agree with it: groups,
block count, tensors, per-worker zeroing, or the kind of refusal.  The
installed vLLM must also reproduce the stored outputs of its release
(``scripts/golden_versions.py --check``).  Under vLLM 0.33.0 a problem using a
0.34.0-only field is refused on both sides: vLLM 0.33.0 cannot express the
spec, and kvref refuses the field when planning as 0.33.0.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import attrs
import pytest

pytest.importorskip("vllm.v1.core.kv_cache_planning")

import golden
from _vllm_diff import INSTALLED, assert_agree, run_kvref, run_vllm
from specs import full, window_mla

from kvref import (
    FullAttentionSpec,
    HiSparseHotSpec,
    KVCacheGroupSpec,
    KVCacheLayout,
    MambaSpec,
    SpecError,
    UnsupportedError,
)
from kvref.interop import vllm as iv
from kvref.placement import bytes_per_block
from kvref.versions import V0_34, rules

pytestmark = pytest.mark.vllm

GOLDEN = golden.find_golden_dir()
assert GOLDEN is not None, "tests/data/golden is part of the repository"
SHARED = GOLDEN / "versions.json"
FIELDS = golden.version_dir(GOLDEN, V0_34) / "fields_0_34.json"


def _raws(path: Path) -> list[Any]:
    return [pytest.param(raw, id=raw["name"]) for raw in golden._read_json_list(path)]


def _problem(raw: dict[str, Any]) -> golden.GoldenProblem:
    return golden.problem_from_dict(raw, version=INSTALLED)


def _memory(problem: golden.GoldenProblem) -> list[int]:
    return [problem.memory_of(i) for i in range(len(problem.workers))]


@pytest.mark.parametrize("raw", _raws(SHARED))
def test_shared_problems_agree(raw: dict[str, Any]) -> None:
    """Problems expressible in every release: kvref plans as the installed vLLM does."""
    problem = _problem(raw)
    assert assert_agree(problem.config, problem.workers, _memory(problem)) in (
        "ok",
        "refused",
    )


@pytest.mark.parametrize("raw", _raws(SHARED))
def test_decode_query_length_is_the_installed_vllms(raw: dict[str, Any]) -> None:
    """VLLM's ``max_decode_query_len`` for the problem's config is the one kvref derives."""
    backend = importlib.import_module("vllm.v1.attention.backend")
    config = _problem(raw).config
    assert backend.max_decode_query_len(iv.to_vllm_config(config)) == (
        config.derived_max_decode_query_len
    )


@pytest.mark.parametrize("raw", _raws(FIELDS))
def test_new_fields_agree_or_are_refused(raw: dict[str, Any]) -> None:
    """0.34.0's fields: the same plan under 0.34.0; refused on both sides under 0.33.0."""
    problem = _problem(raw)
    memory = _memory(problem)
    if INSTALLED >= V0_34:
        assert assert_agree(problem.config, problem.workers, memory) == "ok"
        return
    ours, theirs = (
        run_kvref(problem.config, problem.workers, memory),
        run_vllm(problem.config, problem.workers, memory),
    )
    assert isinstance(ours.error, SpecError)
    assert isinstance(theirs.error, UnsupportedError)
    assert f"vLLM {INSTALLED}" in str(theirs.error)


def test_stored_outputs_are_the_installed_vllms() -> None:
    """Regenerating the installed release's golden files reproduces the committed ones."""
    assert golden.load_script("golden_versions").main(["--check"]) == 0


def test_new_fields_convert_both_ways() -> None:
    """0.34.0's fields reach vLLM and come back; vLLM 0.33.0 takes them only at their defaults."""
    mamba = MambaSpec(block_size=16, shapes=((4, 1000),), dtypes=("bfloat16",), state_alignment=256)
    major = full(head_size=64, kv_head_major_slots=True)
    window = window_mla(128, non_causal_multi_token_decode=True)
    for spec, field in (
        (mamba, "state_alignment"),
        (major, "kv_head_major_slots"),
        (window, "non_causal_multi_token_decode"),
    ):
        if INSTALLED >= V0_34:
            theirs = iv.spec_to_vllm(spec)
            assert getattr(theirs, field) == getattr(spec, field)
            assert theirs.page_size_bytes == spec.page_size_bytes
            assert iv.spec_from_vllm(theirs) == spec
        else:
            with pytest.raises(UnsupportedError, match=rf"{field}=.*vLLM {INSTALLED}"):
                iv.spec_to_vllm(spec)
            plain = attrs.evolve(spec, **{field: attrs.fields_dict(type(spec))[field].default})
            assert iv.spec_from_vllm(iv.spec_to_vllm(plain)) == plain


def test_block_alignment_of_a_hot_group_without_layers() -> None:
    """A HiSparse hot group with no layer on the worker: vLLM 0.33.0 rounds the block up to its
    page, 0.34.0 aligns to the worker's layers only; kvref follows the installed release."""
    kvp = iv.vllm_modules().kvp
    layout = importlib.import_module("vllm.v1.kv_cache_layout").KVCacheLayout.BLHNC
    full = FullAttentionSpec(block_size=64, num_kv_heads=1, head_size=64, dtype="bf16")
    groups = [
        KVCacheGroupSpec(layer_names=("f0",), kv_cache_spec=full),
        KVCacheGroupSpec(
            layer_names=(),
            kv_cache_spec=HiSparseHotSpec(block_size=64, page_size=24_576, blocks_per_request=4),
        ),
    ]
    theirs = kvp._get_kv_cache_bytes_per_block(iv.groups_to_vllm(groups), layout)
    ours = bytes_per_block(groups, KVCacheLayout.BLHNC, rules(INSTALLED))
    assert ours == theirs == (16_384 if INSTALLED >= V0_34 else 24_576)


def test_plan_with_vllm_plans_only_as_the_installed_release() -> None:
    """VLLM can only plan as itself: another release's config is refused, naming both."""
    from kvref import ConfigError, PlanningConfig
    from kvref.versions import SUPPORTED

    assert str(INSTALLED) == iv.VLLM_VERSION
    assert all(str(v) in iv.INSTALL_HINT for v in SUPPORTED)
    spec = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=64, dtype="bf16")
    builder = iv.vllm_modules().kvp.DefaultKVCacheConfigBuilder
    [other] = [v for v in SUPPORTED if v != INSTALLED]
    with pytest.raises(
        ConfigError, match=rf"vllm_version={other} but the installed vLLM is {INSTALLED}"
    ):
        iv.plan_with_vllm(builder, PlanningConfig(vllm_version=other), [{"a": spec}], 2**30)
    plan = iv.plan_with_vllm(builder, PlanningConfig(vllm_version=INSTALLED), [{"a": spec}], 2**30)
    assert plan.num_blocks > 1
