"""What the kit shows a builder of the model beside its specs: Hugging Face fields, cache dtype."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conformance.generate.families import family_strategy
from conformance.generate.hf import cache_dtype_of
from conformance.generate.problems import model_config_fields
from conformance.harness import wire
from conformance.report.records import decode_value, encode_value
from kvref import ConfigError, PlanningConfig

_SETTINGS = settings(
    max_examples=25, database=None, deadline=None, suppress_health_check=list(HealthCheck)
)


class TestPlanningConfigField:
    """``PlanningConfig.hf_config`` and ``cache_dtype``: checked, hashable, carried as data."""

    def test_a_mapping_becomes_sorted_pairs(self) -> None:
        """Lists become tuples, names are sorted, and ``hf()`` reads one field."""
        config = PlanningConfig(hf_config={"model_type": "deepseek_v32", "architectures": ["A"]})
        assert config.hf_config == (("architectures", ("A",)), ("model_type", "deepseek_v32"))
        assert config.hf("model_type") == "deepseek_v32" and config.hf("absent", 7) == 7
        assert hash(config) == hash(PlanningConfig(hf_config=dict(config.hf_config)))

    @pytest.mark.parametrize(
        ("value", "message"),
        [
            ({"num_hidden_layers": 4}, r"hf_config\['num_hidden_layers'\] is described by "),
            ({"num_nextn_predict_layers": 1}, r"PlanningConfig.num_draft_layers"),
            ({"not a name": 1}, r"field name 'not a name'"),
            ({"rope": {"theta": 1}}, r"hf_config\['rope'\]=\{'theta': 1\} must be"),
            ({"eps": float("nan")}, r"hf_config\['eps'\]=nan must be"),
            (5, r"hf_config=5 must be a mapping"),
        ],
    )
    def test_bad_fields_are_named(self, value: Any, message: str) -> None:
        """Each refusal names the field and the value."""
        with pytest.raises(ConfigError, match=message):
            PlanningConfig(hf_config=value)

    def test_cache_dtype_must_be_a_name(self) -> None:
        """An empty cache dtype is refused with the field named."""
        with pytest.raises(ConfigError, match=r"PlanningConfig.cache_dtype=''"):
            PlanningConfig(cache_dtype="")

    def test_it_travels_as_report_data_and_wire_data(self) -> None:
        """Reports and the worker boundary carry both fields unchanged."""
        config = PlanningConfig(
            hf_config={"model_type": "glm_moe_dsa", "kv_lora_rank": 512}, cache_dtype="fp8_ds_mla"
        )
        assert decode_value(json.loads(json.dumps(encode_value(config)))) == config
        assert wire.decode(json.loads(json.dumps(wire.encode(config))), "config") == config


class TestGeneration:
    """Families that are a published model's structure are described as that model."""

    @pytest.mark.parametrize(
        ("family", "model_types"),
        [
            ("deepseek_v32", {"deepseek_v32", "glm_moe_dsa"}),
            ("hisparse", {"deepseek_v32", "glm_moe_dsa"}),
            ("deepseek_v4", {"deepseek_v4"}),
            ("glm5", {"glm5_next"}),
            ("qwen3_next", {"qwen3_next"}),
            ("nemotron_h", {"nemotron_h"}),
            ("jamba", {"jamba"}),
        ],
    )
    def test_specialised_families_name_their_model(
        self, family: str, model_types: set[str]
    ) -> None:
        """Every model carries one of its published model types and an architecture."""

        @_SETTINGS
        @given(family_strategy(family))
        def check(model: Any) -> None:
            fields = dict(model.hf_config)
            assert fields["model_type"] in model_types, fields
            assert fields["architectures"], fields
            assert PlanningConfig(**model_config_fields(model)).hf_config == model.hf_config

        check()

    def test_deepseek_v4_carries_its_compress_ratios(self) -> None:
        """One ratio per decoder layer (MTP included) as its caches' tokens per state say."""

        @_SETTINGS
        @given(family_strategy("deepseek_v4"))
        def check(model: Any) -> None:
            ratios = dict(model.hf_config)["compress_ratios"]
            layers = {n.split(".")[2] for n in model.specs}
            assert len(ratios) == len(layers) and set(ratios) <= {0, 4, 128}, ratios

        check()

    def test_generic_families_stay_plain(self) -> None:
        """A generic shape is no published model: it keeps the plain description."""

        @_SETTINGS
        @given(st.sampled_from(["uniform", "hybrid", "mamba_hybrid"]).flatmap(family_strategy))
        def check(model: Any) -> None:
            assert model.hf_config == ()

        check()

    def test_mla_is_deepseek_v3_only_with_its_latents(self) -> None:
        """The MLA family is DeepSeek-V3 exactly when every latent is V3's, uncompressed."""

        @_SETTINGS
        @given(family_strategy("mla"))
        def check(model: Any) -> None:
            compressed = any(getattr(s, "tokens_per_state", 1) > 1 for s in model.specs.values())
            described = dict(model.hf_config).get("model_type")
            assert described in (None, "deepseek_v3")
            if compressed:
                assert described is None

        check()

    def test_cache_dtype_follows_the_specs(self) -> None:
        """fp8_ds_mla latents give that cache dtype; others keep auto."""

        @_SETTINGS
        @given(family_strategy("deepseek_v32"))
        def check(model: Any) -> None:
            fp8 = any(
                getattr(s, "cache_dtype_str", None) == "fp8_ds_mla" for s in model.specs.values()
            )
            assert cache_dtype_of(model.specs) == ("fp8_ds_mla" if fp8 else "auto")

        check()
