"""What isolating the builder costs on each front end: the CLI, ``check_builder``, the plugin.

Each front end runs the same check of one builder (its defaults, one seed,
no example database) twice per turn: isolated (every front end's default)
and in-process (``--no-isolate``, ``isolate=False``, ``--kv-no-isolate``).
Turns go front end by front end and mode by mode, then again, so load on a
shared machine hits every case alike; quote the ratios, not the seconds.
Wall time comes from the clock, user and system time from the children's
resource usage (the worker and the twin process included).

Usage::

    python benchmarks/isolation_cost.py --repeats 2
    python benchmarks/isolation_cost.py --builder my_pkg.kv:MyBuilder --max-examples 10
"""

from __future__ import annotations

import argparse
import os
import sys

from _timing import timed_run

_FRONT_ENDS = ("cli", "check_builder", "plugin")


def _command(
    front: str, isolated: bool, builder: str, seed: int, examples: int | None
) -> list[str]:
    """The command line that runs ``front`` on ``builder``."""
    if front == "cli":
        extra = [] if examples is None else ["--max-examples", str(examples)]
        mode = [] if isolated else ["--no-isolate"]
        return [sys.executable, "-m", "conformance.cli", builder, "--no-database",
                "--seed", str(seed), *mode, *extra]  # fmt: skip
    if front == "check_builder":
        script = (
            "import sys\n"
            "from conformance import check_builder\n"
            f"r = check_builder({builder!r}, seed={seed}, isolate={isolated}, "
            f"max_examples={examples!r})\n"
            "sys.exit(0 if r.ok else 1)\n"
        )
        return [sys.executable, "-c", script]
    extra = [] if examples is None else ["--kv-max-examples", str(examples)]
    mode = ["--kv-isolate"] if isolated else ["--kv-no-isolate"]
    return [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider",
            "--pyargs", "conformance", "--kv-builder", builder, "--kv-seed", str(seed),
            *mode, *extra]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """Run every front end in both modes, in turns, and print the ratios."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--builder", default="kvref:ReferenceKVCacheConfigBuilder")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--max-examples", type=int, default=None)
    parser.add_argument("--front", action="append", choices=_FRONT_ENDS, default=None)
    args = parser.parse_args(argv)
    fronts = args.front or list(_FRONT_ENDS)
    runs: dict[tuple[str, bool], list[tuple[float, float, int]]] = {}
    for repeat in range(args.repeats):
        for front in fronts:
            for isolated in (True, False):
                command = _command(front, isolated, args.builder, args.seed, args.max_examples)
                wall, cpu, code = timed_run(command)
                runs.setdefault((front, isolated), []).append((wall, cpu, code))
                mode = "isolated" if isolated else "in-process"
                print(
                    f"run {repeat + 1} {front:13} {mode:10}: {wall:7.1f} s wall, "
                    f"{cpu:7.1f} s cpu, exit {code}",
                    flush=True,
                )
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    for front in fronts:
        iso, inp = runs[(front, True)], runs[(front, False)]
        wall = sum(r[0] for r in iso) / sum(r[0] for r in inp)
        cpu = sum(r[1] for r in iso) / sum(r[1] for r in inp)
        print(f"{front:13}: isolated / in-process = {wall:.2f}x wall, {cpu:.2f}x cpu")
    cli = runs.get(("cli", True))
    plugin = runs.get(("plugin", True))
    if cli and plugin:
        ratio = sum(r[0] for r in plugin) / sum(r[0] for r in cli)
        print(f"plugin / CLI (both isolated) = {ratio:.2f}x wall")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
