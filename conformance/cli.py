"""``kvref-conformance``: run the kit against a builder and print a report.

Exit status: 0 when every selected invariant holds, 1 when one fails, 2 for a
usage error (unknown builder, bad option), so a vendor's CI can gate on it.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from conformance.adapters import DEFAULT_BUILDER, BuilderLoadError, load_builder
from conformance.invariants import CATALOG
from conformance.reports import format_report, read_xfail_file, write_json, write_junit
from conformance.runner import PROFILES, check_builder, select_invariants

__all__ = ["main"]


class _UsageError(Exception):
    pass


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvref-conformance",
        description="Check a KV cache config builder against vLLM 0.33.0's builder contract.",
    )
    parser.add_argument(
        "builder",
        nargs="?",
        default=DEFAULT_BUILDER,
        help=f"module:Class or module.Class of the builder (default: {DEFAULT_BUILDER})",
    )
    parser.add_argument("--device", default="cpu", help="torch device for the device checks")
    parser.add_argument("--max-examples", type=int, help="examples per scenario")
    parser.add_argument("--seed", type=int, help="seed of the run (printed in the report)")
    parser.add_argument(
        "--select", help="comma-separated invariant ids or prefixes (e.g. KV-PLACE,KV-CORE-SLACK)"
    )
    parser.add_argument("--xfail-file", type=Path, help="file of invariant ids expected to fail")
    parser.add_argument(
        "--unsupported",
        default="",
        help="comma-separated capabilities the builder lacks (e.g. host_resident)",
    )
    parser.add_argument("--json", type=Path, help="write the report as JSON to this path")
    parser.add_argument("--junit", type=Path, help="write the report as JUnit XML to this path")
    parser.add_argument("--profile", default="ci", choices=sorted(PROFILES))
    parser.add_argument("--timeout", type=float, default=10.0, help="per-call deadline, seconds")
    parser.add_argument("--max-alloc-bytes", type=int, help="cap of one device allocation")
    parser.add_argument("--no-shrink", action="store_true", help="report failures unshrunk")
    parser.add_argument(
        "--database",
        default=".hypothesis/kvref-conformance",
        help="Hypothesis example database: saved counterexamples are replayed first "
        "(default: .hypothesis/kvref-conformance)",
    )
    parser.add_argument(
        "--no-database", action="store_true", help="neither replay nor save counterexamples"
    )
    parser.add_argument("--list", action="store_true", help="list the invariants and exit")
    return parser


class _Progress:
    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self.last = ""
        self.started = time.perf_counter()

    def __call__(self, scenario: str, done: int, total: int) -> None:
        width = 30
        filled = width * done // max(total, 1)
        line = (
            f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total} examples "
            f"({scenario}, {time.perf_counter() - self.started:.0f}s)"
        )
        if self.tty:
            self.stream.write("\r" + line)
            self.stream.flush()
        elif scenario != self.last or done == total:
            self.stream.write(line + "\n")
        self.last = scenario

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")


def _split(value: str | None) -> list[str] | None:
    if value is None:
        return None
    return [v.strip() for v in value.split(",") if v.strip()]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit status."""
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return 0 if exc.code == 0 else 2
    try:
        return _run(args)
    except _UsageError as exc:
        print(f"kvref-conformance: error: {exc}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    if args.list:
        for inv in CATALOG:
            print(f"{inv.id:28} {inv.scenario:10} SPEC {inv.spec:14} {inv.title}")
        return 0
    if args.max_examples is not None and args.max_examples < 1:
        raise _UsageError(f"--max-examples={args.max_examples} must be at least 1")
    if args.timeout <= 0:
        raise _UsageError(f"--timeout={args.timeout} must be positive")
    try:
        builder = load_builder(args.builder)
    except BuilderLoadError as exc:
        raise _UsageError(str(exc)) from None
    xfail: list[str] = []
    if args.xfail_file is not None:
        try:
            xfail = read_xfail_file(args.xfail_file)
        except OSError as exc:
            raise _UsageError(f"cannot read --xfail-file {args.xfail_file}: {exc}") from None
        known = {inv.id for inv in CATALOG}
        for entry in xfail:
            if entry not in known and not entry.startswith("KV-DEV-"):
                print(f"warning: xfail id {entry!r} matches no invariant", file=sys.stderr)
    select = _split(args.select)
    try:
        if select is not None:
            select_invariants(CATALOG, [s for s in select if not s.upper().startswith("KV-DEV")])
    except ValueError as exc:
        raise _UsageError(str(exc)) from None
    try:
        import torch

        torch.empty(0, device=args.device)
    except Exception as exc:
        raise _UsageError(f"--device {args.device!r} is not usable here: {exc}") from None
    progress = _Progress(sys.stderr)
    try:
        report = check_builder(
            builder,
            device=args.device,
            max_examples=args.max_examples,
            seed=args.seed,
            select=select,
            xfail=xfail,
            timeout=args.timeout,
            unsupported=_split(args.unsupported),
            profile=args.profile,
            max_alloc_bytes=args.max_alloc_bytes,
            progress=progress,
            name=args.builder,
            shrink=not args.no_shrink,
            database=None if args.no_database else args.database,
        )
    except ValueError as exc:
        raise _UsageError(str(exc)) from None
    finally:
        progress.close()
    print(format_report(report))
    if args.json is not None:
        write_json(report, args.json)
    if args.junit is not None:
        write_junit(report, args.junit)
    return 0 if report.ok else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
