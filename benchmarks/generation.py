"""CPU time of example generation alone: every scenario's first deal drawn, nothing judged.

Each checkout draws in its own process (its own code imported), in turns,
so load changes on a shared machine hit every checkout alike.  The figure is
the drawing process's CPU time around the draws (imports excluded).

Usage::

    python benchmarks/generation.py --checkout /tmp/old --checkout . --repeats 2
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

_DRAW = """
import sys, time
from conformance.run.strata import draw, run_strata
from conformance.scenarios import registry

strata = run_strata(None, only=False)
drawn = []
seed, examples = int(sys.argv[1]), int(sys.argv[2])
start = time.process_time()
for scenario in registry.names():
    draw(scenario, strata, examples, seed, "ci", lambda s, ex, f: drawn.append(ex))
print(len(drawn), time.process_time() - start)
"""


def _one(checkout: Path, seed: int, examples: int) -> tuple[int, float]:
    done = subprocess.run(
        [sys.executable, "-c", _DRAW, str(seed), str(examples)],
        cwd=checkout,
        env=dict(os.environ, PYTHONPATH=str(checkout)),
        capture_output=True,
        text=True,
        check=True,
    )
    count, seconds = done.stdout.split()
    return int(count), float(seconds)


def main(argv: list[str] | None = None) -> int:
    """Draw in every checkout, in turns, and print each run and a summary per checkout."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkout", action="append", type=Path, required=True)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--max-examples", type=int, default=50)
    args = parser.parse_args(argv)
    results: dict[Path, list[float]] = {c: [] for c in args.checkout}
    for repeat in range(args.repeats):
        for checkout in args.checkout:
            count, seconds = _one(checkout.resolve(), args.seed, args.max_examples)
            results[checkout].append(seconds)
            print(f"run {repeat + 1} {checkout}: {count} examples, {seconds:.2f} s CPU", flush=True)
    for checkout, runs in results.items():
        print(f"{checkout}: {min(runs):.2f}-{max(runs):.2f} s CPU")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
