"""``merge`` and ``verify`` start light: their help imports neither torch nor Hypothesis."""

from __future__ import annotations

import subprocess
import sys

import pytest

PROBE = """
import sys
from conformance.cli import main
try:
    main([{command!r}, "--help"])
except SystemExit:
    pass
heavy = sorted(m for m in ("torch", "hypothesis", "vllm") if m in sys.modules)
print("heavy:", ",".join(heavy))
"""


@pytest.mark.parametrize("command", ["merge", "verify"])
def test_the_help_of_a_report_command_imports_nothing_heavy(command: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(command=command)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.strip().endswith("heavy:"), done.stdout
    assert "usage: kvref-conformance" in done.stdout
