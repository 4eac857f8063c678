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
import sys
from pathlib import Path

from _timing import in_turns


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
    command = [sys.executable, "-m", "conformance.cli", "--no-database", "--seed", str(args.seed)]
    in_turns(args.checkout, args.repeats, [*command, *args.extra], str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
