"""The kit's cost per vLLM release, side by side: the reference and vLLM's default builder.

Runs ``python -m conformance.cli BUILDER --vllm R --seed S --no-database`` for
the reference (any environment judges it under either release) and for
vLLM's ``DefaultKVCacheConfigBuilder`` (each release's own environment), in
turns, and prints each run's CPU seconds (the children's user + system
time) and wall time, then the ratios against the reference under the oldest
release.  Absolute seconds differ 2x between machines; read the ratios.

Usage::

    python benchmarks/per_release.py --python 0.33.0=.venv-vllm0.33/bin/python \\
        --python 0.34.0=.venv/bin/python --repeats 1
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import time

REFERENCE = "kvref:ReferenceKVCacheConfigBuilder"
DEFAULT = "vllm.v1.core.kv_cache_planning:DefaultKVCacheConfigBuilder"


def _run(python: str, builder: str, release: str, seed: int) -> tuple[float, float, int]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(
        [python, "-m", "conformance.cli", builder, "--vllm", release, "--seed", str(seed),
         "--no-database", "--no-reach"],
        capture_output=True,
        text=True,
        check=False,
    )  # fmt: skip
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall, done.returncode


def main(argv: list[str] | None = None) -> int:
    """Measure; print one line per run and the ratios."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--python", action="append", required=True, metavar="RELEASE=PATH")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args(argv)
    pythons = dict(p.split("=", 1) for p in args.python)
    cases = [(b, r) for r in sorted(pythons) for b in (REFERENCE, DEFAULT)]
    cpu: dict[tuple[str, str], list[float]] = {c: [] for c in cases}
    for _ in range(args.repeats):
        for builder, release in cases:
            seconds, wall, code = _run(pythons[release], builder, release, args.seed)
            cpu[builder, release].append(seconds)
            print(f"{builder:60} vLLM {release}: {seconds:7.1f} CPU-s {wall:7.1f} s exit {code}")
    base = min(cpu[REFERENCE, min(pythons)])
    for (builder, release), values in cpu.items():
        print(f"ratio {builder.split(':')[1]:34} vLLM {release}: {min(values) / base:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
