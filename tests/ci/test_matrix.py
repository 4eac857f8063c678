"""The compatibility matrix: one builder under every supported vLLM release (--vllm all)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import jsonschema
import pytest

from conformance.ci.matrix import (
    check_matrix,
    format_matrix,
    matrix_markdown,
    matrix_schema_path,
    matrix_to_dict,
    write_matrix_files,
)
from conformance.cli import main
from conformance.errors import OptionError
from conformance.report.render import json_schema_path
from conformance.run.options import RunOptions
from conformance.run.runner import check_builder
from kvref import ReferenceKVCacheConfigBuilder
from kvref.versions import SUPPORTED, V0_33, V0_34

SMALL = {"select": ["KV-GROUP-PARTITION"], "max_examples": 2, "seed": 1, "isolate": False}


@pytest.fixture(scope="module")
def reference_matrix() -> object:
    return check_matrix(ReferenceKVCacheConfigBuilder, reach=False, **SMALL)


def test_every_release_judges_a_kvref_native_builder(reference_matrix: object) -> None:
    from conformance.ci.matrix import Matrix

    assert isinstance(reference_matrix, Matrix)
    assert [v for v, _ in reference_matrix.reports] == list(SUPPORTED)
    assert [r.contract for r in reference_matrix.judged] == [f"vLLM {v}" for v in SUPPORTED]
    assert reference_matrix.ok
    assert all(reference_matrix.status(v, "KV-GROUP-PARTITION") == "pass" for v in SUPPORTED)
    text = format_matrix(reference_matrix)
    assert "vLLM 0.33.0" in text and "vLLM 0.34.0" in text and text.endswith("held")


def test_the_json_follows_its_schema_and_carries_each_report(
    reference_matrix: object, tmp_path: Path
) -> None:
    from conformance.ci.matrix import Matrix

    assert isinstance(reference_matrix, Matrix)
    paths = {k: tmp_path / f"m.{k}" for k in ("json", "xml", "md", "html")}
    assert not write_matrix_files(
        reference_matrix,
        json_path=paths["json"],
        junit=paths["xml"],
        markdown=paths["md"],
        html_path=paths["html"],
    )
    data = json.loads(paths["json"].read_text())
    jsonschema.validate(data, json.loads(matrix_schema_path().read_text()))
    report_schema = json.loads(json_schema_path().read_text())
    for version in SUPPORTED:
        jsonschema.validate(data["reports"][str(version)], report_schema)
        assert data["verdicts"]["KV-GROUP-PARTITION"][str(version)] == "pass"
    suites = ET.parse(paths["xml"]).getroot().findall("testsuite")
    assert [s.get("name") for s in suites] == [
        f"kvref-conformance {data['builder']} (vLLM {v})" for v in SUPPORTED
    ]
    assert "| `KV-GROUP-PARTITION` | PASS | PASS |" in paths["md"].read_text()
    assert "vLLM 0.34.0" in paths["html"].read_text()


def test_a_release_that_cannot_judge_the_builder_is_not_judged_never_a_pass() -> None:
    """A vLLM-native builder under a release not installed: shown as not judged, matrix NOT OK."""

    def run(builder: object, options: object, **overrides: object) -> object:
        if overrides["vllm"] == str(V0_33):
            raise OptionError("vllm='0.33.0': a vLLM-native builder runs vLLM's own code, ...")
        return check_builder(builder, options, reach=False, **{**SMALL, **overrides})  # type: ignore[arg-type]

    matrix = check_matrix(ReferenceKVCacheConfigBuilder, run=run)
    assert not matrix.ok
    assert matrix.status(V0_33, "KV-GROUP-PARTITION") == "not-judged"
    assert matrix.status(V0_34, "KV-GROUP-PARTITION") == "pass"
    assert "NOT JUDGED" in format_matrix(matrix) and "not judged" in matrix_markdown(matrix)
    data = matrix_to_dict(matrix)
    assert data["reports"]["0.33.0"] is None and "vLLM-native" in data["not_judged"]["0.33.0"]
    assert not data["ok"]


def test_other_option_errors_still_stop_the_matrix() -> None:
    def run(builder: object, options: object, **overrides: object) -> object:
        raise OptionError("max_examples=0 must be a positive int")

    with pytest.raises(OptionError, match="max_examples"):
        check_matrix(ReferenceKVCacheConfigBuilder, run=run)


def test_one_run_judges_one_release() -> None:
    assert RunOptions.create("m:B", vllm="all").vllm == "all"
    with pytest.raises(OptionError, match="matrix"):
        check_builder(ReferenceKVCacheConfigBuilder, vllm="all", **SMALL)


@pytest.mark.parametrize(
    "flag", [["--update-expectations", "u.toml"], ["--shard", "1/2", "--focus", "off"]]
)
def test_the_cli_refuses_single_report_options_before_any_file_is_touched(
    tmp_path: Path, flag: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "r.json"
    out.write_text("previous")
    args = [str(tmp_path / a) if a == "u.toml" else a for a in flag]
    builder = "kvref.builder:ReferenceKVCacheConfigBuilder"
    code = main([builder, "--vllm", "all", "--json", str(out), *args])
    assert code == 2
    err = capsys.readouterr().err
    assert "--vllm all makes one report per release" in err, err
    assert out.read_text() == "previous"


def test_the_cli_prints_and_writes_the_matrix(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "m.json"
    code = main(
        [
            "kvref.builder:ReferenceKVCacheConfigBuilder",
            "--vllm", "all", "--select", "KV-GROUP-PARTITION", "--max-examples", "2",
            "--seed", "1", "--no-isolate", "--no-reach", "--no-database", "--json", str(out),
        ]
    )  # fmt: skip
    printed = capfd.readouterr().out
    assert code == 0, printed
    assert "compatibility matrix" in printed and "vLLM 0.33.0" in printed
    data = json.loads(out.read_text())
    assert data["format"] == "kvref-matrix/1" and data["ok"]
