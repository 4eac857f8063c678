"""Vendor models carry their whole deployment (conformance.extensions.vendor.deployment).

A vendor model's HiSparse settings, declared grouping, speculative config
and layout reach the builder as the model declares them, from a
``kvref-models/1`` file or a Python object, and each bad field is refused
naming the field and its value.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import pytest
from hypothesis import Phase, given, settings

from conformance.extensions.vendor.deployment import DeployedModel
from conformance.extensions.vendor.models import VendorModelError, around, fixed_models, read_json
from conformance.generate.families.drafts import speculation
from conformance.generate.families.extras import DeclaredGroups, ExtendedModel, ModelExtras
from conformance.run.runner import check_builder
from kvref import KVCacheGroupSpec, PlanningConfig, ReferenceKVCacheConfigBuilder
from kvref.config import HiSparseConfig
from kvref.layout import KVCacheLayout
from kvref.specs import KVCacheSpec

# Whole kit runs: too costly for every CI submission (tox -e slow, pytest -m slow).
pytestmark = pytest.mark.slow

DEPLOYMENTS = Path(__file__).resolve().parents[2] / "data" / "models" / "acme_deployments.json"
FEW = settings(database=None, deadline=None, max_examples=25, phases=[Phase.generate])


class SeenConfigs(ReferenceKVCacheConfigBuilder):
    """The reference, recording the deployment settings each grouping call was handed."""

    seen: ClassVar[list[tuple[HiSparseConfig | None, object, KVCacheLayout]]] = []
    lock: ClassVar[threading.Lock] = threading.Lock()

    def get_kv_cache_groups(
        self, config: PlanningConfig, kv_cache_spec: Mapping[str, KVCacheSpec]
    ) -> list[KVCacheGroupSpec]:
        with self.lock:
            self.seen.append(
                (config.hisparse, config.model_kv_cache_grouping, config.kv_cache_layout)
            )
        return super().get_kv_cache_groups(config, kv_cache_spec)


def test_file_deployment_reaches_the_builder() -> None:
    """HiSparse settings (with layout) and a declared grouping from a file reach the builder."""
    SeenConfigs.seen.clear()
    report = check_builder(
        SeenConfigs,
        models=str(DEPLOYMENTS),
        models_only=True,
        select=["KV-GROUP-PARTITION"],
        max_examples=20,
        seed=1,
        database=None,
        isolate=False,
    )
    assert report.ok
    hisparse = [h for h, _, _ in SeenConfigs.seen if h is not None]
    assert hisparse and all(h.index_topk == 2048 and h.max_decode_query_len == 2 for h in hisparse)
    assert all(layout is KVCacheLayout.BLNHC for h, _, layout in SeenConfigs.seen if h)
    grouped = [g for _, g, _ in SeenConfigs.seen if isinstance(g, DeclaredGroups)]
    assert grouped
    # Whole groups of the file, or of a variant that dropped or repeated decoder layers.
    assert any(len(g.groups) == 3 for g in grouped)


def test_read_json_keeps_every_field() -> None:
    """The file's models load as models with their deployment."""
    sparse, local = read_json(DEPLOYMENTS)
    assert isinstance(sparse, ExtendedModel) and isinstance(local, ExtendedModel)
    assert sparse.extras.hisparse == HiSparseConfig(index_topk=2048, max_decode_query_len=2)
    assert sparse.extras.host_pool_slack == 1
    assert sparse.extras.kv_cache_layout is KVCacheLayout.BLNHC
    grouping = local.extras.kv_cache_grouping
    assert isinstance(grouping, DeclaredGroups) and len(grouping.groups) == 3


def test_python_model_keeps_its_extras_and_speculation() -> None:
    """An ExtendedModel handed as a Python object keeps its extras (it was made a plain Model)."""
    _, local = read_json(DEPLOYMENTS)
    assert isinstance(local, ExtendedModel)
    (again,) = fixed_models(local)
    assert isinstance(again, ExtendedModel) and again.extras == local.extras
    declared = DeployedModel(
        local.specs,
        "x",
        speculative_method="ngram",
        num_speculative_tokens=3,
        extras=local.extras,
    )
    (kept,) = fixed_models(declared)
    assert isinstance(kept, DeployedModel) and kept.extras == local.extras
    assert speculation(kept).method == "ngram" and speculation(kept).num_speculative_tokens == 3


