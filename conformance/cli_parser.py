"""The ``kvref-conformance`` command line: its options and their help.

Kept apart from :mod:`conformance.cli` (which runs them) so that ``--help``
and a usage error import only argparse and the option records (no torch,
Hypothesis or vLLM).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from conformance.ci.options import CI_FLAGS
from conformance.flags import CLI, arguments, place, tables_of, unplaced
from conformance.run.option_flags import RUN_FLAGS

__all__ = ["parser"]


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kvref")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "unknown"


class _VersionAction(argparse.Action):
    """``--version``, looked up only when asked: ``--help`` stays free of importlib.metadata."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, help="print the kit's version and exit")

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        print(f"{parser.prog} {_version()}")
        parser.exit()


def parser(records: Sequence[type] = ()) -> argparse.ArgumentParser:
    """The command line's parser: every option's flag, with its help.

    Made from the option records' fields (:mod:`conformance.flags`): the
    run's, the CI's and ``records`` (an extension's), whose flags follow the
    kit's in the sections their fields name.
    """
    tables: list[Any] = [RUN_FLAGS, CI_FLAGS, *records]
    flags = arguments(tables, CLI)
    parser = argparse.ArgumentParser(
        prog="kvref-conformance",
        description="Check a KV cache config builder against the builder contract of vLLM "
        "0.33.0 or 0.34.0 (docs/contract.md).",
    )
    place(flags, ("builder",), parser.add_argument)
    parser.add_argument("--version", action=_VersionAction)
    for index, (title, names) in enumerate(_LAYOUT):
        group = parser.add_argument_group(title)
        place(flags, names, group.add_argument)
        if index == 0:
            # A command, not an option of a run.
            group.add_argument("--list", action="store_true", help="list the invariants and exit")
    place(flags, ("certify", "html"), parser.add_argument)
    groups: dict[str, argparse._ArgumentGroup] = {}
    for name in unplaced(flags, _PLACED):
        # An extension's option: in its own section of the help, after the kit's.
        title = _group_of(tables, name)
        if title not in groups:
            groups[title] = parser.add_argument_group(title)
        place(flags, (name,), groups[title].add_argument)
    return parser


#: The command line's sections and the order of their flags, as ``--help`` prints them
#: (each flag's help, type and default are declared on its option's field).
_LAYOUT: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "what is checked, and how hard",
        (
            *("device", "max_examples", "seed", "select", "profile", "timeout"),
            *("max_alloc_bytes", "unsupported", "vllm"),
        ),
    ),
    (
        "where the examples come from",
        (
            *("models", "models_only", "focus", "explore", "explore_candidates", "shard"),
            *("database", "no_database", "no_shrink"),
        ),
    ),
    (
        "the builder's process and reach",
        ("isolate", "worker_memory", "reach", "no_reach", "min_reach"),
    ),
    (
        "expectations, baselines and replays",
        ("xfail_file", "expectations", "update_expectations", "baseline", "replays"),
    ),
    ("reports", ("json", "junit", "markdown")),
)
_PLACED = {"builder", "certify", "html", *(n for _, names in _LAYOUT for n in names)}


def _group_of(tables: Sequence[Any], name: str) -> str:
    """The help section an option's flag declares (``no_x``: option ``x``'s)."""
    for table in tables_of(tables):
        for option, declared in table.items():
            if declared is not None and name in (option, f"no_{option}"):
                return declared.group
    raise LookupError(name)
