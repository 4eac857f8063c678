"""Reach: the kit says how much of the builder's own code its run executed."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from kit_runs import quick_check

from conformance.cli import main
from conformance.extensions.reach.figures import format_ranges, summary
from conformance.harness.reach import builder_modules
from conformance.run.runner import check_builder
from kvref import FullAttentionSpec, ReferenceKVCacheConfigBuilder

# Whole kit runs: too costly for every CI submission (tox -e slow, pytest -m slow).
pytestmark = pytest.mark.slow

pytest.importorskip("coverage")

FAST = ["--max-examples", "3", "--seed", "1", "--no-database", "--select", "KV-GROUP-PARTITION"]


class TestMeasure:
    """What the meter counts."""

    def test_ranges(self) -> None:
        """Missing lines print as compact ranges."""
        assert format_ranges([7, 1, 2, 3, 9, 10]) == "1-3, 7, 9-10"

    def test_builder_modules_are_its_package(self) -> None:
        """A vendor builder is measured over its class's module and the package modules it imports.

        ``reach_pkg/__init__.py`` is imported by no module of the builder: not its code.
        """
        from reach_pkg.kv import AcmeBuilder

        names = {p.name for p in builder_modules(AcmeBuilder)}
        assert names == {"kv.py"}

    def test_gated_helper_module_counts_unentered(self) -> None:
        """A vendor's helper module the builder imports counts, at 0% when its gate stays shut.

        The parent class of the same package (``kv.py``) counts too; kvref, the
        platform it finally calls, does not.
        """
        from reach_pkg.gated import GatedBuilder

        assert {p.name for p in builder_modules(GatedBuilder)} == {"gated.py", "helper.py", "kv.py"}
        report = check_builder(
            GatedBuilder, select=["KV-GROUP-PARTITION"], max_examples=3, seed=1, reach=True
        )
        assert report.reach is not None
        modules = {Path(m["path"]).name: m for m in report.reach["modules"]}
        assert set(modules) == {"gated.py", "helper.py", "kv.py"}
        assert modules["helper.py"]["percent"] == 0
        assert modules["helper.py"]["unreached_functions"] == ["acme_page"]
        assert any("acme_page()" in line for line in report.reach["lines"])

    def test_platform_builder_is_its_class_and_callees(self) -> None:
        """kvref's reference: its class's module in full, other kvref modules where entered.

        No module the hooks never entered is listed (``kvref/__main__.py``,
        ``kvref/planning.py``: Core's flow runs outside the isolated worker's
        hooks), a callee counts only its entered functions, and no function
        is reported as never entered.  Isolated, as the CLI runs it.
        """
        report = check_builder(
            ReferenceKVCacheConfigBuilder, max_examples=5, seed=1, reach=True, isolate=True
        )
        assert report.reach is not None
        modules = report.reach["modules"]
        assert modules[0]["path"].endswith("kvref/builder.py") and modules[0]["role"] == "own"
        names = {Path(m["path"]).name for m in modules}
        assert {"grouping.py", "placement.py"} <= names
        assert not names & {"__main__.py", "planning.py", "profiling.py"}
        assert all(m["role"] == "callee" for m in modules[1:])
        assert all(m["unreached_functions"] == [] for m in modules)
        assert not any("WARNING" in line for line in report.reach["lines"])

    def test_unentered_specialisation_is_named(self) -> None:
        """A specialised path the generated models never enter is reported by name."""
        from reach_pkg.kv import AcmeBuilder

        report = check_builder(
            AcmeBuilder, select=["KV-GROUP-PARTITION"], max_examples=5, seed=1, reach=True
        )
        assert report.ok and report.reach is not None
        (kv,) = [m for m in report.reach["modules"] if m["path"].endswith("kv.py")]
        assert "AcmeBuilder._acme_groups" in kv["unreached_functions"]
        assert kv["percent"] < 100
        assert any(
            "never entered" in line and "_acme_groups" in line for line in report.reach["lines"]
        )

    def test_entered_specialisation_is_reached(self) -> None:
        """Called on the vendor's own shape, the specialised function counts as reached."""
        from reach_pkg.kv import AcmeBuilder

        from conformance.harness.reach import ReachMeter
        from kvref import PlanningConfig

        meter = ReachMeter.for_builder(AcmeBuilder)
        meter.start()
        try:
            import threading

            spec = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=64, dtype="bfloat16")
            specs = {"m.layers.0.attn": spec, "m.layers.1.acme_mixer.attn": spec}
            # Builders run in the guard's threads; the meter traces those.
            ordinary = {"m.layers.0.attn": spec}
            for model in (specs, ordinary):
                thread = threading.Thread(
                    target=AcmeBuilder().get_kv_cache_groups, args=(PlanningConfig(), model)
                )
                thread.start()
                thread.join()
        finally:
            meter.stop()
        (kv,) = [m for m in summary(meter)["modules"] if m["path"].endswith("kv.py")]
        assert kv["unreached_functions"] == [] and kv["percent"] == 100.0