@FEW
@given(around(read_json(DEPLOYMENTS)[1]))
def test_variants_keep_a_partition(model: Any) -> None:
    """Variants that drop or repeat decoder layers rename the declared groups with the layers."""
    grouping = model.extras.kv_cache_grouping
    named = [n for group in grouping.groups for n in group]
    assert sorted(named) == sorted(model.specs)
    groups = ReferenceKVCacheConfigBuilder().get_kv_cache_groups(
        PlanningConfig(model_kv_cache_grouping=grouping), dict(model.specs)
    )
    assert sorted(n for g in groups for n in g.layer_names) == sorted(model.specs)


def _model(data: dict[str, Any], index: int) -> dict[str, Any]:
    model: dict[str, Any] = data["models"][index]
    return model


def _groups(data: dict[str, Any]) -> list[Sequence[str]]:
    groups: list[Sequence[str]] = _model(data, 1)["kv_cache_grouping"]["groups"]
    return groups


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda d: _model(d, 0).update(colour="red"), r"models\[0\]: unknown field\(s\) colour"),
        (
            lambda d: _model(d, 0)["hisparse"].update(topk=1),
            r"models\[0\]\.hisparse: HiSparseConfig has no field\(s\) topk",
        ),
        (
            lambda d: _model(d, 0)["hisparse"].update(max_decode_query_len=0),
            r"models\[0\]\.hisparse=.*max_decode_query_len",
        ),
        (lambda d: _model(d, 0).update(hisparse=7), r"models\[0\]\.hisparse=7 must be an object"),
        (lambda d: _model(d, 0).update(host_pool_slack=-1), "host_pool_slack=-1 must be an int"),
        (
            lambda d: _model(d, 0).update(kv_cache_layout="LHBNC"),
            "kv_cache_layout='LHBNC' is not one vLLM resolves",
        ),
        (lambda d: _model(d, 0).update(kv_cache_layout="XYZ"), "kv_cache_layout='XYZ' is not a"),
        (
            lambda d: _model(d, 0).update(kv_cache_layout="LBNHC"),
            "kv_cache_layout='LBNHC': HiSparse needs a block-outermost layout",
        ),
        (
            lambda d: _model(d, 0).update(
                kv_cache_grouping={"kind": "runs_of_kind", "max_layers": 2}
            ),
            "kv_cache_grouping=.* cannot be combined with hisparse",
        ),
        (
            lambda d: _model(d, 1).update(hisparse={"index_topk": 2048}),
            r"models\[1\]: hisparse=.*no sparse-MLA layer",
        ),
        (
            lambda d: _model(d, 1).update(host_pool_slack=2),
            "host_pool_slack=2 needs hisparse",
        ),
        (
            lambda d: _groups(d).append(["model.layers.9.self_attn.attn"]),
            r"kv_cache_grouping: the groups must name every layer.*layers\.9",
        ),
        (
            lambda d: _groups(d).pop(),
            r"kv_cache_grouping: the groups must name every layer.*in no group: \['model",
        ),
        (
            lambda d: _groups(d).append(list(_groups(d)[0])),
            "names .* in more than one group",
        ),
        (
            # A full and a sliding-window layer cannot share a group.
            lambda d: _groups(d)[0].extend(_groups(d).pop()),
            r"kv_cache_grouping=DeclaredGroups.*not of one type",
        ),
        (
            lambda d: _model(d, 1).update(kv_cache_grouping={"kind": "teleport"}),
            r"kv_cache_grouping=\{'kind': 'teleport'\} must be",
        ),
    ],
)
def test_bad_deployment(tmp_path: Path, mutate: Any, match: str) -> None:
    """Each bad deployment field is refused naming the model, the field and the value."""
    data = json.loads(DEPLOYMENTS.read_text())
    mutate(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(VendorModelError, match=match):
        read_json(path)


def test_plain_extras_stay_plain() -> None:
    """A model whose extras are all defaults is not wrapped (nothing to serve differently)."""
    (sparse, _) = read_json(DEPLOYMENTS)
    model = ExtendedModel(sparse.specs, "x", extras=ModelExtras())
    (kept,) = fixed_models(model)
    assert type(kept).__name__ == "Model"
