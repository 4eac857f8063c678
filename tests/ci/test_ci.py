"""CI around a run: Markdown summary, baseline, flakes, the CLI's new options."""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import pytest
from kit_runs import plugin_args

from conformance import check_builder
from conformance.ci.baseline import BaselineError, compare, load_baseline
from conformance.ci.markdown import format_markdown
from conformance.cli import main
from conformance.report.render import report_to_dict

BROKEN = ["broken_builders:DroppedLayer", "--max-examples", "5", "--seed", "1", "--no-database"]
SELECT = ["--select", "KV-GROUP-PARTITION,KV-GROUP-NONEMPTY", "--no-reach"]


@pytest.fixture(scope="module")
def broken_report():  # type: ignore[no-untyped-def]
    from broken_builders import DroppedLayer

    return check_builder(
        DroppedLayer,
        max_examples=5,
        seed=1,
        select=["KV-GROUP-PARTITION", "KV-GROUP-NONEMPTY"],
        name="broken_builders:DroppedLayer",
    )


class TestMarkdown:
    def test_summary(self, broken_report) -> None:  # type: ignore[no-untyped-def]
        """Verdict table, the failure's counterexample and reproduce line, reach, replays."""
        text = format_markdown(broken_report)
        assert text.startswith("## kvref-conformance: FAILED")
        assert "| KV-GROUP-PARTITION | FAIL | " in text and "| KV-GROUP-NONEMPTY | PASS |" in text
        assert "#### FAIL KV-GROUP-PARTITION" in text and "layer is in no group" in text
        assert "```python\nfrom kvref" in text and "num_blocks = " in text
        result = broken_report.result("KV-GROUP-PARTITION")
        assert f"```bash\n{result.reproduce}\n```" in text
        assert "failed 2: **deterministic**" in text
        assert "### Reach" in text

    def test_upstream_names(self, broken_report) -> None:  # type: ignore[no-untyped-def]
        import attrs

        from conformance.upstream import DEFECTS

        result = attrs.evolve(
            broken_report.result("KV-GROUP-PARTITION"), upstream=DEFECTS[0].describe()
        )
        text = format_markdown(attrs.evolve(broken_report, results=(result,)))
        assert "### Upstream vLLM defects" in text
        assert f"`{DEFECTS[0].key}` (vLLM issue 54711): KV-GROUP-PARTITION" in text


class TestFlakes:
    def test_a_deterministic_failure(self, broken_report) -> None:  # type: ignore[no-untyped-def]
        replays = broken_report.result("KV-GROUP-PARTITION").replays
        assert replays is not None and (replays.runs, replays.failed) == (2, 2)
        assert replays.verdict == "deterministic"
        assert broken_report.result("KV-GROUP-NONEMPTY").replays is None

    def test_a_flaky_judgement(self) -> None:
        from conformance.extensions.flakes.replay import replay_failure

        outcomes = iter([["broke"], []])
        replays = replay_failure(lambda: next(outcomes), 2, callable_again=True)
        assert (replays.failed, replays.verdict) == (1, "flaky")
        hung = replay_failure(lambda: pytest.fail("called"), 2, callable_again=False)
        assert hung.verdict == "not-replayed"


