"""PlanningConfig's model fields (layer counts, speculation): validation and generation."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
import torch
from hypothesis import HealthCheck, given, settings

from conformance.generate.families import models
from conformance.generate.families.drafts import Speculation, SpeculativeModel, speculation
from conformance.generate.families.extras import RunsOfKindGrouping
from conformance.generate.problems import planning_problems
from conformance.generate.records import Model
from conformance.report.pycode import to_python
from kvref import PlanningConfig
from kvref.errors import ConfigError
from kvref.specs import FullAttentionSpec, MLAAttentionSpec

FULL = FullAttentionSpec(block_size=16, num_kv_heads=8, head_size=128, dtype=torch.bfloat16)
MLA = MLAAttentionSpec(
    block_size=64, num_kv_heads=1, max_tp_shards=1, head_size=576, dtype=torch.bfloat16
)
MTP3 = {
    "speculative_method": "mtp",
    "num_speculative_tokens": 3,
    "num_draft_layers": 3,
    "num_prefill_lookahead_tokens": 3,
}


def test_defaults_describe_nothing() -> None:
    """The defaults add nothing to a config (golden configs are unchanged)."""
    config = PlanningConfig()
    assert (config.num_hidden_layers, config.num_draft_layers) == (None, 0)
    assert (config.speculative_method, config.num_speculative_tokens) == (None, 0)
    assert config.derived_prefill_lookahead is None


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_hidden_layers": 0}, r"num_hidden_layers=0"),
        ({"num_hidden_layers": True}, r"num_hidden_layers=True"),
        ({"num_draft_layers": -1}, r"num_draft_layers=-1"),
        ({"speculative_method": "medusa"}, r"speculative_method='medusa'"),
        ({"num_speculative_tokens": 2}, r"num_speculative_tokens=2 needs"),
        ({"speculative_method": "eagle"}, r"num_speculative_tokens=0 must be >= 1"),
        ({**MTP3, "num_prefill_lookahead_tokens": 1}, r"num_prefill_lookahead_tokens=1 must be 3"),
        (
            {"speculative_method": "ngram", "num_speculative_tokens": 2, "eagle_block_drop": True},
            r"eagle_block_drop=True needs",
        ),
        (
            {"speculative_method": "ngram", "num_speculative_tokens": 2, "num_draft_layers": 1},
            r"num_draft_layers=1 must be 0",
        ),
        (
            {
                "speculative_method": "eagle",
                "num_speculative_tokens": 2,
                "num_prefill_lookahead_tokens": 1,
                "hisparse": {"max_decode_query_len": 1},
            },
            r"max_decode_query_len=1 must be 3",
        ),
        (
            {
                "model_kv_cache_grouping": RunsOfKindGrouping(max_layers=1),
                "host_resident_layers": {"a"},
            },
            r"host_resident_layers=\['a'\] cannot be combined with .*model_kv_cache_grouping",
        ),
    ],
)
def test_bad_values_are_typed_errors(kwargs: dict[str, Any], match: str) -> None:
    """Each bad value or combination is a ConfigError naming the field and the value."""
    with pytest.raises(ConfigError, match=match):
        PlanningConfig(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "lookahead"),
    [
        (MTP3, 3),
        ({**MTP3, "num_draft_layers": 1, "num_prefill_lookahead_tokens": 1}, 1),
        (
            {
                "speculative_method": "eagle3",
                "num_speculative_tokens": 5,
                "eagle_block_drop": True,
                "num_prefill_lookahead_tokens": 1,
            },
            1,
        ),
        ({"speculative_method": "ngram", "num_speculative_tokens": 4}, 0),
    ],
)
def test_vllm_lookahead_is_accepted(kwargs: dict[str, Any], lookahead: int) -> None:
    """The lookahead vLLM derives for each method is the one accepted."""
    assert PlanningConfig(**kwargs).derived_prefill_lookahead == lookahead


def test_speculation_inferred_and_declared() -> None:
    """Draft layers are counted per decoder layer; MLA drafts are MTP, others EAGLE."""
    draft_mla = attrs.evolve(MLA, is_draft=True)
    mtp = {"model.layers.0.a": MLA, "model.layers.1.a": draft_mla, "model.layers.1.b": draft_mla}
    assert speculation(mtp) == Speculation("mtp", 1, 1)
    eagle = {"model.layers.0.a": FULL, "model.layers.1.a": attrs.evolve(FULL, is_draft=True)}
    assert speculation(eagle) == Speculation("eagle", 1, 1)
    assert speculation({"model.layers.0.a": FULL}) == Speculation(None, 0, 0)
    declared = SpeculativeModel(eagle, "x", speculative_method="eagle3", num_speculative_tokens=4)
    assert speculation(declared) == Speculation("eagle3", 1, 4)


@settings(max_examples=15, database=None, deadline=None, suppress_health_check=list(HealthCheck))
@given(planning_problems(models_strategy=models(families=["drafts", "deepseek_v4"])))
def test_generated_configs_describe_the_model(problem: Any) -> None:
    """Generated configs carry the model's decoder layers, its drafts and their method."""
    config = problem.config
    drafts = {n for n, s in problem.specs.items() if s.is_draft}
    assert config.num_hidden_layers == problem.num_hidden_layers
    assert (config.num_draft_layers > 0) == bool(drafts)
    assert (config.speculative_method is not None) == bool(drafts)
    if drafts:
        assert config.num_prefill_lookahead_tokens == config.derived_prefill_lookahead


def test_config_round_trips_as_python() -> None:
    """A counterexample's config with the new fields rebuilds equal."""
    config = PlanningConfig(num_hidden_layers=61, eagle_block_drop=True, **MTP3)
    namespace: dict[str, Any] = {}
    exec(to_python({"config": config}), namespace)
    assert namespace["config"] == config


def test_model_without_layers() -> None:
    """An attention-free model describes no decoder layers."""
    assert speculation(Model({})).method is None
