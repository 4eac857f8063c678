"""The ``kvref-conformance`` command line: its options and their help.

Kept apart from :mod:`conformance.cli` (which runs them) so that ``--help``
and a usage error import nothing but argparse and this module.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from conformance.ci.options import add_ci_options, add_output_options

__all__ = ["DEFAULT_BUILDER", "parser"]

#: Also in :mod:`conformance.harness.adapters`; repeated here so ``--help`` needs no import of it.
DEFAULT_BUILDER = _DEFAULT_BUILDER = "kvref:ReferenceKVCacheConfigBuilder"
_PROFILES = ("ci", "thorough")


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


def parser() -> argparse.ArgumentParser:
    """The command line's parser (every option, with its help)."""
    return _parser()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvref-conformance",
        description="Check a KV cache config builder against the builder contract of vLLM "
        "0.33.0 or 0.34.0 (docs/contract.md).",
    )
    parser.add_argument(
        "builder",
        nargs="?",
        default=_DEFAULT_BUILDER,
        help="module:Class, module.Class or path/to/file.py:Class of the builder "
        f"(default: {_DEFAULT_BUILDER}); the current directory is on the import path",
    )
    parser.add_argument("--version", action=_VersionAction)
    _run_options(parser.add_argument_group("what is checked, and how hard"))
    _example_options(parser.add_argument_group("where the examples come from"))
    _builder_options(parser.add_argument_group("the builder's process and reach"))
    _expectation_options(parser.add_argument_group("expectations, baselines and replays"))
    add_output_options(parser.add_argument_group("reports"))
    from conformance.ci.certified import add_options

    # Certified runs, `verify` and HTML reports: conformance/ci/certified.py.
    add_options(parser)
    return parser


def _run_options(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--device", default="cpu", help="torch device for the device checks")
    group.add_argument("--max-examples", type=int, help="examples per scenario (>= 1)")
    group.add_argument("--seed", type=int, help="seed of the run (printed in the report)")
    group.add_argument(
        "--select", help="comma-separated invariant ids or prefixes (e.g. KV-PLACE,KV-CORE-SLACK)"
    )
    group.add_argument(
        "--profile",
        default="ci",
        choices=_PROFILES,
        help="ci (the default: 50 examples per scenario) or thorough (500)",
    )
    group.add_argument("--timeout", type=float, default=10.0, help="per-call deadline, seconds")
    group.add_argument("--max-alloc-bytes", type=int, help="cap of one device allocation (> 0)")
    group.add_argument(
        "--unsupported",
        default="",
        help="comma-separated capabilities the builder lacks (e.g. host_resident)",
    )
    group.add_argument(
        "--vllm",
        metavar="VERSION",
        help="the vLLM release whose contract the run judges: 0.33, 0.34, or all (the "
        "compatibility matrix, one run per release); default: the installed vLLM when "
        "supported, else the newest",
    )
    group.add_argument("--list", action="store_true", help="list the invariants and exit")


def _example_options(group: argparse._ArgumentGroup) -> None:
    group.add_argument(
        "--models",
        metavar="SPEC",
        help="your own models, mixed into generation: module:attr (a strategy of models, a "
        "callable, a list or dict of models) or a kvref-models/1 JSON file (docs/vendors.md)",
    )
    group.add_argument("--models-only", action="store_true", help="generate from --models alone")
    group.add_argument(
        "--focus",
        metavar="SPEC",
        help="where the run draws its extra examples: learned from where the builder's answers "
        "differ from the reference's (default), 'off', or family=PATH,...;... as a report's "
        "reproduce line gives it",
    )
    group.add_argument(
        "--explore",
        type=float,
        metavar="SECONDS",
        help="after the run, explore for SECONDS: keep examples that reach new lines of the "
        "builder, mutate them, judge each by every invariant; the corpus is saved in the "
        "database and judged first next time (needs reach measured)",
    )
    group.add_argument(
        "--explore-candidates",
        type=int,
        metavar="N",
        help="stop exploring after N candidates (reproducible; --explore still limits the time)",
    )
    group.add_argument(
        "--shard",
        metavar="I/N",
        help="judge only the I-th of N shares of the run's model families (one machine of a CI "
        "matrix); needs --focus given; 'kvref-conformance merge' joins the N --json reports",
    )
    group.add_argument(
        "--database",
        default=".hypothesis/kvref-conformance",
        help="Hypothesis example database: saved counterexamples are replayed first "
        "(default: .hypothesis/kvref-conformance)",
    )
    group.add_argument(
        "--no-database", action="store_true", help="neither replay nor save counterexamples"
    )
    group.add_argument("--no-shrink", action="store_true", help="report failures unshrunk")


def _builder_options(group: argparse._ArgumentGroup) -> None:
    group.add_argument(
        "--isolate",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run the builder in a worker process: a hook that exits, crashes or patches the "
        "kit is reported as a failure of the builder (default: on; --no-isolate runs it in "
        "the kit's process, e.g. for a debugger)",
    )
    group.add_argument(
        "--worker-memory",
        type=float,
        metavar="GIB",
        help="GiB of private memory the builder's worker may take over its size at start "
        "(default 16): a hook that leaks past it fails KV-CALL-RAISES",
    )
    group.add_argument(
        "--reach",
        metavar="MODULES",
        help="comma-separated modules whose lines reach is measured in (default: the "
        "builder's module and package; measured whenever coverage.py is installed)",
    )
    group.add_argument("--no-reach", action="store_true", help="do not measure reach")
    group.add_argument(
        "--min-reach",
        type=float,
        metavar="PERCENT",
        help="fail (exit 1) when the run executed less of the builder's code than this",
    )


def _expectation_options(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--xfail-file", type=Path, help="file of invariant ids expected to fail")
    add_ci_options(group)
    group.add_argument(
        "--replays",
        type=int,
        default=2,
        help="replays of each failure's minimal counterexample: deterministic or flaky "
        "(default 2; 0: none)",
    )
