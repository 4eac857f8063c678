"""Reach: the kit says how much of the builder's own code its run executed."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from conformance.cli import main
from conformance.run.reach import builder_modules, format_ranges
from conformance.run.runner import check_builder
from kvref import FullAttentionSpec, ReferenceKVCacheConfigBuilder

pytest.importorskip("coverage")

FAST = ["--max-examples", "3", "--seed", "1", "--no-database", "--select", "KV-GROUP-PARTITION"]


class TestMeasure:
    """What the meter counts."""

    def test_ranges(self) -> None:
        """Missing lines print as compact ranges."""
        assert format_ranges([7, 1, 2, 3, 9, 10]) == "1-3, 7, 9-10"

    def test_builder_modules_are_its_package(self) -> None:
        """A builder in a package is measured over its package's modules."""
        from reach_pkg.kv import AcmeBuilder

        names = {p.name for p in builder_modules(AcmeBuilder)}
        assert names == {"__init__.py", "kv.py"}

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

        from conformance.run.reach import ReachMeter
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
        (kv,) = [m for m in meter.summary()["modules"] if m["path"].endswith("kv.py")]
        assert kv["unreached_functions"] == [] and kv["percent"] == 100.0


class TestWhereReachIsMeasured:
    """Isolated, reach is what ran as the builder: in its worker, not the kit's Core around it."""

    @staticmethod
    def _planning_lines(isolate: bool) -> int:
        report = check_builder(
            ReferenceKVCacheConfigBuilder,
            select=["KV-CORE-SAME-BLOCKS"],
            max_examples=4,
            seed=1,
            reach=True,
            database=None,
            isolate=isolate,
        )
        assert report.reach is not None
        (planning,) = [
            m for m in report.reach["modules"] if m["path"].endswith("kvref/planning.py")
        ]
        executed: int = planning["executed"]
        return executed

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
