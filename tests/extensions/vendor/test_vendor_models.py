"""Vendor models (extensions/vendor/models.py): every input form, errors, variants, front ends."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import Phase, find, given, settings
from hypothesis import strategies as st

from conformance.cli import main as cli_main
from conformance.extensions.vendor.models import (
    VendorModelError,
    around,
    fixed_models,
    load_models,
    models_for_run,
    read_json,
)
from conformance.generate import strategies as cs
from conformance.generate.families.drafts import Speculation, SpeculativeModel, speculation
from conformance.generate.pipeline import decoder_layers
from conformance.generate.records import Model
from conformance.run.options import OptionError
from conformance.run.runner import check_builder
from kvref.builder import ReferenceKVCacheConfigBuilder
from kvref.interop.vllm import is_vllm_available
from kvref.specs import FullAttentionSpec, KVCacheSpec, MLAAttentionSpec, SlidingWindowSpec

DATA = Path(__file__).resolve().parents[2] / "data" / "models"
DSV4 = DATA / "dsv4_mini_worker0.json"
OCCURS = settings(database=None, deadline=None, max_examples=300, phases=[Phase.generate])
# Most vendor draws are invalid problems the strategy rejects (9 valid of 50 on
# 2026-12-01), so finding one in the mix takes many more draws.
MANY = settings(database=None, deadline=None, max_examples=3000, phases=[Phase.generate])
FEW = settings(database=None, deadline=None, max_examples=15)

FULL = FullAttentionSpec(block_size=16, num_kv_heads=8, head_size=128, dtype=torch.bfloat16)
WINDOW = SlidingWindowSpec(
    block_size=16, num_kv_heads=8, head_size=128, dtype=torch.bfloat16, sliding_window=128
)
INDEXER = MLAAttentionSpec(
    block_size=64, num_kv_heads=1, head_size=132, dtype=torch.uint8, cache_role="INDEXER"
)
MLA = MLAAttentionSpec(block_size=64, num_kv_heads=1, head_size=576, dtype=torch.bfloat16)

#: Two decoder layers of two caches each, then an MTP layer with both caches.
SPARSE: dict[str, KVCacheSpec] = {
    "model.layers.0.self_attn.attn": MLA,
    "model.layers.0.self_attn.indexer": INDEXER,
    "model.layers.1.self_attn.attn": MLA,
    "model.layers.1.self_attn.indexer": INDEXER,
}
HYBRID: dict[str, KVCacheSpec] = {
    f"model.layers.{i}.attn": WINDOW if i % 2 else FULL for i in range(4)
}

# Referenced as "<this module>:<name>" by the module:attr tests.
FIXED_LIST = [SPARSE, HYBRID]
FIXED_DICT = {"sparse": SPARSE, "hybrid": HYBRID}
STRATEGY = st.sampled_from([Model(SPARSE, "strategy sparse"), Model(HYBRID, "strategy hybrid")])
NOT_MODELS = st.integers()


def factory() -> list[Mapping[str, KVCacheSpec]]:
    """A callable returning fixed models."""
    return [HYBRID]


def _ref(name: str) -> str:
    return f"{__name__}:{name}"


class TestInputForms:
    def test_json_file(self) -> None:
        """The dump of one worker loads with its names, decoder-layer count and specs."""
        (model,) = read_json(DSV4)
        assert model.description == "vendor: acme-dsv4-mini (worker 0 of 1)"
        assert model.family == "vendor"
        assert model.num_hidden_layers == 2
        assert len(model.specs) == 9
        latent = model.specs["model.layers.1.attn"]
        assert isinstance(latent, MLAAttentionSpec)
        assert latent.tokens_per_state == 4
        assert model.specs["model.layers.2.mtp_block.attn.swa_cache"].is_draft

    def test_json_declares_speculation(self, tmp_path: Path) -> None:
        """A dump may say how the model is served speculatively; without it, it is inferred."""
        (inferred,) = read_json(DSV4)
        assert speculation(inferred) == Speculation("mtp", 1, 1)
        data = json.loads(DSV4.read_text())
        data["models"][0].update(speculative_method="mtp", num_speculative_tokens=3)
        path = tmp_path / "spec.json"
        path.write_text(json.dumps(data))
        (declared,) = read_json(path)
        assert isinstance(declared, SpeculativeModel)
        assert declared.num_hidden_layers == 2 and declared.family == "vendor"
        assert speculation(declared) == Speculation("mtp", 1, 3)

    def test_json_keeps_the_hf_config(self, tmp_path: Path) -> None:
        """A dump's ``hf_config`` reaches the model, speculation kept; a bad one is named."""
        data = json.loads(DSV4.read_text())
        data["models"][0].update(
            hf_config={"model_type": "deepseek_v4", "architectures": ["DeepseekV4ForCausalLM"]},
            speculative_method="mtp",
            num_speculative_tokens=2,
        )
        path = tmp_path / "hf.json"
        path.write_text(json.dumps(data))
        (model,) = read_json(path)
        assert dict(model.hf_config)["model_type"] == "deepseek_v4"
        assert isinstance(model, SpeculativeModel)
        data["models"][0]["hf_config"] = {"num_hidden_layers": 3}
        path.write_text(json.dumps(data))
        with pytest.raises(VendorModelError, match=r"models\[0\].*num_hidden_layers"):
            read_json(path)

    def test_python_model_keeps_its_speculation(self) -> None:
        """A SpeculativeModel given as a Python object is served as it declares."""
        (model,) = read_json(DSV4)
        declared = SpeculativeModel(
            model.specs, "acme", speculative_method="mtp", num_speculative_tokens=2
        )
        drawn = find(load_models([declared]), lambda m: True, settings=OCCURS)
        assert isinstance(drawn, SpeculativeModel)
        assert speculation(drawn) == Speculation("mtp", 1, 2)

    def test_a_models_module_may_import_the_deployment_from_its_old_path(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """``conformance.generate.deployment`` (documented before the move) still imports."""
        import sys

        from conformance.extensions.vendor import deployment

        monkeypatch.delitem(sys.modules, "conformance.generate.deployment", raising=False)
        (tmp_path / "acme_old_models.py").write_text(
            "from conformance.generate.deployment import DeployedModel\n"
            f"from {__name__} import HYBRID\n"
            "MODELS = [HYBRID]\n"
            "KIND = DeployedModel\n"
        )
        monkeypatch.syspath_prepend(str(tmp_path))
        drawn = find(load_models("acme_old_models:MODELS"), lambda m: True, settings=OCCURS)
        assert drawn.family == "vendor"
        assert sys.modules["acme_old_models"].KIND is deployment.DeployedModel
        monkeypatch.delitem(sys.modules, "acme_old_models")

    def test_json_path_as_str_and_path(self) -> None:
        """A path (str or Path) loads the file's models."""
        for spec in (str(DSV4), DSV4):
            drawn = find(load_models(spec), lambda m: True, settings=OCCURS)
            assert drawn.family == "vendor"

    @pytest.mark.parametrize(
        ("name", "count"), [("FIXED_LIST", 2), ("FIXED_DICT", 2), ("factory", 1)]
    )
    def test_module_attr_fixed(self, name: str, count: int) -> None:
        """Lists, name -> model dicts and callables give their models (and variants)."""
        seen = set()

        @OCCURS
        @given(load_models(_ref(name)))
        def collect(model: Model) -> None:
            # Variants append "(...)" to the model they vary.
            seen.add(model.description.split(" (")[0])

        collect()
        assert len(seen) == count

    def test_dict_names_describe_models(self) -> None:
        """A dict's keys name its models."""
        names = sorted(m.description for m in fixed_models(FIXED_DICT))
        assert names == ["vendor: hybrid", "vendor: sparse"]

    def test_strategy(self) -> None:
        """A strategy's models are used, with variants around them."""
        model = find(load_models(_ref("STRATEGY")), lambda m: "hybrid" in m.description)
        assert set(model.specs.values()) <= {FULL, WINDOW}

    def test_objects_directly(self) -> None:
        """check_builder(models=...) may pass the objects themselves."""
        assert find(load_models([SPARSE]), lambda m: True).family == "vendor"
        assert find(load_models(STRATEGY), lambda m: True).family == "vendor"
        assert find(load_models(Model(HYBRID)), lambda m: True).family == "vendor"

    @pytest.mark.skipif(not is_vllm_available(), reason="vLLM 0.33.0 is not installed")
    def test_vllm_native_specs_and_subclasses(self) -> None:
        """vLLM specs convert; a vendor subclass keeps its class, planned as its nearest kind."""
        import dataclasses

        from kvref.interop import vllm as iv

        kvi = iv.vllm_modules().kvi

        @dataclasses.dataclass(frozen=True)
        class AcmeMLASpec(kvi.MLAAttentionSpec):  # type: ignore[misc, name-defined]
            acme_slot: int = 0

        native = iv.spec_to_vllm(MLA)
        fields = {f.name: getattr(native, f.name) for f in dataclasses.fields(native) if f.init}
        (model,) = fixed_models([{"a.layers.0.x": native, "a.layers.1.x": AcmeMLASpec(**fields)}])
        plain, vendor = model.specs.values()
        assert plain == MLA and type(vendor).__name__ == "AcmeMLASpec"
        assert isinstance(vendor, type(MLA)) and vendor.page_size_bytes == MLA.page_size_bytes


class TestErrors:
    @pytest.mark.parametrize(
        ("spec", "match"),
        [
            ("no_such_module_xyz:attr", "cannot import 'no_such_module_xyz'"),
            (f"{__name__}:MISSING", "has no attribute 'MISSING'"),
            ("not-a-spec", "neither 'module:attr' nor the path"),
            (_ref("NOT_MODELS"), "is not a model"),
            (str(DATA / "missing.json"), "cannot be read"),
        ],
    )
    def test_bad_spec(self, spec: str, match: str) -> None:
        """Every bad spec is a VendorModelError naming the value."""
        with pytest.raises(VendorModelError, match=match):
            load_models(spec)

    @pytest.mark.parametrize(
        ("value", "match"),
        [
            ([], "empty list"),
            ([{}], "has no layers"),
            ([{"l0": 3}], r"models\[0\]\['l0'\]=3 is neither"),
            ([{7: FULL}], "layer name 7"),
            (42, "must be a strategy of models"),
        ],
    )
    def test_bad_objects(self, value: Any, match: str) -> None:
        """Bad models and specs name where they are."""
        with pytest.raises(VendorModelError, match=match):
            load_models(value)

    @pytest.mark.parametrize(
        ("mutate", "match"),
        [
            (lambda d: d.update(format="other/1"), "format is 'other/1'"),
            (lambda d: d.update(models=[]), "non-empty list"),
            (lambda d: _layer(d).update(kind="NoSpec"), "kind='NoSpec' is not a spec class"),
            (lambda d: _layer(d).update(colour=1), "has no field.*colour"),
            (lambda d: _layer(d).update(page_size_bytes=1), "page_size_bytes=1"),
            (lambda d: _layer(d).update(block_size=-1), "block_size=-1"),
            (lambda d: d["models"][0].update(num_hidden_layers=0), "num_hidden_layers=0"),
            (
                lambda d: d["models"][0].update(speculative_method="mtp"),
                "speculative_method='mtp' and num_speculative_tokens=None go together",
            ),
            (
                lambda d: d["models"][0].update(num_speculative_tokens=2),
                "speculative_method=None and num_speculative_tokens=2 go together",
            ),
            (
                lambda d: d["models"][0].update(
                    speculative_method="teleport", num_speculative_tokens=1
                ),
                r"models\[0\]: SpeculativeModel.speculative_method='teleport' must be one of",
            ),
            (
                lambda d: d["models"][0].update(speculative_method="mtp", num_speculative_tokens=0),
                "num_speculative_tokens=0 must be an int >= 1",
            ),
            (
                # The dump has an MTP draft layer; n-gram speculation has no draft model.
                lambda d: d["models"][0].update(
                    speculative_method="ngram", num_speculative_tokens=2
                ),
                "num_draft_layers=1 must be 0 with PlanningConfig.speculative_method='ngram'",
            ),
        ],
    )
    def test_bad_json(self, tmp_path: Path, mutate: Any, match: str) -> None:
        """A malformed dump is refused with the offending value."""
        data = json.loads(DSV4.read_text())
        mutate(data)
        path = tmp_path / "bad.json"
        path.write_text(json.dumps(data))
        with pytest.raises(VendorModelError, match=match):
            read_json(path)

    def test_not_json(self, tmp_path: Path) -> None:
        """A file that is not JSON says so."""
        path = tmp_path / "x.json"
        path.write_text("{")
        with pytest.raises(VendorModelError, match="is not JSON"):
            read_json(path)

    def test_models_only_needs_models(self) -> None:
        """models_only without models is refused."""
        with pytest.raises(VendorModelError, match="models_only needs models"):
            models_for_run(None, models_only=True)


def _layer(data: dict[str, Any]) -> dict[str, Any]:
    layers = data["models"][0]["layers"]
    return layers[next(iter(layers))]  # type: ignore[no-any-return]


class TestAround:
    @FEW
    @given(around(Model({**SPARSE, "model.layers.2.self_attn.attn": MLA}, "x")))
    def test_whole_decoder_layers(self, model: Model) -> None:
        """Variants drop or repeat whole decoder layers: every layer keeps both caches."""
        layers = decoder_layers(model)
        assert sorted(layers.by_index) == list(range(layers.num_hidden_layers))
        for names in layers.by_index.values():
            kinds = sorted(n.rsplit(".", 1)[-1] for n in names)
            assert kinds in (["attn", "indexer"], ["attn"])

    def test_shrinks_to_the_model_itself(self) -> None:
        """The minimal variant is the vendor's model unchanged."""
        model = Model(SPARSE, "x")
        assert find(around(model), lambda m: True, settings=settings(database=None)) is model

    def test_drops_and_repeats_occur(self) -> None:
        """Smaller and larger variants are drawn."""
        model = Model(HYBRID, "x")
        assert len(find(around(model), lambda m: len(m.specs) < 4, settings=OCCURS).specs) < 4
        assert len(find(around(model), lambda m: len(m.specs) > 4, settings=OCCURS).specs) > 4

    def test_mtp_layers_follow_the_target(self) -> None:
        """Draft layers numbered after the target are renumbered after the new target."""
        (model,) = read_json(DSV4)
        grown = find(around(model), lambda m: (m.num_hidden_layers or 0) > 2, settings=OCCURS)
        hidden = grown.num_hidden_layers
        assert f"model.layers.{hidden}.mtp_block.attn.swa_cache" in grown.specs


class TestRunWiring:
    def test_models_only_and_mixed(self) -> None:
        """models_only draws only vendor models; mixed draws both."""
        only = models_for_run(str(DSV4), models_only=True)
        assert only is not None
        assert find(only, lambda m: True).family == "vendor"
        mixed = models_for_run(str(DSV4))
        assert mixed is not None
        find(mixed, lambda m: m.family == "vendor", settings=MANY)
        find(mixed, lambda m: m.family not in ("vendor", ""), settings=OCCURS)

    def test_check_builder_models_only(self) -> None:
        """check_builder runs the reference on the vendor's models alone and reports coverage."""
        report = check_builder(
            ReferenceKVCacheConfigBuilder,
            seed=3,
            max_examples=6,
            select=["KV-GROUP", "KV-PLACE"],
            models=str(DSV4),
            models_only=True,
        )
        assert report.ok, [r for r in report.results if r.status != "pass"]
        assert report.options["models"] == str(DSV4)
        for scenario in ("grouping", "placement"):
            assert set(report.coverage[scenario]["families"]) == {"vendor"}

    def test_check_builder_refuses_bad_models_before_the_run(self) -> None:
        """Bad models are an OptionError."""
        with pytest.raises(OptionError, match="cannot import"):
            check_builder(ReferenceKVCacheConfigBuilder, models="no_such_module_xyz:m")

    def test_cli(self, capsys: pytest.CaptureFixture[str]) -> None:
        """--models/--models-only run; a bad --models is a usage error (exit 2)."""
        args = ["--no-database", "--seed", "1", "--max-examples", "3", "--no-reach"]
        args += ["--select", "KV-GROUP-PARTITION", "--models", str(DSV4), "--models-only"]
        assert cli_main(args) == 0
        capsys.readouterr()
        assert cli_main([*args[:-3], "--models", "no_such_module_xyz:m"]) == 2
        assert "no_such_module_xyz" in capsys.readouterr().err

    def test_facade_reexports_strategies(self) -> None:
        """The strategies facade still offers models() and planning_problems()."""
        assert cs.planning_problems(models_strategy=load_models([HYBRID])) is not None
