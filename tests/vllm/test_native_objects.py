"""``check_builder`` given a vLLM-native class or instance, as a vendor's own test calls it.

A builder named ``module:Class`` is loaded behind the vLLM adapter; the same
class handed over as an object must be too.  Before, the kit handed such a
builder kvref's records and reported vLLM's own default as failing its
calls (``'PlanningConfig' object has no attribute 'model_config'``), and in
process refused it as no kvref builder.  Here the object runs as its name
does: the same judgements, and a planted bug caught as meant.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("vllm.v1.core.kv_cache_planning")

from kit_runs import quick_check
from vllm.v1.core.kv_cache_planning import DefaultKVCacheConfigBuilder

from conformance.report.model import Report
from tests.kit.harness.test_worker_lifetime import children
from tests.vllm.native_builders.alignment import DropsAlignmentBuilder

pytestmark = pytest.mark.vllm

SELECT = ["KV-GROUP-PARTITION", "KV-PLACE-IN-BOUNDS", "KV-HOST-TENSORS"]


def _run(builder: Any, *, isolate: bool, select: list[str] = SELECT) -> Report:
    return quick_check(builder, *select, examples=8, seed=1, isolate=isolate, shrink=False)


def _verdicts(report: Report) -> dict[str, tuple[str, int]]:
    return {r.id: (r.status, r.examples) for r in report.results}


@pytest.mark.parametrize("isolate", [True, False], ids=["isolated", "in-process"])
def test_vllms_default_as_a_class_or_an_instance_is_judged_as_by_name(isolate: bool) -> None:
    """The class, an instance and the name give the same verdicts and counts, all passing.

    Each run closes the worker it started (each held vLLM, about 150 MB).
    """
    before = children()
    by_name = _run("vllm.v1.core.kv_cache_planning:DefaultKVCacheConfigBuilder", isolate=isolate)
    assert by_name.ok and {s for s, _ in _verdicts(by_name).values()} == {"pass"}
    for given in (DefaultKVCacheConfigBuilder, DefaultKVCacheConfigBuilder()):
        report = _run(given, isolate=isolate)
        assert _verdicts(report) == _verdicts(by_name), (given, _describe(report))
        assert report.builder == "vllm.v1.core.kv_cache_planning:DefaultKVCacheConfigBuilder"
    assert children() <= before


def test_a_broken_vendor_class_is_caught_as_meant() -> None:
    """A vendor's broken class, handed over as an object, fails its meant invariant alone."""
    report = _run(DropsAlignmentBuilder, isolate=True, select=["KV-GROUP-SPEC-MEANING"])
    assert [r.status for r in report.results] == ["fail"], _describe(report)
    assert not report.results[0].inherited


def _describe(report: Report) -> list[tuple[str, str, str]]:
    return [(r.id, r.status, str(r.violations[:1] or r.reason)[:400]) for r in report.results]
