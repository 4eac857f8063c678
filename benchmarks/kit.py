"""Kit throughput: examples per second per invariant family, and the default CLI run.

Run: python benchmarks/kit.py [--max-examples 25]
"""

from __future__ import annotations

import argparse
import time

from conformance.run.runner import check_builder
from kvref import ReferenceKVCacheConfigBuilder

FAMILIES = {
    "grouping": ["KV-GROUP"],
    "placement": ["KV-PLACE"],
    "host": ["KV-HOST"],
    "core": ["KV-CORE"],
    "device (cpu)": ["KV-DEV-VIEWS", "KV-DEV-TAGS"],
}


def main() -> None:
    """Print examples per second per family and the time of a full default run."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--max-examples", type=int, default=25)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    for family, select in FAMILIES.items():
        start = time.perf_counter()
        check_builder(
            ReferenceKVCacheConfigBuilder,
            max_examples=args.max_examples,
            seed=args.seed,
            select=select,
        )
        seconds = time.perf_counter() - start
        print(f"{family:14} {args.max_examples / seconds:7.1f} examples/s ({seconds:.1f} s)")
    start = time.perf_counter()
    report = check_builder(ReferenceKVCacheConfigBuilder, seed=args.seed)
    print(
        f"default run (profile ci, {report.max_examples} examples per scenario): "
        f"{time.perf_counter() - start:.1f} s, ok={report.ok}"
    )


if __name__ == "__main__":
    main()
