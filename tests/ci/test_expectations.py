"""Expectations manifests: validation, matching, refresh, the shipped vLLM one."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import attrs
import pytest

from conformance import InvariantResult, Report
from conformance.ci.expectations import (
    ExpectationsError,
    apply_expectations,
    load_manifest,
    resolve_manifest,
    shipped_manifests,
    update_manifest,
)
from conformance.ci.expectations.manifest import FORMAT, PLACEHOLDER_REASON
from conformance.ci.expectations.tomlw import dump_manifest
from conformance.upstream import DEFECTS
from kvref.versions import SUPPORTED

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def _manifest(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "exp.toml"
    path.write_text(f'format = "{FORMAT}"\n{body}', encoding="utf-8")
    return path


ENTRY = '[[expected]]\nid = "KV-GROUP-PARTITION"\nreason = "drops a layer"\nlink = "x#1"\n'


def _result(ident: str, status: str, **extra: Any) -> InvariantResult:
    return InvariantResult(
        id=ident, title="t", reference="docs/contract.md#verdicts", status=status, **extra
    )


def _report(
    *results: InvariantResult, device: str = "cpu", contract: str = "vLLM 0.34.0"
) -> Report:
    return Report(
        builder="m:B", device=device, seed=1, profile="ci", max_examples=3,
        results=results, seconds=1.0, contract=contract,
    )  # fmt: skip


class TestValidation:
    """Errors name the entry, the field and the value."""

    @pytest.mark.parametrize(
        ("body", "needle"),
        [
            (ENTRY + "strict = 1\n", "entry 1 (KV-GROUP-PARTITION): strict 1 must be"),
            (ENTRY + "color = 'x'\n", "unknown field 'color'"),
            (ENTRY + "[expected.when]\nscenario = 'nowhere'\n", "when.scenario 'nowhere'"),
            (ENTRY + "[expected.when]\nupstream = 'nope'\n", "when.upstream 'nope'"),
            (ENTRY + "[expected.when]\ngpu = 'x'\n", "unknown condition when.gpu"),
            (ENTRY + "[expected.when]\ndevice = []\n", "when.device [] must be"),
            (ENTRY.replace('"drops a layer"', '""'), "reason '' must be a non-empty"),
            (ENTRY.replace('link = "x#1"\n', ""), "link None must be"),
            (ENTRY.replace("KV-GROUP-PARTITION", "partition"), "id 'partition' is not"),
            (ENTRY.replace('"drops a layer"', f'"{PLACEHOLDER_REASON}"'), "is a placeholder"),
            ("[[expected]\n", "not valid TOML"),
        ],
    )
    def test_bad_entries(self, tmp_path: Path, body: str, needle: str) -> None:
        with pytest.raises(ExpectationsError, match=None) as caught:
            load_manifest(_manifest(tmp_path, body))
        assert needle in str(caught.value), str(caught.value)

    def test_bad_format(self, tmp_path: Path) -> None:
        path = tmp_path / "e.toml"
        path.write_text('format = "other/2"\n')
        with pytest.raises(ExpectationsError, match="format 'other/2' must be"):
            load_manifest(path)

    def test_unknown_id_is_a_warning(self, tmp_path: Path) -> None:
        body = ENTRY.replace("KV-GROUP-PARTITION", "KV-NO-SUCH")
        manifest = load_manifest(_manifest(tmp_path, body))
        report = apply_expectations(_report(_result("KV-GROUP-PARTITION", "pass")), [manifest])
        assert any("'KV-NO-SUCH' matches no invariant" in w for w in report.warnings)

    def test_writer_round_trips(self) -> None:
        entries = [
            {"id": "KV-A", "reason": 'quote " back \\ nl \n tab \t bell \x07', "link": "l",
             "strict": True, "when": {"device": ["cuda", "npu"]}},
        ]  # fmt: skip
        data = tomllib.loads(dump_manifest(FORMAT, entries))
        assert data == {"format": FORMAT, "expected": entries}


class TestMatching:
    """Failures become XFAIL; a held invariant XPASS; strict XPASS fails the run."""

    def test_fail_becomes_xfail_and_pass_xpass(self, tmp_path: Path) -> None:
        body = ENTRY + ENTRY.replace("PARTITION", "NONEMPTY") + "strict = true\n"
        manifest = load_manifest(_manifest(tmp_path, body))
        report = apply_expectations(
            _report(_result("KV-GROUP-PARTITION", "fail"), _result("KV-GROUP-NONEMPTY", "pass")),
            [manifest],
        )
        partition, nonempty = report.results
        assert partition.status == "xfail" and partition.expectation is not None
        assert partition.expectation["reason"] == "drops a layer"
        assert nonempty.status == "xpass" and nonempty.strict_xpass
        assert not report.ok and report.failing_ids == {"KV-GROUP-NONEMPTY"}
        assert any("entry 2 (KV-GROUP-NONEMPTY): it held" in w for w in report.warnings)

    def test_conditions(self, tmp_path: Path) -> None:
        body = ENTRY + '[expected.when]\ndevice = "cuda"\nscenario = ["grouping"]\n'
        manifest = load_manifest(_manifest(tmp_path, body))
        failing = _result("KV-GROUP-PARTITION", "fail", scenario="grouping")
        on_cpu = apply_expectations(_report(failing), [manifest])
        assert on_cpu.results[0].status == "fail" and not on_cpu.warnings  # does not apply
        on_gpu = apply_expectations(_report(failing, device="cuda:1"), [manifest])
        assert on_gpu.results[0].status == "xfail"
        other = attrs.evolve(failing, scenario="core")
        unmatched = apply_expectations(_report(other, device="cuda"), [manifest])
        assert unmatched.results[0].status == "fail"
        assert any("matched no failure" in w for w in unmatched.warnings)

    def test_update_adds_placeholders_and_marks_passes(self, tmp_path: Path) -> None:
        path = _manifest(tmp_path, ENTRY)
        report = _report(
            _result("KV-GROUP-PARTITION", "pass", examples=4), _result("KV-CORE-SLACK", "fail")
        )
        assert update_manifest(report, path) == 1
        entries = load_manifest(path, allow_placeholders=True).entries
        assert [e.id for e in entries] == ["KV-GROUP-PARTITION", "KV-CORE-SLACK"]
        assert entries[0].now_passes and "held on 4 examples" in entries[0].now_passes
        assert entries[1].reason == PLACEHOLDER_REASON
        with pytest.raises(ExpectationsError, match="placeholder"):
            load_manifest(path)  # the vendor must fill it in before it is used


class TestShippedManifest:
    """conformance/ci/expectations/vllm-X.toml: each release's documented defects."""

    @pytest.mark.parametrize("version", SUPPORTED, ids=str)
    def test_it_covers_exactly_the_releases_documented_defects(self, version: object) -> None:
        name = f"vllm-{version}"
        assert name in shipped_manifests()
        manifest = load_manifest(resolve_manifest(name))
        expected = {
            (d.key, inv)
            for d in DEFECTS
            if version in d.versions
            for inv in d.invariants_in(version)
        }
        found = {(e.when["upstream"][0], e.id) for e in manifest.entries}
        assert found == expected and expected
        assert all(e.when["vllm"] == (str(version),) and not e.strict for e in manifest.entries)

    def test_the_projection_defect_is_0_33_0s_alone(self) -> None:
        """vLLM 0.34.0's default placement walks layer_names: the 54711 projection is fixed."""
        keys = {str(v): {d.key for d in DEFECTS if v in d.versions} for v in SUPPORTED}
        assert keys == {
            "0.33.0": {"pp-empty-group-projection", "layer-outer-stride-alias"},
            "0.34.0": {"layer-outer-stride-alias"},
        }

    @pytest.mark.parametrize(
        ("contract", "statuses"),
        [("vLLM 0.33.0", ["xfail", "fail"]), ("vLLM 0.34.0", ["fail", "fail"])],
    )
    def test_only_named_upstream_failures_of_the_judged_release_match(
        self, contract: str, statuses: list[str]
    ) -> None:
        """An entry applies to the release the run judged, whatever vLLM is installed."""
        manifests = [load_manifest(resolve_manifest(f"vllm-{v}")) for v in SUPPORTED]
        defect = next(d for d in DEFECTS if d.key == "pp-empty-group-projection")
        named = _result("KV-CORE-WORKER-LAYERS", "fail", upstream=defect.describe())
        own = _result("KV-PLACE-NO-BLOCK-ALIAS", "fail")
        report = apply_expectations(_report(named, own, contract=contract), manifests)
        assert [r.status for r in report.results] == statuses

    def test_unknown_name(self) -> None:
        with pytest.raises(ExpectationsError, match=r"vllm-0\.33\.0"):
            resolve_manifest("vllm-9")
