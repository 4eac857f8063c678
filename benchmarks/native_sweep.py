"""Seed sweep of the vLLM-native test corpus: every broken builder caught, every legal one passing.

For each native test builder of ``tests/vllm/test_native_builders.py``
(``LEGAL`` and ``BROKEN``), the kit's default run (profile ci, 50 examples
per scenario, reach off, no shrinking: what decides the verdict) at each
seed, judged as the meta-tests judge it (``assert_verdict``): a broken
builder fails its meant invariant as its own finding and nothing else but
what it may also break or vLLM's documented defects; a legal one fails only
vLLM's documented defects and what the installed release's worker refuses of
it.  Not a timed test: a sweep takes tens of minutes.  Prints a line per
builder and seed and a summary; exits 1 when a run breaks its case.

Usage (from the repository root, vLLM installed)::

    python benchmarks/native_sweep.py                       # seeds 1-5, the whole corpus
    python benchmarks/native_sweep.py --seeds 1 2 --only GLM5ShortBackingBuilder
    python benchmarks/native_sweep.py --select paper        # the fast tier's invariants
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from tests.vllm.test_native_builders import (
    BROKEN,
    LEGAL,
    PAPER,
    assert_verdict,
    run_kit,
)


def main(argv: list[str] | None = None) -> int:
    """Run the sweep; 0 when every builder behaved as its case says at every seed."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    parser.add_argument("--only", nargs="*", default=None, help="class names to sweep")
    parser.add_argument(
        "--select", choices=("all", "paper"), default="all", help="the whole catalog or PAPER"
    )
    args = parser.parse_args(argv)
    cases = [c for c in (*LEGAL, *BROKEN) if args.only is None or c.id in args.only]
    select = PAPER if args.select == "paper" else None
    broken_runs = 0
    for case in cases:
        for seed in args.seeds:
            start = time.perf_counter()
            report = run_kit(case, seed, select)
            seconds = time.perf_counter() - start
            kind = "legal" if case.meant is None else f"broken ({case.meant})"
            try:
                assert_verdict(case, report)
            except AssertionError as exc:
                broken_runs += 1
                verdict = f"NOT AS MEANT: {str(exc)[:300]}"
            else:
                verdict = "as meant"
            failed = ",".join(sorted(report.failing_ids)) or "-"
            print(
                f"{case.id:34} seed {seed}  {kind:38} {verdict:10}  failing: {failed}  "
                f"({seconds:.0f} s, {report.contract})",
                flush=True,
            )
    runs = len(cases) * len(args.seeds)
    print(f"{runs - broken_runs} of {runs} runs as meant")
    return 1 if broken_runs else 0


if __name__ == "__main__":
    raise SystemExit(main())
