"""Reach against examples judged, for one builder, with and without exploration.

Prints the JSON report's ``reach.over_time`` (after each scenario's first
deal, each focus and the exploration: examples judged so far and traced lines
run so far), the final reach and what exploration did::

    PYTHONPATH=tests python benchmarks/reach_curve.py vendor_builders.glm5:GLM5Builder 0
    PYTHONPATH=tests python benchmarks/reach_curve.py vendor_builders.glm5:GLM5Builder 120
"""

from __future__ import annotations

import argparse
import json
import time

from conformance import check_builder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("builder")
    parser.add_argument("explore", type=float, help="seconds of exploration (0: none)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    started = time.perf_counter()
    report = check_builder(args.builder, seed=args.seed, explore=args.explore, replays=0)
    reach = report.reach or {}
    curve = [(p["after"], p["examples"], p["lines"]) for p in reach.get("over_time", [])]
    print(
        json.dumps(
            {
                "builder": args.builder,
                "explore": args.explore,
                "seconds": round(time.perf_counter() - started),
                "percent": reach.get("percent"),
                "curve": curve,
                "explore_summary": reach.get("explore"),
                "failed": sorted(
                    r.id for r in report.results if r.status in ("fail", "inconclusive")
                ),
            }
        )
    )


if __name__ == "__main__":
    main()
