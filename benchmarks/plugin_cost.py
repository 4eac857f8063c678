"""What the pytest plugin costs against the CLI for the same run (issue 20, item 2).

Side by side, in turns, one builder, one seed, no example database:

- ``cli``: ``kvref-conformance B`` (the reference cost);
- ``plugin``: ``pytest --pyargs conformance --kv-builder B`` (the session's
  items share one run);
- ``plugin-n2``: the same under ``pytest -n 2`` (each xdist worker makes one
  shard of the run and reports from both merged: conformance/plugin_xdist.py);
- ``per-item``: what the plugin did before the shared run, one
  ``check_builder(select=[id])`` per invariant through one isolated worker,
  each redoing the scenarios it shares with the others.

Turns go case by case, then again, so load on a shared machine hits every
case alike; quote the ratios to ``cli``, not the seconds.

Usage::

    python benchmarks/plugin_cost.py --max-examples 5
    python benchmarks/plugin_cost.py --case cli --case plugin        # the default profile
"""

from __future__ import annotations

import argparse
import os
import sys

from _timing import timed_run

_CASES = ("cli", "plugin", "plugin-n2", "per-item")

_PER_ITEM = """
import sys
from conformance import check_builder
from conformance.check.catalog import catalog
from conformance.harness.isolate import isolated

name, seed, examples = sys.argv[1], int(sys.argv[2]), sys.argv[3]
examples = None if examples == "-" else int(examples)
proxy = isolated(name, name)  # one worker for every item, as the plugin kept it
ok = True
for inv in catalog():
    report = check_builder(proxy, name=name, select=[inv.id], seed=seed,
                           max_examples=examples, reach=False)
    ok = ok and report.ok
sys.exit(0 if ok else 1)
"""


def _command(case: str, builder: str, seed: int, examples: int | None) -> list[str]:
    """The command line of ``case``."""
    if case == "cli":
        extra = [] if examples is None else ["--max-examples", str(examples)]
        return [sys.executable, "-m", "conformance.cli", builder, "--no-database",
                "--seed", str(seed), *extra]  # fmt: skip
    if case == "per-item":
        count = "-" if examples is None else str(examples)
        return [sys.executable, "-c", _PER_ITEM, builder, str(seed), count]
    extra = [] if examples is None else ["--kv-max-examples", str(examples)]
    workers = ["-n", "2"] if case == "plugin-n2" else ["-n", "0"]
    return [sys.executable, "-m", "pytest", "-q", *workers, "-p", "no:cacheprovider",
            "--pyargs", "conformance", "--kv-builder", builder, "--kv-seed", str(seed),
            *extra]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """Run every case in turns and print each one's ratio to the CLI."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--builder", default="kvref:ReferenceKVCacheConfigBuilder")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--max-examples", type=int, default=None)
    parser.add_argument("--case", action="append", choices=_CASES, default=None)
    args = parser.parse_args(argv)
    cases = args.case or list(_CASES)
    if "cli" not in cases:
        cases.insert(0, "cli")
    runs: dict[str, list[tuple[float, float, int]]] = {}
    for repeat in range(args.repeats):
        for case in cases:
            wall, cpu, code = timed_run(_command(case, args.builder, args.seed, args.max_examples))
            runs.setdefault(case, []).append((wall, cpu, code))
            print(
                f"run {repeat + 1} {case:10}: {wall:7.1f} s wall, {cpu:7.1f} s cpu, exit {code}",
                flush=True,
            )
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    cli_wall = sum(r[0] for r in runs["cli"])
    cli_cpu = sum(r[1] for r in runs["cli"])
    for case in cases:
        wall = sum(r[0] for r in runs[case]) / cli_wall
        cpu = sum(r[1] for r in runs[case]) / cli_cpu
        print(f"{case:10} / cli = {wall:5.2f}x wall, {cpu:5.2f}x cpu")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
