"""One timed run of a command, shared by the side-by-side benchmarks."""

from __future__ import annotations

import resource
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path


def timed_run(
    command: list[str], *, cwd: Path | None = None, env: Mapping[str, str] | None = None
) -> tuple[float, float, int]:
    """Wall seconds, CPU seconds of the children (workers included), exit status."""
    wall, user, system, status = timed_parts(command, cwd=cwd, env=env)
    return wall, user + system, status


def timed_parts(
    command: list[str], *, cwd: Path | None = None, env: Mapping[str, str] | None = None
) -> tuple[float, float, float, int]:
    """Wall, user and system seconds of the children (workers included), exit status."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(
        command,
        cwd=cwd,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=False,
    )
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    user = after.ru_utime - before.ru_utime
    return wall, user, after.ru_stime - before.ru_stime, done.returncode
