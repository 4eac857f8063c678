"""Measure what a default run's examples cover, without running a builder.

``python benchmarks/example_coverage.py --seeds 1-5`` draws, per scenario,
the examples a run with the same seed and example count would draw (the
stream does not depend on the builder) and prints :func:`coverage` figures
per seed and their mean, so a change to the generators can be judged by
numbers.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from typing import Any

from conformance.generate.coverage import coverage
from conformance.run.strata import draw_examples

__all__ = ["main", "summarise"]

_HEADLINE = (
    "models",
    "families_seen",
    "block_counts",
    "one_block",
    "layouts_seen",
    "odd_block_counts",
    "over_4gib",
    "layer_outer_multi_block",
)


def summarise(seeds: Sequence[int], max_examples: int) -> dict[str, Any]:
    """Per scenario and seed, :func:`coverage` of the drawn examples, and headline means."""
    from conformance.scenarios.registry import names

    out: dict[str, Any] = {"per_seed": {}, "mean": {}}
    for scenario in names():
        rows = {seed: coverage(draw_examples(scenario, seed, max_examples)) for seed in seeds}
        for row in rows.values():
            row["one_block"] = row["block_buckets"].get("1", 0)
            row["families_seen"] = len(row["families"])
        out["per_seed"][scenario] = rows
        out["mean"][scenario] = {
            key: statistics.fmean(row[key] for row in rows.values()) for key in _HEADLINE
        }
        kinds = set().union(*(row["spec_kinds"] for row in rows.values()))
        dtypes = set().union(*(row["dtypes"] for row in rows.values()))
        out["mean"][scenario]["min_kinds_per_seed"] = min(
            len(row["spec_kinds"]) for row in rows.values()
        )
        out["mean"][scenario]["min_dtypes_per_seed"] = min(
            len(row["dtypes"]) for row in rows.values()
        )
        out["mean"][scenario]["kinds_all_seeds"] = sorted(kinds)
        out["mean"][scenario]["dtypes_all_seeds"] = sorted(dtypes)
    return out


def _seeds(text: str) -> list[int]:
    if "-" in text:
        lo, hi = text.split("-", 1)
        return list(range(int(lo), int(hi) + 1))
    return [int(s) for s in text.split(",")]


def main(argv: Sequence[str] | None = None) -> int:
    """Print the coverage of the default example stream at the given seeds."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", default="1-5", help="e.g. 1-5 or 1,3,7")
    parser.add_argument("--max-examples", type=int, default=50)
    parser.add_argument("--json", action="store_true", help="print every figure as JSON")
    args = parser.parse_args(argv)
    result = summarise(_seeds(args.seeds), args.max_examples)
    if args.json:
        json.dump(result, sys.stdout, indent=1, default=str)
        return 0
    for scenario, mean in result["mean"].items():
        figures = ", ".join(f"{k}={mean[k]:.1f}" for k in _HEADLINE)
        print(f"{scenario:10} {figures}")
        print(
            f"{'':10} kinds/seed>={mean['min_kinds_per_seed']} "
            f"{mean['kinds_all_seeds']}; dtypes/seed>={mean['min_dtypes_per_seed']} "
            f"{mean['dtypes_all_seeds']}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
