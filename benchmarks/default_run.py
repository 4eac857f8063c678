"""Time the kit's default run against the reference, for several checkouts side by side.

Each checkout's ``conformance`` package runs as ``python -m conformance.cli
--no-database --seed S`` from that checkout (so its own code is imported),
in turns: checkout A, checkout B, ..., then again, so load changes on a
shared machine hit every checkout alike.  Wall time comes from the clock,
user and system time from the children's resource usage.

Usage::

    python benchmarks/default_run.py --checkout /tmp/old --checkout . --repeats 2
    python benchmarks/default_run.py --checkout . --extra=--no-reach

Every checkout must be importable by the running interpreter's environment
(the kit's dependencies installed); a checkout older than the one installed
is fine as long as it needs nothing newer.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from _timing import timed_parts


def _one(checkout: Path, seed: int, extra: list[str]) -> tuple[float, float, float, int]:
    return timed_parts(
        [sys.executable, "-m", "conformance.cli", "--no-database", "--seed", str(seed), *extra],
        cwd=checkout,
        env=dict(os.environ, PYTHONPATH=str(checkout)),
    )


def main(argv: list[str] | None = None) -> int:
    """Run the comparison and print one line per run and a summary per checkout."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkout", action="append", type=Path, required=True)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--extra", action="append", default=[], help="one more CLI argument")
    args = parser.parse_args(argv)
    for checkout in args.checkout:
        if not (checkout / "conformance" / "cli.py").is_file():
            parser.error(f"--checkout {checkout}: no conformance/cli.py there")
    results: dict[Path, list[tuple[float, float, float, int]]] = {c: [] for c in args.checkout}
    for repeat in range(args.repeats):
        for checkout in args.checkout:
            wall, user, system, code = _one(checkout.resolve(), args.seed, args.extra)
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
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
