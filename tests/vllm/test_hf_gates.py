"""A vLLM-native builder gated on what vLLM says of the model is reached, and its bug caught."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm.v1.core.kv_cache_planning")

from conformance import check_builder
from kvref import PlanningConfig
from kvref.interop import vllm as iv

pytestmark = pytest.mark.vllm


class TestVllmConfigDescribesTheModel:
    """The adapter's ``VllmConfig`` shows the described model as vLLM derives it."""

    def test_a_dsa_model_is_mla_with_its_fields(self) -> None:
        """model_type, architectures, use_mla (vLLM's own rule) and the cache dtype."""
        config = PlanningConfig(
            hf_config={
                "model_type": "glm_moe_dsa",
                "architectures": ["GlmMoeDsaForCausalLM"],
                "kv_lora_rank": 512,
                "qk_rope_head_dim": 64,
                "index_topk": 2048,
            },
            cache_dtype="fp8_ds_mla",
        )
        model = iv.to_vllm_config(config).model_config
        assert model.hf_config.model_type == "glm_moe_dsa"
        assert model.architectures == ["GlmMoeDsaForCausalLM"]
        assert model.use_mla and model.hf_text_config.kv_lora_rank == 512
        assert iv.to_vllm_config(config).cache_config.cache_dtype == "fp8_ds_mla"

    def test_deepseek_v4_is_mla_by_its_compress_ratios(self) -> None:
        """vLLM tells V4 by ``compress_ratios`` and ``head_dim``: both described, it is MLA."""
        config = PlanningConfig(
            hf_config={"model_type": "deepseek_v4", "head_dim": 512, "compress_ratios": [4, 0]}
        )
        assert iv.to_vllm_config(config).model_config.use_mla

    def test_an_undescribed_model_stays_plain(self) -> None:
        """No description: the kit's plain Llama, not MLA, auto cache dtype."""
        vcfg = iv.to_vllm_config(PlanningConfig())
        assert vcfg.model_config.hf_config.model_type == "llama"
        assert not vcfg.model_config.use_mla and vcfg.cache_config.cache_dtype == "auto"


def test_the_default_run_opens_an_hf_gate_and_catches_its_bug() -> None:
    """The bug behind ``use_mla`` and the DSA model type is found by the default run."""
    report = check_builder(
        "tests.vllm.native_builders.hf_gated:DSAShortBackingBuilder",
        select=["KV-PLACE-BACKING-SIZE"],
        seed=1,
        shrink=False,
        timeout=120,
    )
    result = report.result("KV-PLACE-BACKING-SIZE")
    assert result.status == "fail", result
    assert not result.inherited, result
