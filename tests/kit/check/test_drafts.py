"""The draft-group clause (conformance/check/drafts.py, contract.md#grouping-draft-layers)."""

from __future__ import annotations

import attrs
import pytest
from hypothesis import Phase, find, given, settings

from conformance.check.drafts import draft_kinds
from conformance.check.gate import judge_grouping
from conformance.check.observations import CallResult
from conformance.generate.families import family_strategy
from conformance.generate.problems import model_config_fields
from conformance.generate.records import Model
from kvref import (
    FullAttentionSpec,
    KVCacheGroupSpec,
    PlanningConfig,
    ReferenceKVCacheConfigBuilder,
)
from kvref.specs import KVCacheSpec

ID = "KV-GROUP-DRAFTS-TOGETHER"
FULL = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=64, dtype="bfloat16")
DRAFT = attrs.evolve(FULL, is_draft=True)
#: Two target layers, then an EAGLE-style drafter of two equal layers.
SPECS: dict[str, KVCacheSpec] = {
    f"model.layers.{i}.self_attn.attn": spec for i, spec in enumerate((FULL, FULL, DRAFT, DRAFT))
}


def _config(stages: int) -> PlanningConfig:
    return PlanningConfig(
        max_model_len=4096, pipeline_parallel_size=stages, **model_config_fields(SPECS)
    )


def _groups(*names: list[str]) -> CallResult:
    value = [KVCacheGroupSpec(layer_names=list(n), kv_cache_spec=FULL) for n in names]
    return CallResult(hook="get_kv_cache_groups", value=value)


SCATTERED = _groups(
    ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"],
    ["model.layers.2.self_attn.attn"],
    ["model.layers.3.self_attn.attn"],
)
TOGETHER = _groups(
    ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"],
    ["model.layers.2.self_attn.attn", "model.layers.3.self_attn.attn"],
)


@pytest.mark.parametrize("stages", [1, 2])
def test_scattered_drafts_fail_on_the_whole_model(stages: int) -> None:
    """Core's grouping of every worker's layers is judged, pipeline stages or not."""
    (violation,) = judge_grouping(_config(stages), SPECS, SCATTERED)[ID]
    assert "spread over groups [1, 2]" in violation.message
    assert violation.layer == "model.layers.2.self_attn.attn"


@pytest.mark.parametrize("stages", [1, 2])
def test_drafts_together_pass(stages: int) -> None:
    assert judge_grouping(_config(stages), SPECS, TOGETHER)[ID] == ()


def test_one_workers_slice_is_not_judged() -> None:
    """The profiling path's grouping of one pipeline worker may legally split them."""
    assert ID not in judge_grouping(_config(2), SPECS, SCATTERED, whole_model=False)


def _described(model_type: str, method: str = "mtp", **fields: object) -> PlanningConfig:
    described = {"model_type": model_type, **fields}
    # One speculative token: the lookahead vLLM derives stays 1 for every method.
    return attrs.evolve(
        _config(1),
        speculative_method=method,
        num_speculative_tokens=1,
        hf_config=tuple(sorted(described.items())),
    )


@pytest.mark.parametrize(
    ("model_type", "fields"),
    [
        ("step3p5", {}),
        ("step3p7", {}),
        ("llama", {"architectures": ("Step3p5ForCausalLM",)}),
        ("gemma4", {}),
    ],
)
def test_a_drafter_served_in_several_groups_is_not_bound(
    model_type: str, fields: dict[str, object]
) -> None:
    """vLLM serves Step-3.5's MTP and Gemma-4's assistant with proposers that waive the rule."""
    assert ID not in judge_grouping(_described(model_type, **fields), SPECS, SCATTERED)


def test_the_same_model_with_an_eagle_drafter_is_bound() -> None:
    """Only the MTP proposer of those models waives the rule; EAGLE's base proposer keeps it."""
    config = _described("step3p5", method="eagle")
    assert judge_grouping(config, SPECS, SCATTERED)[ID]


def test_a_drafter_of_one_layer_per_spec_is_not_counted() -> None:
    """Nothing could spread it, so the example does not count as a pass (N/A)."""
    specs = {n: s for n, s in SPECS.items() if n != "model.layers.3.self_attn.attn"}
    config = PlanningConfig(max_model_len=4096, **model_config_fields(specs))
    one = _groups(
        ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"],
        ["model.layers.2.self_attn.attn"],
    )
    assert ID not in judge_grouping(config, specs, one)


def _host_split() -> tuple[PlanningConfig, dict[str, KVCacheSpec]]:
    """A drafter of three equal layers, two of them host-resident by configuration."""
    specs = {**SPECS, "model.layers.4.self_attn.attn": DRAFT}
    host = {"model.layers.3.self_attn.attn", "model.layers.4.self_attn.attn"}
    config = PlanningConfig(
        max_model_len=4096, host_resident_layers=host, **model_config_fields(specs)
    )
    return config, specs


def test_a_drafter_split_by_its_configuration_passes_the_reference() -> None:
    """Host-resident layers go to the host group: each side of the drafter is bound apart."""
    config, specs = _host_split()
    groups = ReferenceKVCacheConfigBuilder().get_kv_cache_groups(config, specs)
    where = {n: i for i, g in enumerate(groups) for n in g.layer_names}
    # The configuration did split the drafter, so the case is the one meant.
    assert where["model.layers.2.self_attn.attn"] != where["model.layers.3.self_attn.attn"]
    result = CallResult(hook="get_kv_cache_groups", value=groups)
    assert judge_grouping(config, specs, result)[ID] == ()


def test_the_host_side_of_a_split_drafter_is_still_bound() -> None:
    config, specs = _host_split()
    spread = _groups(
        ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"],
        ["model.layers.2.self_attn.attn"],
        ["model.layers.3.self_attn.attn"],
        ["model.layers.4.self_attn.attn"],
    )
    (violation,) = judge_grouping(config, specs, spread)[ID]
    assert "host-resident" in violation.message
    assert "spread over groups [2, 3]" in violation.message


_DRAWS = settings(max_examples=300, database=None, phases=[Phase.generate], deadline=None)


def _several_of_one_spec(model: Model) -> bool:
    return any(len(n) > 1 for n in draft_kinds(model.specs).values())


def test_the_drafts_family_draws_drafters_of_several_layers() -> None:
    """The layers the clause binds are drawn: EAGLE heads and MTP modules of 2-3 layers."""
    for method in ("EAGLE", "MTP"):

        def wanted(model: Model, method: str = method) -> bool:
            return f"+ {method} (" in model.description and _several_of_one_spec(model)

        assert wanted(find(family_strategy("drafts"), wanted, settings=_DRAWS))


@settings(max_examples=60, database=None, deadline=None)
@given(family_strategy("drafts"))
def test_drawn_drafters_are_ones_vllm_serves(model: Model) -> None:
    """vLLM's own grouping (the reference's) keeps every drawn drafter in one group.

    A multi-layer head on gpt-oss would be split by it (contract.md#grouping-draft-layers),
    so the family keeps gpt-oss's heads to one layer.
    """
    if "gpt_oss" in model.description:
        assert sum(s.is_draft for s in model.specs.values()) == 1
    config = PlanningConfig(max_model_len=4096, **model_config_fields(model.specs))
    groups = ReferenceKVCacheConfigBuilder().get_kv_cache_groups(config, model.specs)
    result = CallResult(hook="get_kv_cache_groups", value=groups)
    assert judge_grouping(config, model.specs, result).get(ID, ()) == ()
