"""Vendor models cross as data (conformance/extensions/vendor/data.py, extensions/vendor/child.py).

A ``module:attr`` spec is evaluated in a contained child; what the judge
gets is a ``kvref-models/1`` document, read as a JSON file is.  The document
must carry every model the kit can generate unchanged (specs, decoder-layer
count, Hugging Face fields, deployment), a vendor's own spec class by name,
and a models module that attacks at import must attack only the child.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import attrs
import pytest
import torch
from hypothesis import assume, find, given, settings

from conformance.extensions.vendor.child import evaluate, load_models
from conformance.extensions.vendor.data import models_data
from conformance.extensions.vendor.deployment import deployment_of
from conformance.extensions.vendor.models import VendorModelError, read_data
from conformance.generate.families import FAMILIES
from conformance.generate.families import models as family_models
from conformance.generate.records import Model
from conformance.harness.wire import builder_class
from kvref.interop.vllm_vendor import vendor_origin, vendor_spec_class
from kvref.specs import MLAAttentionSpec

TESTS = Path(__file__).resolve().parents[2]


def _same(read: Model, model: Model) -> None:
    assert list(read.specs.items()) == list(model.specs.items())
    assert read.num_hidden_layers == model.num_hidden_layers
    assert read.hf_config == model.hf_config
    assert deployment_of(read) == deployment_of(model)


@settings(max_examples=40, deadline=None)
@given(family_models(max_layers=12, families=list(FAMILIES)))
def test_every_generated_model_crosses_unchanged(model: Model) -> None:
    """Every family's models (deployments included) read back from their document as they were."""
    assume(model.specs)  # an attention-free model has no layer: no vendor model is empty
    document = json.loads(json.dumps(models_data([model])))
    (read,) = read_data(document, "models")
    _same(read, model)
    assert read.family == "vendor"


class AcmeMLASpec:
    """Stands for a vendor's subclass of vLLM's MLA spec (only its name matters here)."""


def test_a_vendor_class_crosses_by_name() -> None:
    """The judge keeps a stand-in of the vendor's class, by name, with its own fields."""
    base = MLAAttentionSpec(block_size=64, num_kv_heads=1, head_size=576, dtype=torch.bfloat16)
    stand_in = vendor_spec_class(MLAAttentionSpec, AcmeMLASpec, (("acme_slot", (1, 2)),))
    fields = {f.name: getattr(base, f.name) for f in attrs.fields(MLAAttentionSpec) if f.init}
    model = Model({"model.layers.0.attn": stand_in(**fields)}, "acme")
    document = json.loads(json.dumps(models_data([model])))
    layer = document["models"][0]["layers"]["model.layers.0.attn"]
    assert layer["vendor"] == {
        "class": f"{__name__}:AcmeMLASpec",
        "fields": [["acme_slot", [1, 2]]],
    }
    (read,) = read_data(document, "models", vendor_class=builder_class)
    spec = read.specs["model.layers.0.attn"]
    origin = vendor_origin(spec)
    assert origin is not None and origin.extra == (("acme_slot", (1, 2)),)
    # A class of that name, not the class: the judge imports nothing of the vendor's.
    assert origin.vendor_cls.__qualname__ == "AcmeMLASpec" and origin.vendor_cls is not AcmeMLASpec
    assert spec.page_size_bytes == base.page_size_bytes


def test_a_models_module_runs_only_in_its_child(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A module that patches the catalog at import patched the child; here it never came."""
    marker = tmp_path / "forged.txt"
    monkeypatch.setenv("KVREF_FORGE_MARKER", str(marker))
    monkeypatch.syspath_prepend(str(TESTS))
    for name in [m for m in sys.modules if m == "forgers" or m.startswith("forgers.")]:
        monkeypatch.delitem(sys.modules, name)
    models = load_models("forgers.models:MODELS")
    assert "forgers.models" not in sys.modules
    lines = marker.read_text().splitlines()
    assert [line.partition(" pid=")[0] for line in lines] == ["models import"]
    assert not any(line.endswith(f"pid={os.getpid()}") for line in lines)
    assert find(models, lambda m: True).family == "vendor"
    from conformance.check.catalog import by_id

    # The catalog of this process judges as before.
    assert by_id()["KV-PLACE-BACKING-SIZE"].check.__name__ != "_pass"


def test_a_strategy_is_drawn_in_the_child(monkeypatch: pytest.MonkeyPatch) -> None:
    """A vendor's strategy: its distinct draws, fixed, the same ones every time."""
    monkeypatch.syspath_prepend(str(TESTS))
    drawn = evaluate("test_vendor_models:STRATEGY")
    assert sorted(m.description for m in drawn) == [
        "vendor: strategy hybrid",
        "vendor: strategy sparse",
    ]
    assert evaluate("test_vendor_models:STRATEGY") == drawn  # the same draws every time
    with pytest.raises(VendorModelError, match="is not a model"):
        load_models("test_vendor_models:NOT_MODELS")


def test_a_child_that_dies_is_a_usage_error(tmp_path: Path) -> None:
    """A models module that ends its process: named, exit 2, no output file touched."""
    (tmp_path / "dies.py").write_text("import os\nos._exit(3)\nMODELS = []\n")
    report = tmp_path / "r.json"
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "conformance.cli", "kvref:ReferenceKVCacheConfigBuilder"),
            *("--models", "dies:MODELS", "--json", str(report)),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=dict(os.environ, PYTHONPATH=str(tmp_path)),
    )
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "dies:MODELS" in proc.stderr and "ended before it sent the models" in proc.stderr
    assert not report.exists()
