"""The kvref-conformance CLI and the pytest plugin."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from conformance.cli import main

FAST = ["--max-examples", "3", "--seed", "1"]


class TestExitStatus:
    """0 when everything holds, 1 when something fails, 2 for usage errors."""

    def test_reference_passes(self, capsys: pytest.CaptureFixture[str]) -> None:
        """The reference builder exits 0 and prints the table and its seed."""
        assert main([*FAST, "--select", "KV-GROUP"]) == 0
        out = capsys.readouterr().out
        assert "KV-GROUP-PARTITION" in out and "seed 1" in out and out.rstrip().endswith("OK")

    def test_broken_builder_fails(self, capsys: pytest.CaptureFixture[str]) -> None:
        """A broken builder exits 1 and prints the counterexample and a reproduce command."""
        code = main(
            [
                "broken_builders:DroppedLayer",
                "--max-examples",
                "10",
                "--seed",
                "1",
                "--select",
                "KV-GROUP-PARTITION",
            ]
        )
        out = capsys.readouterr().out
        assert code == 1
        assert (
            "minimal counterexample" in out
            and "reproduce: kvref-conformance broken_builders:DroppedLayer" in out
        )

    @pytest.mark.parametrize(
        ("args", "message"),
        [
            (["no_such_module:Builder"], "cannot import module"),
            (["kvref:PlanningConfig"], "not a kvref.KVCacheConfigBuilder"),
            (["kvref:KVCacheConfigBuilder"], "abstract"),
            (["--select", "KV-NOPE"], "matches no invariant"),
            (["--max-examples", "0"], "--max-examples"),
            (["--device", "nodevice"], "--device"),
            (["--profile", "forever"], ""),
        ],
    )
    def test_usage_errors(
        self, args: list[str], message: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """Usage errors exit 2 with a clear message and no traceback."""
        assert main(args) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err

    def test_list(self, capsys: pytest.CaptureFixture[str]) -> None:
        """--list prints every invariant id."""
        assert main(["--list"]) == 0
        assert "KV-PLACE-NO-BLOCK-ALIAS" in capsys.readouterr().out


class TestOutputs:
    """JSON, JUnit and xfail files."""

    def test_json_and_junit(self, tmp_path: Path) -> None:
        """--json and --junit write one entry per invariant."""
        j, x = tmp_path / "r.json", tmp_path / "r.xml"
        assert (
            main(
                [
                    *FAST,
                    "--select",
                    "KV-PLACE-NUM-BLOCKS,KV-CORE",
                    "--json",
                    str(j),
                    "--junit",
                    str(x),
                ]
            )
            == 0
        )
        data = json.loads(j.read_text())
        assert data["ok"] is True and {r["id"] for r in data["results"]} >= {
            "KV-PLACE-NUM-BLOCKS",
            "KV-CORE-SLACK",
        }
        root = ET.parse(x).getroot()
        suite = root.find("testsuite")
        assert root.tag == "testsuites" and suite is not None
        assert len(suite.findall("testcase")) == len(data["results"])

    def test_xfail_file(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """An xfailed failure exits 0 as XFAIL; an unknown id warns; a passing xfail is XPASS."""
        xfail = tmp_path / "xfail.txt"
        xfail.write_text(
            "# known issues\nKV-GROUP-PARTITION  # dropped layer\nKV-GROUP-NONEMPTY\nKV-TYPO\n"
        )
        code = main(
            [
                "broken_builders:DroppedLayer",
                "--max-examples",
                "10",
                "--seed",
                "1",
                "--select",
                "KV-GROUP-PARTITION,KV-GROUP-NONEMPTY",
                "--xfail-file",
                str(xfail),
            ]
        )
        captured = capsys.readouterr()
        assert code == 0
        assert "XFAIL" in captured.out and "XPASS" in captured.out
        assert "KV-TYPO" in captured.err

    def test_unsupported_capability(self, capsys: pytest.CaptureFixture[str]) -> None:
        """--unsupported host_resident skips the host invariants and says why."""
        assert main([*FAST, "--select", "KV-HOST", "--unsupported", "host_resident"]) == 0
        out = capsys.readouterr().out
        assert "SKIP" in out and "host_resident" in out


class TestDatabase:
    """Counterexamples are saved to, and replayed from, the example database."""

    def test_saved_and_replayed(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """A failing run saves its counterexample; a run with another seed replays it."""
        db = tmp_path / "db"
        args = ["broken_builders:OverlappingLayers", "--select", "KV-PLACE-NO-LAYER-OVERLAP"]
        assert main([*args, "--max-examples", "25", "--seed", "3", "--database", str(db)]) == 1
        assert any(p.is_file() for p in db.rglob("*"))
        assert main([*args, "--max-examples", "1", "--seed", "4", "--no-database"]) == 0
        assert main([*args, "--max-examples", "1", "--seed", "4", "--database", str(db)]) == 1
        capsys.readouterr()


class TestPlugin:
    """The pytest plugin: one item per invariant, a header naming the builder."""

    def test_items_and_header(self, pytester: pytest.Pytester) -> None:
        """--pyargs conformance collects one item per invariant and prints the header."""
        result = pytester.runpytest_subprocess(
            "--pyargs",
            "conformance",
            "--kv-builder",
            "kvref:ReferenceKVCacheConfigBuilder",
            "--kv-max-examples",
            "2",
            "--kv-seed",
            "1",
            "-k",
            "KV-GROUP-PARTITION or KV-PLACE-NUM-BLOCKS",
            "-p",
            "no:cacheprovider",
        )
        result.stdout.fnmatch_lines(
            ["*kvref-conformance: builder=kvref:ReferenceKVCacheConfigBuilder*"]
        )
        result.assert_outcomes(passed=2)


class TestDocs:
    """The generated catalog page is up to date."""

    def test_invariants_page_current(self) -> None:
        """docs/invariants.md equals what docs/gen_invariants.py renders from the code."""
        import importlib.util

        root = Path(__file__).resolve().parents[1]
        spec = importlib.util.spec_from_file_location("gen", root / "docs" / "gen_invariants.py")
        assert spec is not None and spec.loader is not None
        gen = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(gen)
        assert (root / "docs" / "invariants.md").read_text() == gen.render()