class TestBaseline:
    def test_compare(self, broken_report, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
        path = tmp_path / "base.json"
        data = report_to_dict(broken_report)
        path.write_text(json.dumps(data, default=str))
        same = compare(broken_report, load_baseline(path))
        assert same.baseline == {
            "path": str(path), "new": [], "fixed": [], "unchanged": ["KV-GROUP-PARTITION"],
            "expected": [],
        }  # fmt: skip
        failed = next(r for r in data["results"] if r["id"] == "KV-GROUP-PARTITION")
        for r in data["results"]:
            if r["id"] == "KV-GROUP-NONEMPTY":
                # A real failure carries its counterexample (load_baseline refuses one without).
                r.update(status="fail", counterexample=failed["counterexample"])
            else:
                r["status"] = "pass"
        path.write_text(json.dumps(data, default=str))
        moved = compare(broken_report, load_baseline(path))
        assert moved.baseline is not None
        assert (moved.baseline["new"], moved.baseline["fixed"]) == (
            ["KV-GROUP-PARTITION"],
            ["KV-GROUP-NONEMPTY"],
        )

    def test_a_failure_excused_by_an_expectation_is_not_fixed(
        self, broken_report, tmp_path: Path
    ) -> None:  # type: ignore[no-untyped-def]
        """Baseline without expectations, run with them: the XFAIL still fails (not 'fixed')."""
        path = tmp_path / "base.json"
        path.write_text(json.dumps(report_to_dict(broken_report), default=str))
        excused = attrs.evolve(
            broken_report,
            results=tuple(
                attrs.evolve(r, status="xfail") if r.id == "KV-GROUP-PARTITION" else r
                for r in broken_report.results
            ),
        )
        compared = compare(excused, load_baseline(path))
        assert compared.baseline is not None
        assert compared.baseline["fixed"] == []
        assert compared.baseline["expected"] == ["KV-GROUP-PARTITION"]

    def test_a_hand_made_all_fail_baseline_is_refused(self, broken_report, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
        """A file calling every invariant failing would excuse any bug: it is no run's report."""
        data = report_to_dict(broken_report)
        for r in data["results"]:
            r["status"] = "fail"
        path = tmp_path / "all-fail.json"
        path.write_text(json.dumps(data, default=str))
        with pytest.raises(BaselineError, match="fails without the counterexample"):
            load_baseline(path)

    @pytest.mark.parametrize(
        ("text", "needle"),
        [
            ("{", "is not JSON"),
            ('{"schema_version": 1, "complete": false, "results": []}', "complete False"),
            ('{"schema_version": 1, "complete": true, "results": [{"id": "KV-A"}]}', "status None"),
        ],
    )
    def test_bad_baseline(self, tmp_path: Path, text: str, needle: str) -> None:
        path = tmp_path / "b.json"
        path.write_text(text)
        with pytest.raises(BaselineError, match=None) as caught:
            load_baseline(path)
        assert needle in str(caught.value)


class TestCli:
    def test_ci_workflow(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """Update the manifest, fill it in, use it; the baseline passes unchanged failures."""
        monkeypatch.chdir(tmp_path)
        step = tmp_path / "step.md"
        step.write_text("earlier step\n")
        monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step))
        exp, base = tmp_path / "exp.toml", tmp_path / "base.json"
        args = [*BROKEN, *SELECT]
        assert main([*args, "--update-expectations", str(exp), "--json", str(base)]) == 1
        assert step.read_text().startswith("earlier step\n## kvref-conformance: FAILED")
        assert main([*args, "--expectations", str(exp)]) == 2  # TODO placeholders refused
        assert "reason 'TODO" in capsys.readouterr().err
        exp.write_text(
            exp.read_text()
            .replace('reason = "TODO', 'reason = "drops a layer; was: TODO')
            .replace('link = "TODO', 'link = "https://example.invalid/1 was: TODO')
        )
        assert main([*args, "--expectations", str(exp), "--markdown", "s.md"]) == 0
        assert "| KV-GROUP-PARTITION | XFAIL |" in (tmp_path / "s.md").read_text()
        capsys.readouterr()
        assert main([*args, "--baseline", str(base)]) == 0
        assert "unchanged: KV-GROUP-PARTITION" in capsys.readouterr().out

    @pytest.mark.parametrize(
        ("extra", "needle"),
        [
            (["--replays", "-1"], "--replays -1 must be a non-negative int"),
            (["--expectations", "nope"], "--expectations: expectations 'nope' is neither"),
            (["--baseline", "missing.json"], "--baseline 'missing.json' cannot be read"),
            (["--markdown", "no/dir/s.md"], "--markdown 'no/dir/s.md': the directory"),
        ],
    )
    def test_bad_inputs_exit_2_before_any_example(
        self,
        tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str],
        extra: list[str],
        needle: str,
    ) -> None:
        monkeypatch.chdir(tmp_path)
        monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
        assert main([*BROKEN, *SELECT, *extra]) == 2
        captured = capsys.readouterr()
        assert needle in captured.err and "examples" not in captured.err