class TestWhereReachIsMeasured:
    """Isolated, reach is what ran as the builder: in its worker, not the kit's Core around it."""

    @staticmethod
    def _planning_lines(isolate: bool) -> int:
        report = quick_check(
            ReferenceKVCacheConfigBuilder,
            "KV-CORE-SAME-BLOCKS",
            examples=4,
            seed=1,
            reach=True,
            isolate=isolate,
        )
        assert report.reach is not None
        planning = [m for m in report.reach["modules"] if m["path"].endswith("kvref/planning.py")]
        # A platform module is listed only where its functions ran as the builder.
        return sum(int(m["executed"]) for m in planning)

    def test_core_flow_is_not_the_builders_reach_when_isolated(self) -> None:
        """kvref's Core flow runs in the kit's process around the hooks: not counted isolated."""
        assert self._planning_lines(isolate=True) == 0

    def test_threads_that_call_the_builder_are_traced_in_process(self) -> None:
        """In process, the guard's threads run Core and the hooks together: both are counted."""
        assert self._planning_lines(isolate=False) > 0


class TestMinReach:
    """--min-reach fails the run below the threshold and not above it."""

    def test_below_fails(self, capsys: pytest.CaptureFixture[str]) -> None:
        """Asking for 100% of a builder whose specialisation was never entered exits 1."""
        assert main(["reach_pkg.kv:AcmeBuilder", *FAST, "--min-reach", "100"]) == 1
        out = capsys.readouterr().out
        assert "below --min-reach" in out and "FAILED" in out

    def test_above_passes(self, capsys: pytest.CaptureFixture[str]) -> None:
        """A threshold the run meets keeps exit 0."""
        assert main(["reach_pkg.kv:AcmeBuilder", *FAST, "--min-reach", "1"]) == 0
        assert "reached" in capsys.readouterr().out

    def test_bad_value_is_a_usage_error(self) -> None:
        """A percentage outside 0..100 is refused before the run."""
        assert main(["reach_pkg.kv:AcmeBuilder", *FAST, "--min-reach", "150"]) == 2


class TestReports:
    """The reach section appears in the table, the JSON and the JUnit file."""

    def test_json_and_junit(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """Both machine-readable reports carry the reach figures."""
        j, x = tmp_path / "r.json", tmp_path / "r.xml"
        code = main(["reach_pkg.kv:AcmeBuilder", *FAST, "--json", str(j), "--junit", str(x)])
        assert code == 0
        assert "reached" in capsys.readouterr().out
        data = json.loads(j.read_text())
        assert data["reach"]["percent"] > 0 and data["reach"]["modules"]
        text = ET.tostring(ET.parse(x).getroot(), encoding="unicode")
        assert "reached" in text and "kv.py" in text

    def test_reference_reach(self) -> None:
        """The default run's reach on kvref's own reference builder is measured."""
        report = check_builder(ReferenceKVCacheConfigBuilder, max_examples=5, seed=1, reach=True)
        assert report.reach is not None and 0 < report.reach["percent"] <= 100
