"""The kit's seed sweep on kvref's vLLM-native builder: seeds 1-5, the whole catalog.

``check_builder("kvref.interop.vllm_builder:KvrefKVCacheConfigBuilder")``
at each seed with the default budget (profile ci, 50 examples per scenario),
reach off and no shrinking, as the slow tier of
tests/vllm/test_vllm_builder_kit.py runs it.  Prints one line per seed (wall
time, verdict, pass / N/A counts and any failed invariant) and exits 1 if
any seed fails.  Needs vLLM installed.

Usage::

    python benchmarks/vllm_builder_sweep.py
    python benchmarks/vllm_builder_sweep.py --seeds 1 2 --max-examples 20
"""

from __future__ import annotations

import argparse
import time

from conformance import check_builder
from conformance.harness.adapters import load_builder

NAME = "kvref.interop.vllm_builder:KvrefKVCacheConfigBuilder"


def main(argv: list[str] | None = None) -> int:
    """Run the sweep; 0 when every seed passes."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    parser.add_argument("--max-examples", type=int, default=None)
    args = parser.parse_args(argv)
    failed_seeds = 0
    for seed in args.seeds:
        start = time.perf_counter()
        report = check_builder(
            load_builder(NAME),
            seed=seed,
            max_examples=args.max_examples,
            shrink=False,
            reach=False,
        )
        took = time.perf_counter() - start
        counts: dict[str, int] = {}
        for result in report.results:
            counts[result.status] = counts.get(result.status, 0) + 1
        failed = sorted(r.id for r in report.results if r.status in ("fail", "inconclusive"))
        failed_seeds += bool(failed) or not report.ok
        verdict = "OK" if report.ok and not failed else "FAIL"
        print(f"seed {seed}: {verdict} in {took:.0f} s  {counts}  failed: {failed or 'none'}")
    return 1 if failed_seeds else 0


if __name__ == "__main__":
    raise SystemExit(main())
