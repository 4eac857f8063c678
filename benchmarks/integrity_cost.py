"""What the integrity layers cost a default CLI run: on (as shipped) and off, side by side.

The layers measured are the ones stacked on process isolation: the guard
against code changed during the run (:mod:`conformance.harness.integrity`:
its import finder for the run, then kept to the end of the process) and the
check that a vLLM-native answer holds only vLLM's own parts
(:mod:`conformance.harness.answer_plainness`).  "Off" runs the same CLI with
those replaced by no-ops in the kit's process before it imports the CLI;
nothing else changes (the containment of the worker stays on: it is the
isolation itself, not a layer on it).  Runs alternate on, off, on, off...,
so load on a shared machine hits both alike; quote the ratio of the CPU sums.
CPU time is the children's user + system time (the worker's included).

Usage::

    python benchmarks/integrity_cost.py --repeats 3
    python benchmarks/integrity_cost.py --builder kvref.interop.vllm_builder:KvrefVllmBuilder
"""

from __future__ import annotations

import argparse
import os
import sys

from _timing import timed_parts

#: Run in the child before the CLI is imported: the layers become no-ops.
_OFF = (
    "import contextlib\n"
    "import conformance.harness.integrity as integrity\n"
    "import conformance.harness.answer_plainness as answer_plainness\n"
    "integrity.guarded = lambda since: contextlib.nullcontext()\n"
    "integrity.keep_guarding = lambda: None\n"
    "answer_plainness.odd_part = lambda answer: None\n"
)


def _command(on: bool, builder: str, seed: int, examples: int | None) -> list[str]:
    """The default CLI run of ``builder``, with the integrity layers ``on`` or off."""
    words = [builder, "--no-database", "--seed", str(seed)]
    if examples is not None:
        words += ["--max-examples", str(examples)]
    script = (
        ("" if on else _OFF)
        + "import sys\n"
        + f"sys.argv = ['kvref-conformance', *{words!r}]\n"
        + "from conformance.cli import entry\n"
        + "entry()\n"
    )
    return [sys.executable, "-c", script]


def main(argv: list[str] | None = None) -> int:
    """Run the default CLI run with the layers on and off, in turns, and print the ratio."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--builder", default="kvref:ReferenceKVCacheConfigBuilder")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--max-examples", type=int, default=None)
    args = parser.parse_args(argv)
    runs: dict[bool, list[tuple[float, float, float, int]]] = {True: [], False: []}
    for repeat in range(args.repeats):
        for on in (True, False):
            wall, user, system, code = timed_parts(
                _command(on, args.builder, args.seed, args.max_examples)
            )
            runs[on].append((wall, user, system, code))
            print(
                f"run {repeat + 1} layers {'on ' if on else 'off'}: {wall:7.1f} s wall, "
                f"{user:7.1f} s user, {system:6.1f} s sys, exit {code}",
                flush=True,
            )
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    on_cpu = sum(r[1] + r[2] for r in runs[True])
    off_cpu = sum(r[1] + r[2] for r in runs[False])
    on_wall = sum(r[0] for r in runs[True])
    off_wall = sum(r[0] for r in runs[False])
    print(
        f"on / off = {on_cpu / off_cpu:.3f}x cpu ({on_cpu:.1f} s / {off_cpu:.1f} s), "
        f"{on_wall / off_wall:.3f}x wall"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