@pytest.mark.slow
class TestPluginExpectations:
    def test_kv_expectations(
        self, pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """--kv-expectations turns the expected failure into an xfail; a strict XPASS fails."""
        tests = Path(__file__).resolve().parents[1]
        pytester.makefile(
            ".toml",
            exp=(
                'format = "kvref-expectations/1"\n'
                '[[expected]]\nid = "KV-GROUP-PARTITION"\nreason = "drops a layer"\n'
                'link = "x#1"\n'
                '[[expected]]\nid = "KV-GROUP-NONEMPTY"\nreason = "r"\nlink = "l"\n'
                "strict = true\n"
            ),
        )
        monkeypatch.setenv("PYTHONPATH", str(tests))
        result = pytester.runpytest_subprocess(
            *plugin_args("broken_builders:DroppedLayer", examples=3, seed=1),
            *("--kv-expectations", "exp.toml", "-k", "KV-GROUP-PARTITION or KV-GROUP-NONEMPTY"),
        )
        result.assert_outcomes(xfailed=1, failed=1)
        result.stdout.fnmatch_lines(["*KV-GROUP-NONEMPTY held, yet a strict expectation*"])

    def test_bad_manifest_is_one_usage_error(self, pytester: pytest.Pytester) -> None:
        pytester.makefile(".toml", exp='format = "kvref-expectations/1"\n[[expected]]\nid = 3\n')
        result = pytester.runpytest_subprocess(
            "--pyargs", "conformance", "--kv-builder", "kvref:ReferenceKVCacheConfigBuilder",
            "--kv-expectations", "exp.toml", "-p", "no:cacheprovider",
        )  # fmt: skip
        assert result.ret == pytest.ExitCode.USAGE_ERROR
        assert any("entry 1: id 3 must be a non-empty string" in line for line in result.errlines)


class TestPostProcessors:
    """The CI's post-processors, one list: the xfail file is a manifest; every file is tried."""

    def test_the_xfail_file_is_a_manifest(self, broken_report, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
        from conformance.ci.processors import finish, prepare
        from conformance.run.tally import expected_status

        path = tmp_path / "xfail.txt"
        path.write_text("KV-GROUP-PARTITION  # dropped layer\nkv-group-nonempty\n")
        inputs = prepare(xfail_file=path)
        assert [e.id for e in inputs.manifests[0].entries] == [
            "KV-GROUP-PARTITION",
            "KV-GROUP-NONEMPTY",
        ]
        report = finish(broken_report, inputs)
        for before, after in zip(broken_report.results, report.results, strict=True):
            # What the run's own xfail ids gave: a failure XFAIL, a pass XPASS.
            assert after.status == expected_status(before.status, True)
            assert str(path) in after.expectation["reason"]
        assert [r.status for r in report.results] == ["xfail", "xpass"]
        assert any("KV-GROUP-NONEMPTY" in w and "can go" in w for w in report.warnings)

    def test_an_unreadable_xfail_file_names_its_flag(self, tmp_path: Path) -> None:
        from conformance.ci.processors import CiError, prepare

        path = tmp_path / "xfail.txt"
        path.write_bytes(b"KV-GROUP-PARTITION\n\x00")
        with pytest.raises(CiError, match=r"^--kv-xfail-file: xfail file .* is binary"):
            prepare(xfail_file=path, prefix="--kv-")

    def test_every_file_is_tried(self, broken_report, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
        from conformance.ci.processors import POST_PROCESSORS, prepare, write_outputs

        assert [p.name for p in POST_PROCESSORS][:3] == ["expectations", "baseline", "certify"]
        inputs = prepare(
            json=tmp_path / "gone" / "r.json",
            junit=tmp_path / "r.xml",
            summaries=[tmp_path / "s.md"],
            html=tmp_path / "r.html",
        )
        errors = write_outputs(broken_report, inputs)
        assert len(errors) == 1 and errors[0].startswith("--json ")
        assert all((tmp_path / name).is_file() for name in ("r.xml", "s.md", "r.html"))
