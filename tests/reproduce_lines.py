"""Running a printed reproduce line as a vendor would: a fresh process, this environment."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

from subprocesses import kit_command, kit_env, run_captured

#: A result row of the text report: invariant id and status.
ROW = re.compile(r"^(KV-[A-Z0-9-]+)\s+(FAIL|PASS|INCONCLUSIVE|N/A|SKIP|XFAIL|XPASS)\b", re.M)


def command(line: str) -> list[str]:
    """A printed reproduce line as argv, with this environment's kvref-conformance."""
    words = shlex.split(line)
    assert words[0] == "kvref-conformance", line
    return kit_command() + words[1:]


def run_line(line: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run a printed reproduce line as a shell would."""
    return run_captured(command(line), cwd=cwd, env=kit_env(), timeout=600)
