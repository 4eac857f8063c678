"""Time an isolated vLLM-native builder's start, with and without vLLM imported before the fork.

The kit imports vLLM in its own process for a vLLM-native builder, and the
worker it forks imports the builder's module, vLLM with it.  With the
prefetch (``conformance/harness/vllm_import_guess.py``) the kit imports vLLM first and
the worker inherits it.  Each variant runs in a fresh interpreter, in
turns (prefetch, none, prefetch, ...), so load changes hit both alike; the
CPU time is the interpreter's own and its children's (the worker).

Usage::

    python benchmarks/isolated_start.py --repeats 3
    python benchmarks/isolated_start.py --builder tests.vllm.native_builders.glm5:GLM5TopDownBuilder
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

_CHILD = """
import json, resource, sys, time
started = time.perf_counter()
import conformance.harness.isolate as iso
if sys.argv[2] == "none":
    iso.imports_vllm = lambda name: False
proxy = iso.isolated(sys.argv[1])
proxy.close()
wall = time.perf_counter() - started
me = resource.getrusage(resource.RUSAGE_SELF)
kids = resource.getrusage(resource.RUSAGE_CHILDREN)
cpu = me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime
print(json.dumps({"wall": wall, "cpu": cpu}))
"""


def _one(builder: str, variant: str) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, builder, variant],
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    """Run both variants ``--repeats`` times each and print every run and the ranges."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--builder", default="vllm.v1.core.kv_cache_planning:DefaultKVCacheConfigBuilder"
    )
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    runs: dict[str, list[dict[str, float]]] = {"prefetch": [], "none": []}
    for repeat in range(args.repeats):
        for variant, found in runs.items():
            one = _one(args.builder, variant)
            found.append(one)
            print(f"run {repeat + 1} {variant}: {one['wall']:.1f} s wall, {one['cpu']:.1f} s cpu")
    for variant, found in runs.items():
        walls = sorted(r["wall"] for r in found)
        cpus = sorted(r["cpu"] for r in found)
        print(
            f"{variant}: wall {walls[0]:.1f}-{walls[-1]:.1f} s, cpu {cpus[0]:.1f}-{cpus[-1]:.1f} s"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
