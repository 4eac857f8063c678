"""One timed run of a command, shared by the side-by-side benchmarks."""

from __future__ import annotations

import resource
import subprocess
import time


def timed_run(command: list[str]) -> tuple[float, float, int]:
    """Wall seconds, CPU seconds of the children (workers included), exit status."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False
    )
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return wall, cpu, done.returncode
