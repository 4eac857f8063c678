"""vLLM-native builders see the model's real layer counts, speculative config and vendor classes."""

from __future__ import annotations

import dataclasses
import pickle
from typing import Any

import pytest
import torch

pytest.importorskip("vllm.v1.core.kv_cache_planning")

from _vendor_specs import AcmeMLASpec, RecordingBuilder

from conformance.extensions.vendor.models import fixed_models
from conformance.harness.vllm_adapter import wrap_vllm_builder
from conformance.report.pycode import to_python
from kvref import PlanningConfig
from kvref.interop import vllm as iv
from kvref.specs import MLAAttentionSpec

MLA = MLAAttentionSpec(
    block_size=64, num_kv_heads=1, max_tp_shards=1, head_size=576, dtype=torch.bfloat16
)


def _acme(slot: int, *, draft: bool = False) -> Any:
    native = iv.spec_to_vllm(MLA)
    fields = {f.name: getattr(native, f.name) for f in dataclasses.fields(native) if f.init}
    return AcmeMLASpec(**{**fields, "is_draft": draft}, acme_slot=slot)


def _group(config: PlanningConfig, specs: dict[str, Any]) -> dict[str, Any]:
    RecordingBuilder.seen.clear()
    wrap_vllm_builder(RecordingBuilder)().get_kv_cache_groups(config, specs)
    (seen,) = RecordingBuilder.seen
    return seen


@pytest.mark.parametrize(
    ("described", "expected"),
    [
        pytest.param(
            {
                "num_hidden_layers": 61,
                "num_draft_layers": 3,
                "speculative_method": "mtp",
                "num_speculative_tokens": 3,
                "num_prefill_lookahead_tokens": 3,
                "eagle_block_drop": True,
            },
            {
                "num_hidden_layers": 61,
                "total_layers": 61,
                "nextn": 3,
                "method": "mtp",
                "tokens": 3,
                "multi_mtp": True,
                "block_drop": True,
                "draft_layers": 3,
            },
            id="deepseek-61-layers-3-mtp",
        ),
        pytest.param(
            {
                "num_hidden_layers": 32,
                "num_draft_layers": 1,
                "speculative_method": "eagle3",
                "num_speculative_tokens": 4,
                "num_prefill_lookahead_tokens": 1,
            },
            {
                "total_layers": 32,
                "method": "eagle3",
                "tokens": 4,
                "block_drop": False,
                "multi_mtp": False,
                "draft_layers": 1,
            },
            id="eagle3-drop-off",
        ),
        pytest.param(
            {},
            {"total_layers": 2, "method": None, "nextn": None},
            id="describes-nothing",
        ),
    ],
)
def test_layer_counts_and_speculation(described: dict[str, Any], expected: dict[str, Any]) -> None:
    """The config's layer counts and speculative method, as the native builder sees them.

    A DeepSeek-style target of 61 layers with 3 MTP modules; EAGLE-3 with the
    drop off; a config describing nothing keeps the two-layer stand-in.
    """
    seen = _group(PlanningConfig(**described), {"model.layers.0.attn": MLA})
    assert {k: seen[k] for k in expected} == expected


def test_vendor_subclass_arrives_as_its_own_class() -> None:
    """A vendor subclass reaches the native builder as a fresh instance of itself, not its base."""
    original = _acme(7)
    (model,) = fixed_models([{"model.layers.0.attn": original, "model.layers.1.attn": MLA}])
    stand_in = model.specs["model.layers.0.attn"]
    assert type(stand_in).__name__ == "AcmeMLASpec" and isinstance(stand_in, MLAAttentionSpec)
    assert stand_in != MLA  # class-strict, as vLLM's dataclass equality
    seen = _group(PlanningConfig(), dict(model.specs))["specs"]
    got = seen["model.layers.0.attn"]
    assert type(got) is AcmeMLASpec and got.acme_slot == 7 and got == original
    assert got is not original
    assert type(seen["model.layers.1.attn"]) is type(iv.spec_to_vllm(MLA))
    # Each conversion is a fresh object; pickling keeps the stand-in class.
    assert iv.spec_to_vllm(stand_in) is not iv.spec_to_vllm(stand_in)
    again = pickle.loads(pickle.dumps(stand_in))
    assert type(again) is type(stand_in) and again == stand_in


def test_vendor_counterexample_round_trips() -> None:
    """A counterexample holding a stand-in rebuilds it from the vendor class."""
    (model,) = fixed_models([{"model.layers.0.attn": _acme(2, draft=True)}])
    specs = dict(model.specs)
    namespace: dict[str, Any] = {}
    exec(to_python({"specs": specs}), namespace)
    rebuilt = namespace["specs"]["model.layers.0.attn"]
    assert type(rebuilt) is type(specs["model.layers.0.attn"]) and rebuilt.is_draft
    assert rebuilt == specs["model.layers.0.attn"]


def test_vendor_page_change_refused() -> None:
    """A subclass whose page differs from its vLLM base cannot be modelled: a typed error."""

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Wider(AcmeMLASpec):
        @property
        def page_size_bytes(self) -> int:
            return 1

    native = _acme(0)
    fields = {f.name: getattr(native, f.name) for f in dataclasses.fields(native) if f.init}
    with pytest.raises(iv.VLLMOutputError, match="1-byte page"):
        iv.layer_spec_from_vllm(Wider(**fields))
