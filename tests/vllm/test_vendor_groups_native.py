"""A grouping in the vendor's own spec class: planned by the kit's vLLM Core, handed back as it.

The builder: tests/vllm/native_builders/vendor_groups.py.
"""

from __future__ import annotations

import pickle
from typing import Any

import pytest

pytest.importorskip("vllm.v1.core.kv_cache_planning")

from conformance import check_builder
from conformance.harness import wire
from conformance.upstream import DEFECTS
from kvref.interop import vllm as iv
from kvref.interop.vllm_vendor import vendor_origin, vendor_spec_class
from kvref.specs import FullAttentionSpec
from tests.vllm.native_builders.vendor_groups import AcmeFullSpec

pytestmark = pytest.mark.vllm

BUILDER = "tests.vllm.native_builders.vendor_groups:AcmeTypedGroupsBuilder"
NAME = "tests.vllm.native_builders.vendor_groups:AcmeFullSpec"
#: What vLLM's default builder breaks itself (docs/vllm.md), reported as inherited.
UPSTREAM = {inv for defect in DEFECTS for inv in defect.invariants}


# In process the vendor's class never leaves it (that path worked before): slow.
@pytest.mark.parametrize(
    "isolate", [True, pytest.param(False, marks=pytest.mark.slow)], ids=["isolated", "in-process"]
)
def test_the_vendors_class_is_planned_not_a_kit_error(isolate: bool) -> None:
    """Grouping, placement and Core's flow judge it as vLLM's default (no internal error)."""
    report = check_builder(
        BUILDER,
        select=["KV-GROUP-PARTITION", "KV-GROUP-SPEC-MEANING", "KV-PLACE-IN-BOUNDS",
                "KV-CORE-MEMORY", "KV-CORE-WORKER-LAYERS", "KV-CALL-RAISES"],
        max_examples=10,
        seed=1,
        isolate=isolate,
        shrink=False,
        reach=False,
    )  # fmt: skip
    for result in report.failures:
        assert result.id in UPSTREAM and result.inherited, (result.id, result.violations)
    assert report.result("KV-CALL-RAISES").status == "pass"


def _stand_in(vendor_cls: Any) -> Any:
    """A kvref full-attention spec standing for ``vendor_cls``, as the wire decodes one."""
    cls = vendor_spec_class(FullAttentionSpec, vendor_cls, ())
    return cls(block_size=16, num_kv_heads=2, head_size=64, dtype="float16")


def test_the_kit_plans_a_named_only_class_as_its_vllm_kind() -> None:
    """In the kit's process the class is a name: vLLM gets a subclass of its kind named as it."""
    spec = _stand_in(wire.placeholder_class(NAME))
    vllm_spec = iv.spec_to_vllm(spec)
    assert type(vllm_spec).__name__ == "AcmeFullSpec"
    assert isinstance(vllm_spec, iv.vllm_modules().kvi.FullAttentionSpec)
    assert not isinstance(vllm_spec, AcmeFullSpec)
    # And back: the same kvref stand-in, equal to the one it came from.
    assert iv.spec_from_vllm(vllm_spec) == spec


def test_the_builders_process_gets_its_own_class(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stand-in pickled by the kit unpickles, in the builder's process, as the vendor's class."""
    sent = pickle.dumps(_stand_in(wire.placeholder_class(NAME)))
    # In the kit's process: still the name only.
    origin = vendor_origin(pickle.loads(sent))
    assert origin is not None and origin.vendor_cls is wire.placeholder_class(NAME)
    monkeypatch.setattr(wire, "_BUILDER_PROCESS", [True])
    here = pickle.loads(sent)
    origin = vendor_origin(here)
    assert origin is not None and origin.vendor_cls is AcmeFullSpec
    assert type(iv.spec_to_vllm(here)) is AcmeFullSpec
