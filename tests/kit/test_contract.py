"""The kit says which vLLM contract a run checks, and warns once for an unsupported vLLM."""

from __future__ import annotations

import json
import warnings

import jsonschema
import pytest
from kit_runs import quick_check

import conformance.contract as contract
import conformance.run.judging as judging
from conformance.report.render import json_schema_path, report_to_dict
from conformance.run.options import OptionError, RunOptions
from conformance.run.runner import ContractVersionWarning
from kvref import ReferenceKVCacheConfigBuilder
from kvref.versions import NEWEST, V0_33, V0_34


def test_a_supported_release_is_nothing_to_say() -> None:
    """vLLM 0.33.0 or 0.34.0 installed draws no note: a run judges a supported contract."""
    assert contract.version_note(V0_34, "0.33.0") is None
    assert contract.version_note(V0_33, "0.34.0") is None
    assert f"vLLM {NEWEST}" == contract.CONTRACT
    assert contract.contract_name(V0_33) == "vLLM 0.33.0"


def test_an_unsupported_release_is_named_with_what_it_means() -> None:
    """Another release: the note names it, the judged contract and what a verdict then means."""
    note = contract.version_note(V0_34, "0.35.1")
    assert note is not None
    assert "vLLM 0.35.1 is installed" in note and "judged this run by vLLM 0.34.0's" in note
    assert "docs/contract.md" in note and "go unchecked" in note


def test_the_run_option_names_a_supported_release() -> None:
    """``vllm`` takes a short or full name, is spelled in full, and refuses the rest at once."""
    assert RunOptions.create("m:B", vllm="0.33").vllm == "0.33.0"
    assert RunOptions.create("m:B", vllm="0.34.0").vllm_version == V0_34
    for bad in ("0.32", "latest", "0.34.7"):
        with pytest.raises(OptionError, match="vllm="):
            RunOptions.create("m:B", vllm=bad)
    assert "--vllm 0.33.0" in RunOptions.create("m:B", vllm="0.33", seed=1).reproduce("KV-X")


def _run(vllm: str | None = None) -> object:
    return quick_check(
        ReferenceKVCacheConfigBuilder, "KV-GROUP-PARTITION", examples=2, seed=1, vllm=vllm
    )


def test_a_run_with_another_vllm_warns_once_and_reports_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The note is in the report's warnings, and Python warns once for two runs."""
    monkeypatch.setattr(contract, "installed_vllm", lambda: "0.35.1")
    monkeypatch.setattr(judging, "_WARNED", set())
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("default")
        first, second = _run("0.34"), _run("0.34")
    raised = [w for w in seen if issubclass(w.category, ContractVersionWarning)]
    assert len(raised) == 1, [str(w.message) for w in seen]
    for report in (first, second):
        assert any("vLLM 0.35.1 is installed" in w for w in report.warnings)  # type: ignore[attr-defined]
        assert report.ok  # type: ignore[attr-defined]  # a note, never a verdict
    data = report_to_dict(first)  # type: ignore[arg-type]
    assert data["contract"] == "vLLM 0.34.0"
    schema = json.loads(json_schema_path().read_text(encoding="utf-8"))
    jsonschema.validate(json.loads(json.dumps(data)), schema)


@pytest.mark.parametrize("release", ["0.33.0", "0.34.0"])
def test_the_run_names_the_release_it_judges(monkeypatch: pytest.MonkeyPatch, release: str) -> None:
    """The report names the run's release, and no note with a supported vLLM installed."""
    monkeypatch.setattr(contract, "installed_vllm", lambda: "0.33.0")
    report = _run(release)
    assert report.warnings == () and report.contract == f"vLLM {release}"  # type: ignore[attr-defined]
    assert report.options["vllm"] == release  # type: ignore[attr-defined]
