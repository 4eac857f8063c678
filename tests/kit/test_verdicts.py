"""Verdict semantics, one rule on every front end.

PASS needs at least one example that judged the invariant; what no example
judged is INCONCLUSIVE and fails the run (exit 1, a failed pytest item);
what cannot apply on the device is NOT APPLICABLE and does not; XPASS is
reported and does not fail, in ``check_builder``, the CLI and the plugin.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from kit_runs import cli_args, plugin_args, quick_check
from verdict_builders import GroupingRaisesOnHiSparse, PlacementAlwaysRaises

from conformance import OptionError, check_builder
from conformance.check.catalog import catalog
from conformance.cli import main
from kvref import ReferenceKVCacheConfigBuilder

# Whole kit runs: too costly for every CI submission (tox -e slow, pytest -m slow).
pytestmark = pytest.mark.slow

TESTS = Path(__file__).resolve().parents[1]
FAST = {"max_examples": 3, "seed": 1}
# Placement invariants that need a returned config: none can be judged when placement raises.
NEEDS_A_CONFIG = (
    "KV-PLACE-NUM-BLOCKS",
    "KV-PLACE-GROUPS-ECHOED",
    "KV-PLACE-LAYER-MISSING",
    "KV-PLACE-BACKING-SIZE",
    "KV-PLACE-IN-BOUNDS",
    "KV-PLACE-NO-BLOCK-ALIAS",
    "KV-PLACE-NO-LAYER-OVERLAP",
    "KV-PLACE-TYPED-VIEWS",
    "KV-PLACE-DETERMINISTIC",
)
#: A HiSparse invariant: what a builder that raises on HiSparse models leaves unjudged.
ROLES = "KV-GROUP-HISPARSE-ROLES"


class TestNothingCheckedIsNotOk:
    """'says OK when nothing was checked': a builder whose placement always raises."""

    def test_check_builder_reports_inconclusive(self) -> None:
        report = check_builder(PlacementAlwaysRaises, select=["KV-PLACE"], **FAST)
        assert not report.ok
        for invariant in NEEDS_A_CONFIG:
            result = report.result(invariant)
            assert result.status == "inconclusive", (invariant, result)
            assert result.examples == 0 and result.reason
        assert set(NEEDS_A_CONFIG) <= report.failing_ids

    def test_cli_exits_1_with_inconclusive_rows(self, capsys: pytest.CaptureFixture[str]) -> None:
        code = main(
            ["verdict_builders:PlacementAlwaysRaises", *cli_args("KV-PLACE", examples=3, seed=1)]
        )
        out = capsys.readouterr().out
        assert code == 1
        row = next(line for line in out.splitlines() if line.startswith("KV-PLACE-NUM-BLOCKS "))
        assert "INCONCLUSIVE" in row
        assert "Not judged:" in out and out.rstrip().splitlines()[-1].startswith("FAILED:")
        assert "\nOK" not in out

    def test_plugin_fails_the_items(
        self, pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv("PYTHONPATH", str(TESTS))
        result = pytester.runpytest_subprocess(
            *plugin_args("verdict_builders:PlacementAlwaysRaises", examples=2, seed=1),
            *("-k", "KV-PLACE-NUM-BLOCKS or KV-PLACE-IN-BOUNDS"),
        )
        result.assert_outcomes(failed=2)
        assert result.ret == pytest.ExitCode.TESTS_FAILED
        result.stdout.fnmatch_lines(["*KV-PLACE-NUM-BLOCKS*INCONCLUSIVE*"])


class TestPassNeedsAJudgedExample:
    """'some invariants report PASS when every example was inconclusive'."""

    @pytest.mark.parametrize("builder", [PlacementAlwaysRaises, ReferenceKVCacheConfigBuilder])
    def test_every_pass_was_judged(self, builder: type[ReferenceKVCacheConfigBuilder]) -> None:
        report = check_builder(builder, select=["KV-PLACE", "KV-CORE", "KV-HOST"], **FAST)
        for result in report.results:
            if result.status in ("pass", "xpass"):
                assert result.examples >= 1, result
            if result.status == "inconclusive":
                assert result.examples == 0, result

    def test_reference_passes_what_it_judged(self) -> None:
        # The same rule does not turn a legal builder's verdicts into inconclusive ones.
        report = check_builder(
            ReferenceKVCacheConfigBuilder, select=["KV-PLACE-NUM-BLOCKS"], max_examples=10, seed=1
        )
        assert report.ok and report.result("KV-PLACE-NUM-BLOCKS").status == "pass"


class TestSelection:
    """'--select KV-CALL observes only grouping' and '--select \"\" runs nothing and prints OK'."""

    def test_call_invariants_see_placement_calls(self) -> None:
        report = check_builder(PlacementAlwaysRaises, select=["KV-CALL-RAISES"], **FAST)
        result = report.result("KV-CALL-RAISES")
        assert result.status == "fail"
        assert "get_kv_cache_config_from_groups" in " ".join(str(v) for v in result.violations)

    def test_call_invariants_run_every_scenario(self) -> None:
        # KV-CALL-* judge every scenario's calls; selecting one runs all of them.
        inv = next(i for i in catalog() if i.id == "KV-CALL-RAISES")
        report = check_builder(ReferenceKVCacheConfigBuilder, select=["KV-CALL-RAISES"], **FAST)
        assert len(inv.scenarios) >= 4
        # Three examples per scenario: more than nine judged means four scenarios or more ran.
        assert report.result("KV-CALL-RAISES").examples > 9

    @pytest.mark.parametrize("select", ["", ",", " , "])
    def test_empty_selection_is_a_usage_error(
        self, select: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        assert main(["--select", select, "--max-examples", "1"]) == 2
        captured = capsys.readouterr()
        assert "--select" in captured.err and "Traceback" not in captured.err
        assert captured.out == ""

    @pytest.mark.parametrize("select", [[], [""], ["  "]])
    def test_empty_selection_in_python(self, select: list[str]) -> None:
        with pytest.raises(OptionError, match="select"):
            check_builder(ReferenceKVCacheConfigBuilder, select=select, **FAST)


class TestNotApplicable:
    """What the device cannot measure is N/A with the device's reason, and does not fail."""

    def test_memory_counter_checks_on_cpu(self) -> None:
        report = check_builder(
            ReferenceKVCacheConfigBuilder, select=["KV-DEV"], device="cpu", **FAST
        )
        alloc = report.result("KV-DEV-ALLOC")
        assert alloc.status == "not-applicable"
        assert alloc.reason is not None and "cpu" in alloc.reason
        assert report.ok


