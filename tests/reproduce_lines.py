"""Running a printed reproduce line as a vendor would: a fresh process, this environment."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent

#: A result row of the text report: invariant id and status.
ROW = re.compile(r"^(KV-[A-Z0-9-]+)\s+(FAIL|PASS|INCONCLUSIVE|N/A|SKIP|XFAIL|XPASS)\b", re.M)


def env() -> dict[str, str]:
    """This environment, with tests/ importable (``broken_builders:X``) ahead of the rest."""
    path = [str(TESTS), *filter(None, [os.environ.get("PYTHONPATH")])]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(path))


def command(line: str) -> list[str]:
    """A printed reproduce line as argv, with this environment's kvref-conformance."""
    words = shlex.split(line)
    assert words[0] == "kvref-conformance", line
    script = Path(sys.executable).with_name("kvref-conformance")
    argv = [str(script)] if script.exists() else [sys.executable, "-m", "conformance.cli"]
    return argv + words[1:]


def run_line(line: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run a printed reproduce line as a shell would."""
    return subprocess.run(
        command(line), check=False, cwd=cwd, env=env(), capture_output=True, text=True, timeout=600
    )
