"""The kit says which vLLM contract it checks, and warns once when another vLLM is installed."""

from __future__ import annotations

import json
import warnings

import jsonschema
import pytest

import conformance.contract as contract
import conformance.run.judging as judging
from conformance.report.render import json_schema_path, report_to_dict
from conformance.run.runner import ContractVersionWarning, check_builder
from kvref import ReferenceKVCacheConfigBuilder


def test_the_contracts_own_release_is_nothing_to_say() -> None:
    """vLLM 0.33.0, or no vLLM at all, draws no note."""
    assert contract.version_note("0.33.0") is None
    assert contract.CONTRACT == "vLLM 0.33.0"


def test_another_release_is_named_with_what_it_means() -> None:
    """Another release: the note names both versions and what a verdict then means."""
    note = contract.version_note("0.34.1")
    assert note is not None
    assert "vLLM 0.34.1 is installed" in note and "vLLM 0.33.0 builder contract" in note
    assert "docs/contract.md" in note and "go unchecked" in note


def _run() -> object:
    return check_builder(
        ReferenceKVCacheConfigBuilder,
        select=["KV-GROUP-PARTITION"],
        max_examples=2,
        seed=1,
        isolate=False,
        reach=False,
    )


def test_a_run_with_another_vllm_warns_once_and_reports_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The note is in the report's warnings, and Python warns once for two runs."""
    monkeypatch.setattr(contract, "installed_vllm", lambda: "0.34.1")
    monkeypatch.setattr(judging, "_WARNED", set())
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("default")
        first, second = _run(), _run()
    raised = [w for w in seen if issubclass(w.category, ContractVersionWarning)]
    assert len(raised) == 1, [str(w.message) for w in seen]
    for report in (first, second):
        assert any("vLLM 0.34.1 is installed" in w for w in report.warnings)  # type: ignore[attr-defined]
        assert report.ok  # type: ignore[attr-defined]  # a note, never a verdict
    data = report_to_dict(first)  # type: ignore[arg-type]
    assert data["contract"] == "vLLM 0.33.0"
    schema = json.loads(json_schema_path().read_text(encoding="utf-8"))
    jsonschema.validate(json.loads(json.dumps(data)), schema)


def test_the_contracts_release_reports_no_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    """With 0.33.0 installed the report carries the contract and no note."""
    monkeypatch.setattr(contract, "installed_vllm", lambda: "0.33.0")
    report = _run()
    assert report.warnings == () and report.contract == "vLLM 0.33.0"  # type: ignore[attr-defined]
