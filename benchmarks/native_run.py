"""Time one vLLM-native builder's fast-tier run for several checkouts side by side.

The run is the one tests/vllm/test_native_builders.py's fast tier makes:
``check_builder`` in process (the builder isolated in its worker, as by
default), the paper invariants, seed 1, no reach, no shrinking.  Each
checkout runs in its own fresh interpreter with its own code first on the
path, in turns (``_timing.in_turns``).

Usage::

    python benchmarks/native_run.py --checkout /tmp/old --checkout . --repeats 2
    python benchmarks/native_run.py --checkout . --builder glm5:GLM5TopDownBuilder
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from _timing import in_turns

_RUN = """
import sys
from conformance import check_builder
from conformance.check.catalog import catalog
from conformance.harness.adapters import load_builder

paper = tuple(
    inv.id
    for inv in catalog()
    if inv.id.startswith(("KV-CALL", "KV-GROUP", "KV-PLACE", "KV-CORE"))
    and inv.id != "KV-GROUP-HASH-STABLE"
)
builder = load_builder("tests.vllm.native_builders." + sys.argv[1])
check_builder(builder, seed=int(sys.argv[2]), select=paper, shrink=False, reach=False)
"""


def main(argv: list[str] | None = None) -> int:
    """Run the comparison and print one line per run and a summary per checkout."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkout", action="append", type=Path, required=True)
    parser.add_argument("--builder", default="padded:Padded4KiBBuilder")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    for checkout in args.checkout:
        if not (checkout / "tests" / "vllm" / "native_builders").is_dir():
            parser.error(f"--checkout {checkout}: no tests/vllm/native_builders there")
    in_turns(
        args.checkout,
        args.repeats,
        [sys.executable, "-c", _RUN, args.builder, str(args.seed)],
        lambda root: f"{root}{os.pathsep}{root / 'tests'}",
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
