"""Hostile vLLM-native answers are the builder's failure, never the kit's (exit 2).

The builders: tests/vllm/native_builders/hostile.py.  The check that tells a
planted value from a converter bug: conformance/harness/answer_plainness.py.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

pytest.importorskip("vllm.v1.core.kv_cache_planning")

from vllm.v1.core.kv_cache_planning import DefaultKVCacheConfigBuilder
from vllm.v1.kv_cache_interface import FullAttentionSpec

from conformance import check_builder
from conformance.harness.answer_plainness import odd_part
from kvref.config import PlanningConfig
from kvref.interop import vllm as iv
from kvref.specs import FullAttentionSpec as KvrefFull

pytestmark = pytest.mark.vllm

PKG = "tests.vllm.native_builders.hostile"


# One builder per mode: the adapter converts in the builder's worker or in the kit.
@pytest.mark.parametrize(
    ("name", "where", "isolate"),
    [
        ("TruthRaisingField", "answer.kv_cache_tensors[0].host_resident (a _Raises)", True),
        ("RaisingIntSize", "answer.kv_cache_tensors[0].size (a _RaisingInt)", False),
        # The kit's own error class, raised by the builder: its failure, not the kit's.
        ("RaisesKitError", "raised BuilderKitError: the builder raised the kit's own", True),
        ("RaisesKitError", "raised BuilderKitError: the builder raised the kit's own", False),
    ],
    ids=["isolated", "in-process", "kit-error-isolated", "kit-error-in-process"],
)
def test_a_planted_value_fails_the_builder(name: str, where: str, isolate: bool) -> None:
    """The run ends with a verdict naming where the value lies (it raised a kit error before)."""
    report = check_builder(
        f"{PKG}:{name}",
        select=["KV-CALL-RAISES", "KV-PLACE-IN-BOUNDS"],
        max_examples=3,
        seed=1,
        isolate=isolate,
        shrink=False,
        reach=False,
    )
    assert [r.id for r in report.failures] == ["KV-CALL-RAISES"]
    (failure,) = report.failures
    assert any(where in v.message for v in failure.violations), failure.violations


def _placed() -> Any:
    config = PlanningConfig()
    spec = KvrefFull(block_size=16, num_kv_heads=2, head_size=64, dtype="float16")
    specs = iv.specs_to_vllm({"layer.0": spec, "layer.1": spec})
    vcfg = iv.to_vllm_config(config)
    builder = DefaultKVCacheConfigBuilder()
    groups = builder.get_kv_cache_groups(vcfg, dict(specs))
    return builder.get_kv_cache_config_from_groups(vcfg, groups, 4)


def test_vllms_own_answers_are_plain() -> None:
    """A placement and a grouping of vLLM's default hold nothing odd."""
    placed = _placed()
    assert odd_part(placed) is None
    assert odd_part(list(placed.kv_cache_groups)) is None


def test_odd_values_are_found_by_type() -> None:
    """A subclass of a plain type, a foreign object, an odd key; a vendor's record is plain."""
    placed = _placed()
    tensor = placed.kv_cache_tensors[0]

    class Size(int):
        pass

    class AcmeSpec(FullAttentionSpec):
        pass

    tensor.size = Size(tensor.size)
    assert odd_part(placed) == "answer.kv_cache_tensors[0].size (a Size)"
    tensor.size = int(tensor.size)
    assert odd_part({"a": [1, (2, object())]}) == "answer['a'][1][1] (a object)"
    assert odd_part({(1,): 2}) == "answer (a key of type tuple)"
    spec = placed.kv_cache_groups[0].kv_cache_spec
    values = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec) if f.init}
    # A vendor's subclass of a vLLM record is legal: judged by its fields.
    assert odd_part([AcmeSpec(**values)]) is None
    assert odd_part([AcmeSpec(**{**values, "block_size": Size(16)})]) == (
        "answer[0].block_size (a Size)"
    )
