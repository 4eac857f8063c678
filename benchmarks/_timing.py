"""One timed run of a command, shared by the side-by-side benchmarks."""

from __future__ import annotations

import os
import resource
import subprocess
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
    end, and each checkout's wall and user+sys range.
    """
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
    for checkout, runs in results.items():
        walls = sorted(r[0] for r in runs)
        cpu = sorted(r[1] + r[2] for r in runs)
        print(
            f"{checkout}: wall {walls[0]:.1f}-{walls[-1]:.1f} s, "
            f"user+sys {cpu[0]:.1f}-{cpu[-1]:.1f} s"
        )
