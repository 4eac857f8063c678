"""What the CLI does for CI around a run: expectations, baseline, Markdown summary.

:func:`prepare` reads and validates every input before the first example (a
bad manifest or baseline is a usage error, exit 2); :func:`finish` applies
them to the run's report; :func:`write_outputs` writes the summary and the
refreshed manifest; :func:`exit_status` says 0 or 1.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import attrs

from conformance.ci.baseline import Baseline, BaselineError, compare, load_baseline
from conformance.ci.expectations import (
    ExpectationsError,
    Manifest,
    apply_expectations,
    load_manifest,
    resolve_manifest,
    update_manifest,
)
from conformance.report.model import Report

__all__ = [
    "CiError",
    "CiInputs",
    "exit_status",
    "finish",
    "prepare",
    "prepare_from",
    "write_outputs",
    "write_report_files",
]


class CiError(ValueError):
    """A CI input (manifest, baseline, output path) cannot be used; names the option."""


@attrs.frozen(kw_only=True)
class CiInputs:
    """The validated CI inputs of a run."""

    manifests: tuple[Manifest, ...] = ()
    baseline: Baseline | None = None
    update: Path | None = None
    summaries: tuple[Path, ...] = ()


def _writable_parent(option: str, path: Path) -> None:
    if path.is_dir():
        raise CiError(f"{option} {str(path)!r} is a directory, not a file path")
    parent = path.parent if str(path.parent) else Path()
    if not parent.is_dir():
        raise CiError(f"{option} {str(path)!r}: the directory {str(parent)!r} does not exist")


def prepare(
    expectations: Sequence[str],
    baseline: Path | None,
    update: Path | None,
    summaries: Sequence[Path],
) -> CiInputs:
    """Read and validate the CI inputs, before any example runs.

    Raises:
        CiError: a manifest or baseline is invalid, or an output's directory is missing.
    """
    manifests = []
    for spec in expectations:
        try:
            manifests.append(load_manifest(resolve_manifest(spec), source=spec))
        except ExpectationsError as exc:
            raise CiError(f"--expectations: {exc}") from None
    if update is not None:
        _writable_parent("--update-expectations", update)
        if update.exists():
            try:
                # Placeholders allowed: refreshing a file it wrote is what the option is for.
                load_manifest(update, allow_placeholders=True)
            except ExpectationsError as exc:
                raise CiError(f"--update-expectations: {exc}") from None
    for path in summaries:
        _writable_parent("--markdown", path)
    try:
        loaded = None if baseline is None else load_baseline(baseline)
    except BaselineError as exc:
        raise CiError(str(exc)) from None
    return CiInputs(
        manifests=tuple(manifests), baseline=loaded, update=update, summaries=tuple(summaries)
    )


def prepare_from(args: argparse.Namespace) -> CiInputs:
    """:func:`prepare` of the options :mod:`conformance.ci.options` added (a run's or a merge's).

    Raises:
        CiError: as :func:`prepare`.
    """
    from conformance.ci.markdown import summary_paths

    return prepare(
        args.expectations, args.baseline, args.update_expectations, summary_paths(args.markdown)
    )


def finish(report: Report, inputs: CiInputs) -> Report:
    """The report with the expectations applied and compared with the baseline."""
    if inputs.manifests:
        report = apply_expectations(report, inputs.manifests)
    if inputs.baseline is not None:
        report = compare(report, inputs.baseline)
    return report


def write_outputs(report: Report, inputs: CiInputs) -> list[str]:
    """Write the Markdown summaries and the refreshed manifest; returns what could not be."""
    import os

    from conformance.ci.markdown import write_markdown

    errors = []
    step = os.environ.get("GITHUB_STEP_SUMMARY")
    for path in inputs.summaries:
        try:
            # GitHub's step summary collects what every step appends.
            write_markdown(report, path, append=bool(step) and str(path) == step)
        except OSError as exc:
            errors.append(f"--markdown {str(path)!r}: {exc}")
    if inputs.update is not None:
        try:
            added = update_manifest(report, inputs.update)
        except (OSError, ExpectationsError) as exc:
            errors.append(f"--update-expectations {str(inputs.update)!r}: {exc}")
        else:
            print(f"kvref-conformance: {inputs.update}: {added} new entries (fill in the TODOs)")
    return errors


def write_report_files(report: Report, json: Path | None, junit: Path | None) -> list[str]:
    """Write the ``--json`` and ``--junit`` reports asked for; returns what could not be.

    One that cannot be written does not keep the other from being written.
    """
    from conformance.report.junit import write_junit
    from conformance.report.render import write_json

    errors = []
    for option, path, write in (("--json", json, write_json), ("--junit", junit, write_junit)):
        if path is None:
            continue
        try:
            write(report, path)
        except OSError as exc:
            errors.append(f"{option} {str(path)!r}: {exc}")
    return errors


def exit_status(report: Report, inputs: CiInputs) -> int:
    """0 or 1; with a baseline, only new failures (or reach below the minimum) give 1."""
    if inputs.baseline is not None and report.baseline is not None:
        return 1 if report.baseline["new"] or report.reach_failed else 0
    return 0 if report.ok else 1