class TestSpoiledIsInconclusive:
    """Examples the builder's own failed calls left unjudged make INCONCLUSIVE, not N/A."""

    def test_hisparse_invariants_the_builder_broke(self) -> None:
        """HiSparse invariants: N/A on the other examples, spoiled on HiSparse's: inconclusive."""
        report = quick_check(
            GroupingRaisesOnHiSparse, ROLES, "KV-CALL-RAISES", examples=20, seed=1, isolate=True
        )
        roles = report.result(ROLES)
        assert roles.status == "inconclusive", roles
        assert roles.reason is not None and "a call of the builder failed" in roles.reason
        assert report.result("KV-CALL-RAISES").status == "fail"

    def test_the_reference_keeps_its_verdicts(self) -> None:
        """The reference on the same examples: the HiSparse invariant is judged and passes."""
        report = quick_check(
            ReferenceKVCacheConfigBuilder, ROLES, examples=20, seed=1, isolate=True
        )
        assert report.result(ROLES).status == "pass"


class TestXpassPolicy:
    """'XPASS fails the plugin but passes the CLI': one policy, XPASS never fails a run."""

    def test_check_builder(self) -> None:
        report = check_builder(
            ReferenceKVCacheConfigBuilder,
            select=["KV-GROUP-PARTITION"],
            xfail=["KV-GROUP-PARTITION"],
            **FAST,
        )
        assert report.result("KV-GROUP-PARTITION").status == "xpass"
        assert report.ok

    def test_cli(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        xfail = tmp_path / "xfail.txt"
        xfail.write_text("KV-GROUP-PARTITION\n")
        code = main(
            [*cli_args("KV-GROUP-PARTITION", examples=3, seed=1), "--xfail-file", str(xfail)]
        )
        out = capsys.readouterr().out
        assert code == 0 and "XPASS" in out

    def test_plugin(
        self, pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        xfail = tmp_path / "xfail.txt"
        xfail.write_text("KV-GROUP-PARTITION\n")
        # A project that makes xfails strict must not turn the kit's XPASS into a failure.
        pytester.makeini("[pytest]\nxfail_strict = true\n")
        result = pytester.runpytest_subprocess(
            *plugin_args("kvref:ReferenceKVCacheConfigBuilder", examples=2, seed=1),
            *("--kv-xfail-file", str(xfail), "-k", "KV-GROUP-PARTITION"),
        )
        result.assert_outcomes(xpassed=1)
        assert result.ret == pytest.ExitCode.OK
