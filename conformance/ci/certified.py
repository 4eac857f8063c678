"""The CLI's ``--certify`` and ``--html`` options and its ``verify`` command.

Kept apart from :mod:`conformance.cli`, which calls these hooks at four
points: building the parser (:func:`add_options`), before parsing
(:func:`dispatch`: ``kvref-conformance verify REPORT``), before the run's
options are resolved (:func:`before_run`) and once the report is final
(:func:`seal_report`, then :func:`write_reports`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from conformance.report.model import Report

__all__ = [
    "ReportOptionError",
    "add_options",
    "before_run",
    "dispatch",
    "seal_report",
    "write_reports",
]


class ReportOptionError(ValueError):
    """``--certify`` or ``--html`` cannot be used as given; names the option (exit 2)."""


def add_options(parser: argparse.ArgumentParser) -> None:
    """Add ``--certify`` and ``--html`` to the CLI's parser."""
    parser.add_argument(
        "--certify",
        action="store_true",
        help="a certified run: the thorough profile at the kit's fixed seed, every invariant, "
        "no expectations; the --json report records the builder's files, their sha256 and a "
        "digest (check it with: kvref-conformance verify REPORT.json)",
    )
    parser.add_argument(
        "--html",
        type=Path,
        metavar="FILE",
        help="write a self-contained HTML report here (verdicts, reach, memory maps)",
    )


def dispatch(argv: Sequence[str] | None) -> int | None:
    """Run a subcommand named by the first word (``verify``, ``merge``); ``None``: not one."""
    words = list(sys.argv[1:] if argv is None else argv)
    if words[:1] == ["verify"]:
        from conformance.ci.certify import verify_main

        return verify_main(words[1:])
    if words[:1] == ["merge"]:
        from conformance.merge import merge_main

        return merge_main(words[1:])
    return None


def before_run(args: argparse.Namespace) -> None:
    """Check ``--html``'s path and fix a ``--certify`` run (seed, profile, files hashed).

    Raises:
        ReportOptionError: a conflicting option, or an unusable path.
    """
    from conformance.ci.certify import CertifyError, certify_args

    path = args.html
    if path is not None:
        if path.is_dir():
            raise ReportOptionError(f"--html {str(path)!r} is a directory, not a file path")
        parent = path.parent if str(path.parent) else Path()
        if not parent.is_dir():
            raise ReportOptionError(
                f"--html {str(path)!r}: the directory {str(parent)!r} does not exist"
            )
    args.certify_inputs = None
    if args.certify:
        try:
            args.certify_inputs = certify_args(args)
        except CertifyError as exc:
            raise ReportOptionError(str(exc)) from None


def seal_report(args: argparse.Namespace, report: Report) -> Report:
    """The report with its certificate in a ``--certify`` run (else unchanged).

    Raises:
        ReportOptionError: the builder's files changed during the run.
    """
    from conformance.ci.certify import CertifyError, seal

    inputs = getattr(args, "certify_inputs", None)
    if inputs is None:
        return report
    try:
        sealed = seal(report, inputs)
    except CertifyError as exc:
        raise ReportOptionError(str(exc)) from None
    cert = sealed.certificate or {}
    verdict = "conformant" if cert.get("conformant") else "NOT conformant"
    print(
        f"certified: {verdict}; {len(cert.get('files', ()))} builder files hashed; digest "
        f"{cert['digest']['algorithm']} {cert['digest']['value']} (kvref-conformance verify "
        f"{args.json})"
    )
    return sealed


def write_reports(args: argparse.Namespace, report: Report) -> list[str]:
    """Write the ``--html`` page; returns what could not be written."""
    from conformance.ci.html import write_html

    if args.html is None:
        return []
    try:
        write_html(report, args.html)
    except OSError as exc:
        return [f"--html {str(args.html)!r}: {exc}"]
    return []
