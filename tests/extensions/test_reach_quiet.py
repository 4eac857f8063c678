"""Reach read before the builder's own code ran: a figure of 0, never coverage.py's warning.

Reach is read after every scenario (the report's ``over_time``); a builder
whose grouping is inherited has run none of its own lines after the first.
coverage.py warns "No data was collected" then: in the kit's process a
warning in the middle of the run, in an isolated worker a line reported as
the builder's own output.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from kit_runs import quick_check

from conformance.report.model import Report

pytest.importorskip("coverage")

PLACEMENT_ONLY = "reach_pkg.placing:PlacementOnlyBuilder"


class TestNothingReachedYet:
    """A builder whose own code has not run is a reach of 0, not coverage.py's warning."""

    @staticmethod
    def _run(isolate: bool) -> Report:
        report = quick_check(
            PLACEMENT_ONLY, "KV-GROUP-PARTITION", examples=3, seed=1, reach=True, isolate=isolate
        )
        assert report.ok and report.reach is not None
        # Reach was read while nothing of the builder's own had run (its grouping is inherited).
        assert report.reach["over_time"][0]["lines"] == 0, report.reach["over_time"]
        return report

    def test_in_process(self) -> None:
        """Read after grouping, a placement-only builder has 0 lines, and no warning is raised."""
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            self._run(isolate=False)
        assert not [w for w in seen if "coverage" in type(w.message).__module__], seen

    def test_isolated(self, tmp_path: Path) -> None:
        """The worker's meter prints nothing: it would be reported as the builder's output."""
        # A fresh process: pytest records warnings around every test, and a worker
        # forked under that recorder would print nothing with or without the fix.
        out = tmp_path / "r.json"
        done = subprocess.run(
            [
                *(sys.executable, "-m", "conformance.cli", PLACEMENT_ONLY),
                *("--select", "KV-GROUP-PARTITION", "--max-examples", "3", "--seed", "1"),
                *("--no-database", "--isolate", "--json", str(out)),
            ],
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        data = json.loads(out.read_text())
        assert data["reach"]["over_time"][0]["lines"] == 0, data["reach"]["over_time"]
        assert "CoverageWarning" not in data["builder_output"] + done.stdout + done.stderr
