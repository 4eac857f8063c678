"""The command-line options of a vendor's CI, shared by a run and a merge.

Kept apart from :mod:`conformance.ci`, which reads manifests and reports:
parsing ``--help`` imports nothing heavy.
"""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["add_ci_options", "add_output_options"]


def add_ci_options(group: argparse._ArgumentGroup) -> None:
    """``--expectations``, ``--update-expectations`` and ``--baseline`` (a run's and a merge's)."""
    group.add_argument(
        "--expectations",
        action="append",
        default=[],
        metavar="NAME|PATH",
        help="expectations manifest (TOML; repeatable): a file, or one the kit ships "
        "(vllm-0.33.0, vllm-0.34.0: that release's documented defects)",
    )
    group.add_argument(
        "--update-expectations",
        type=Path,
        metavar="FILE",
        help="write or refresh this manifest from the run (new failures get TODO reasons)",
    )
    group.add_argument(
        "--baseline",
        type=Path,
        metavar="REPORT.json",
        help="an earlier run's --json report: fail (exit 1) only on failures it did not have",
    )


def add_output_options(group: argparse._ArgumentGroup) -> None:
    """``--json``, ``--junit`` and ``--markdown`` (a run's and a merge's)."""
    group.add_argument("--json", type=Path, help="write the report as JSON to this path")
    group.add_argument("--junit", type=Path, help="write the report as JUnit XML to this path")
    group.add_argument(
        "--markdown",
        type=Path,
        metavar="FILE",
        help="write a Markdown summary here (also appended to $GITHUB_STEP_SUMMARY when set)",
    )
