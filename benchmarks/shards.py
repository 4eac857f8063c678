"""The cost of sharding: one whole run against its N shards, side by side.

Each run is ``python -m conformance.cli --no-database --focus off --seed S``
(``--shard I/N`` for the shards) in its own process, as on the machines of a
CI matrix; the whole run and the shards alternate over the repeats, so load
on a shared machine hits both alike.  Reported per repeat: the whole run's
wall and CPU (user+sys) seconds, the shards' summed CPU and their longest
wall time (what a matrix of N machines waits for), and the overhead ratio
(shards' CPU over the whole run's: each shard pays the kit's start-up and
imports again).

Usage::

    python benchmarks/shards.py --shards 3 --repeats 2
    python benchmarks/shards.py --extra=--max-examples --extra=100
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from _timing import timed_run

ROOT = Path(__file__).resolve().parents[1]


def _one(seed: int, extra: list[str]) -> tuple[float, float]:
    argv = [sys.executable, "-m", "conformance.cli", "--no-database", "--focus", "off"]
    wall, cpu, _ = timed_run(
        [*argv, "--seed", str(seed), *extra],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    return wall, cpu


def main(argv: list[str] | None = None) -> int:
    """Print one line per repeat: the whole run, the shards, and the overhead."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--extra", action="append", default=[], help="one more CLI argument")
    args = parser.parse_args(argv)
    for repeat in range(1, args.repeats + 1):
        wall, cpu = _one(args.seed, args.extra)
        parts = [
            _one(args.seed, [*args.extra, "--shard", f"{i}/{args.shards}"])
            for i in range(1, args.shards + 1)
        ]
        shard_cpu = sum(c for _, c in parts)
        longest = max(w for w, _ in parts)
        print(
            f"repeat {repeat}: whole {wall:.1f} s wall {cpu:.1f} s CPU; "
            f"{args.shards} shards {shard_cpu:.1f} s CPU in all, longest {longest:.1f} s wall; "
            f"CPU overhead {shard_cpu / cpu:.2f}x, wall speed-up {wall / longest:.2f}x",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
