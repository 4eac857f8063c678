"""The flags of a vendor's CI options (a run's and a merge's), by field.

:class:`~conformance.ci.processors.CiOptions` takes each field's flag from
:data:`CI_FLAGS` (:func:`conformance.flags.declared`); they are kept apart
from it, with nothing but the standard library imported, so that ``--help``
imports neither attrs nor the kit.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from conformance.flags import CLI, Flag, arguments, flag, place

__all__ = [
    "CI_FLAGS",
    "add_ci_options",
    "add_output_options",
    "add_report_options",
    "add_xfail_option",
]


CI_FLAGS: dict[str, Flag | None] = {
    "xfail_file": flag("file of invariant ids expected to fail", cli={"type": Path}),
    "expectations": flag(
        "expectations manifest (TOML; repeatable): a file, or one the kit ships "
        "(vllm-0.33.0, vllm-0.34.0: that release's documented defects)",
        action="append",
        cli={"default": [], "metavar": "NAME|PATH"},
        kv={
            "default": [],
            "help": "expectations manifest (TOML, repeatable): a path, vllm-0.33.0 or vllm-0.34.0",
        },
    ),
    "update_expectations": flag(
        "write or refresh this manifest from the run (new failures get TODO reasons)",
        type=Path,
        metavar="FILE",
        kv=None,
    ),
    "baseline": flag(
        "an earlier run's --json report: fail (exit 1) only on failures it did not have",
        type=Path,
        metavar="REPORT.json",
        kv=None,
    ),
    "json": flag(
        "write the report as JSON to this path",
        cli={"type": Path},
        kv={"metavar": "PATH", "help": "write the run's report as JSON"},
    ),
    "junit": flag("write the report as JUnit XML to this path", type=Path, kv=None),
    "markdown": flag(
        "write a Markdown summary here (also appended to $GITHUB_STEP_SUMMARY when set)",
        type=Path,
        metavar="FILE",
        kv=None,
    ),
    "certify": flag(
        "a certified run: the thorough profile at the kit's fixed seed, every invariant, "
        "no expectations; the --json report records the builder's files, their sha256 and a "
        "digest (check it with: kvref-conformance verify REPORT.json)",
        action="store_true",
        kv=None,
    ),
    "html": flag(
        "write a self-contained HTML report here (verdicts, reach, memory maps)",
        type=Path,
        metavar="FILE",
        kv=None,
    ),
}


def _add(group: Any, names: tuple[str, ...]) -> None:
    place(arguments([CI_FLAGS], CLI), names, group.add_argument)


def add_ci_options(group: argparse._ArgumentGroup) -> None:
    """``--expectations``, ``--update-expectations`` and ``--baseline`` (a run's and a merge's)."""
    _add(group, ("expectations", "update_expectations", "baseline"))


def add_xfail_option(group: argparse._ArgumentGroup) -> None:
    """``--xfail-file`` (a merge's: a run places it in its own section)."""
    _add(group, ("xfail_file",))


def add_output_options(group: argparse._ArgumentGroup) -> None:
    """``--json``, ``--junit`` and ``--markdown`` (a run's and a merge's)."""
    _add(group, ("json", "junit", "markdown"))


def add_report_options(parser: argparse.ArgumentParser) -> None:
    """``--certify`` and ``--html`` (a run's)."""
    _add(parser, ("certify", "html"))
