"""One timed run of a command, shared by the side-by-side benchmarks."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
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


#: A fixed pure-Python loop: its CPU time says how fast this machine is right now.
_CALIBRATION = "s = 0\nfor i in range(20_000_000):\n    s += i\n"


def calibration_seconds() -> float:
    """CPU seconds of :data:`_CALIBRATION` in a fresh interpreter (the machine's speed now).

    Shared machines differ by 2x between days and drift within the hour.
    It is a rough gauge only: it does not follow a kit run or the suite
    across machines (docs/performance.md), so the figure to quote is still
    a ratio measured side by side.
    """
    _, user, system, _ = timed_parts([sys.executable, "-c", _CALIBRATION])
    return user + system


def in_turns(
    checkouts: Sequence[Path],
    repeats: int,
    command: list[str],
    pythonpath: Callable[[Path], str],
) -> None:
    """Run ``command`` in every checkout, in turns, ``repeats`` times, and print the figures.

    Each run has its checkout as working directory and ``pythonpath(root)``
    as ``PYTHONPATH`` (so that checkout's code is imported); turns go
    checkout A, B, ..., then again, so load on a shared machine hits every
    checkout alike.  Printed: one line per run, the load average at the
    end, and each checkout's wall and user+sys range; the calibration loop's
    time (:func:`calibration_seconds`) before the first turn and after the last.
    """
    print(f"calibration before: {calibration_seconds():.2f} s", flush=True)
    results: dict[Path, list[tuple[float, float, float, int]]] = {c: [] for c in checkouts}
    for repeat in range(repeats):
        for checkout in checkouts:
            root = checkout.resolve()
            env = dict(os.environ, PYTHONPATH=pythonpath(root))
            wall, user, system, code = timed_parts(command, cwd=root, env=env)
            results[checkout].append((wall, user, system, code))
            print(
                f"run {repeat + 1} {checkout}: {wall:.1f} s wall, {user:.1f} s user, "
                f"{system:.1f} s sys, exit {code}",
                flush=True,
            )
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    print(f"calibration after: {calibration_seconds():.2f} s")
    for checkout, runs in results.items():
        walls = sorted(r[0] for r in runs)
        cpu = sorted(r[1] + r[2] for r in runs)
        print(
            f"{checkout}: wall {walls[0]:.1f}-{walls[-1]:.1f} s, "
            f"user+sys {cpu[0]:.1f}-{cpu[-1]:.1f} s"
        )
