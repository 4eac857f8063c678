"""Efficiency warnings, the "Waste" section of a report.

The kit compares every core plan of a builder with the reference's plan of
the same problem and warns, with the numbers, when the builder's holds less
than half as many requests; warnings never change a verdict.
"""

from __future__ import annotations

import json

import jsonschema
import legal_builders
import pytest

from conformance.extensions.waste.meter import WasteMeter, compare_plans
from conformance.extensions.waste.records import PlanFigures
from conformance.report.model import Report
from conformance.report.render import format_report, json_schema_path, report_to_dict
from conformance.run.runner import check_builder
from kvref import ReferenceKVCacheConfigBuilder

# Whole kit runs: too costly for every CI submission (tox -e slow, pytest -m slow).
pytestmark = pytest.mark.slow


def _run(builder: type) -> Report:
    return check_builder(
        builder, select=["KV-CORE"], max_examples=50, seed=1, shrink=False, reach=False
    )


def _figures(bpb: int, blocks: int, *, need: int | None = None, length: int = 100) -> PlanFigures:
    need = 4 * bpb if need is None else need
    return PlanFigures(
        bytes_per_block=bpb,
        need_bytes=need,
        groups=1,
        num_blocks=blocks,
        max_model_len=length,
        requests=(blocks - 1) * bpb / need,
    )


def test_pads_twice_warns_with_numbers_and_stays_green() -> None:
    """Pages padded to twice their size: warned, both plans' numbers shown, verdicts unchanged."""
    report = _run(legal_builders.PadsTwice)
    assert report.ok, report.failing_ids
    waste = report.waste
    assert waste is not None and waste.warned > 0 and waste.compared >= waste.warned
    worst = waste.worst[0]
    assert worst.ratio is None or worst.ratio > 2
    requests = [w for w in waste.worst if w.figure == "requests"]
    assert requests, waste.worst
    # Twice the bytes per block, half the blocks in the same memory.
    w = requests[0]
    assert w.builder.bytes_per_block == 2 * w.reference.bytes_per_block
    assert w.builder.num_blocks <= w.reference.num_blocks // 2 + 1
    text = format_report(report)
    assert "Waste (warnings, no verdict)" in text
    assert f"bytes per block {w.builder.bytes_per_block} vs {w.reference.bytes_per_block}" in text
    assert text.rstrip().endswith("OK")


def test_waste_json_follows_the_schema() -> None:
    """The JSON report carries the section, valid against report.schema.json."""
    data = report_to_dict(_run(legal_builders.PadsTwice))
    schema = json.loads(json_schema_path().read_text(encoding="utf-8"))
    jsonschema.validate(json.loads(json.dumps(data)), schema)
    assert data["waste"]["warned"] > 0
    assert "bytes per block" in data["waste"]["worst"][0]["message"]


def test_quiet_on_the_reference() -> None:
    """No warning on the reference.

    tests/kit/check/test_power.py asserts it for the legal builders.
    """
    waste = _run(ReferenceKVCacheConfigBuilder).waste
    assert waste is not None and waste.compared > 0
    assert waste.warned == 0, [w.message for w in waste.worst]


def test_threshold_is_more_than_twice() -> None:
    """Exactly half the requests is not warned about; less than half is."""
    reference = _figures(4096, 101)
    assert compare_plans(_figures(4096, 51), reference, scenario="core", example="") is None
    found = compare_plans(_figures(8192, 50), reference, scenario="core", example="e")
    assert found is not None and found.figure == "requests" and found.ratio is not None
    assert found.ratio > 2 and "8192 vs 4096" in found.message


def test_shorter_auto_fit_length_compares_lengths() -> None:
    """Auto-fit reaching less than half the reference's length is warned about as such."""
    found = compare_plans(
        _figures(4096, 10, length=100), _figures(4096, 10, length=300), scenario="core", example=""
    )
    assert found is not None and found.figure == "max_model_len"
    assert "max_model_len=100" in found.message


def test_page_rounding_of_tiny_blocks_is_no_waste() -> None:
    """A 512-byte block rounded up to 4 KiB is not warned about, though it is 8x the bytes."""
    from kvref import FullAttentionSpec, PlanningConfig

    spec = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=8, dtype="bfloat16")
    config = PlanningConfig(kv_cache_layout="LBNHC", max_model_len=256)
    workers = ({f"model.layers.{i}.self_attn.attn": spec for i in range(2)},)

    class _Example:
        def __init__(self) -> None:
            self.config, self.workers, self.available_memory = config, workers, (1 << 20,)

    from conformance.check.observations import CallResult, CoreObservation
    from kvref.planning import plan_kv_cache

    def observed(builder: type) -> CoreObservation:
        plan = plan_kv_cache(builder, config, [dict(w) for w in workers], [1 << 20])
        return CoreObservation(
            config=config,
            workers=workers,
            available_memory=(1 << 20,),
            result=CallResult(hook="core", value=plan),
        )

    rounded, doubled = WasteMeter(), WasteMeter()
    rounded.add(observed(legal_builders.Padded4KiB), _Example())
    doubled.add(observed(legal_builders.PadsTwice), _Example())
    assert rounded.compared == 1 and rounded.warnings == []
    # Doubling blocks smaller than a page stays within page rounding too.
    assert doubled.compared == 1 and doubled.warnings == []
