"""The post-processors of a run's report, in one list, and the inputs they take.

What a vendor's CI adds to a run is a list of functions of its report
(:data:`POST_PROCESSORS`, in the order they apply): the expectations
manifests, the baseline and the certificate of a ``--certify`` run change the
report; the JSON, JUnit, Markdown and HTML files and the refreshed manifest
are written from it.  The CLI, ``kvref-conformance merge`` and the pytest
plugin call :func:`prepare` (every input read and validated before the first
example: a bad one is a usage error, exit 2), :func:`finish`,
:func:`write_outputs` and :func:`exit_status`, never a post-processor by
name; one that is not asked for does nothing.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import attrs

from conformance.ci.baseline import Baseline, BaselineError, compare, load_baseline
from conformance.ci.expectations import (
    ExpectationsError,
    Manifest,
    apply_expectations,
    load_manifest,
    resolve_manifest,
    update_manifest,
    xfail_manifest,
)
from conformance.ci.options import CI_FLAGS
from conformance.flags import CLI, declared, read_values
from conformance.report.model import Report

if TYPE_CHECKING:
    from conformance.ci.certify import CertifyInputs

__all__ = [
    "POST_PROCESSORS",
    "CiError",
    "CiOptions",
    "CiInputs",
    "PostProcessor",
    "check_writable",
    "exit_status",
    "finish",
    "prepare",
    "prepare_from",
    "write_outputs",
]


class CiError(ValueError):
    """A CI input (manifest, baseline, output path) cannot be used; names the option."""


def _path(value: str | Path | None) -> Path | None:
    return None if value is None else Path(value)


def _specs(values: Iterable[str] | None) -> tuple[str, ...]:
    return tuple(values or ())


# Each field's flags are in CI_FLAGS (asserted when the class is made).
@attrs.frozen(kw_only=True, field_transformer=declared(CI_FLAGS))
class CiOptions:
    """What a vendor's CI adds to a run, as given: expectations, baseline, reports, certificate.

    Attributes:
        xfail_file: a file of invariant ids expected to fail.
        expectations: expectations manifests, by path or by the name of one the kit ships.
        update_expectations: the manifest to write or refresh from the run.
        baseline: an earlier run's ``--json`` report: only new failures fail.
        json: where the JSON report goes.
        junit: where the JUnit XML report goes.
        markdown: where the Markdown summary goes.
        certify: a certified run (:mod:`conformance.ci.certify`).
        html: where the HTML report goes.
    """

    xfail_file: Path | None = attrs.field(default=None, converter=_path)
    expectations: tuple[str, ...] = attrs.field(default=(), converter=_specs)
    update_expectations: Path | None = attrs.field(default=None, converter=_path)
    baseline: Path | None = attrs.field(default=None, converter=_path)
    json: Path | None = attrs.field(default=None, converter=_path)
    junit: Path | None = attrs.field(default=None, converter=_path)
    markdown: Path | None = attrs.field(default=None, converter=_path)
    certify: bool = False
    html: Path | None = attrs.field(default=None, converter=_path)


@attrs.frozen(kw_only=True)
class CiInputs:
    """The validated CI inputs of a run (or a merge), what each post-processor reads.

    Attributes:
        manifests: expectations manifests, applied in order (first match wins).
        baseline: an earlier run's report: only failures it did not have fail.
        update: the manifest to write or refresh from the report.
        summaries: where the Markdown summary goes.
        json: where the JSON report goes.
        junit: where the JUnit XML report goes.
        html: where the HTML report goes.
        certify: a ``--certify`` run's inputs: the report is sealed.
        prefix: how the front end spells its flags in messages (``--``, ``--kv-``).
    """

    manifests: tuple[Manifest, ...] = ()
    baseline: Baseline | None = None
    update: Path | None = None
    summaries: tuple[Path, ...] = ()
    json: Path | None = None
    junit: Path | None = None
    html: Path | None = None
    certify: CertifyInputs | None = None
    prefix: str = "--"


@attrs.frozen
class PostProcessor:
    """One post-processor of a report.

    Attributes:
        name: what it is called (its option's name, without the dashes).
        apply: the report it makes of a report (``None``: it changes nothing).
        write: writes its file; returns what could not be written (``None``: no file).
    """

    name: str
    apply: Callable[[Report, CiInputs], Report] | None = None
    write: Callable[[Report, CiInputs], list[str]] | None = None


def check_writable(option: str, path: Path) -> None:
    """Refuse an output path that is a directory or whose directory is missing.

    Raises:
        CiError: naming ``option`` and the path.
    """
    if path.is_dir():
        raise CiError(f"{option} {str(path)!r} is a directory, not a file path")
    parent = path.parent if str(path.parent) else Path()
    if not parent.is_dir():
        raise CiError(f"{option} {str(path)!r}: the directory {str(parent)!r} does not exist")


def prepare(
    *,
    xfail_file: Path | None = None,
    expectations: Sequence[str] = (),
    baseline: Path | None = None,
    update: Path | None = None,
    summaries: Sequence[Path] = (),
    json: Path | None = None,
    junit: Path | None = None,
    html: Path | None = None,
    certify: CertifyInputs | None = None,
    prefix: str = "--",
) -> CiInputs:
    """Read and validate the CI inputs, before any example runs.

    ``json``, ``junit`` and ``html`` are only recorded: the front end opens
    ``json`` and ``junit`` at the start (an "incomplete" marker, the one honest
    test that they can be written); :func:`prepare_from` checks ``html``.

    ``xfail_file``'s ids are a manifest (:func:`xfail_manifest`), applied
    before the ``expectations``.

    Raises:
        CiError: a manifest, xfail file or baseline is invalid, or an output's
            directory is missing.
    """
    manifests = []
    if xfail_file is not None:
        try:
            manifests.append(xfail_manifest(xfail_file))
        except ExpectationsError as exc:
            raise CiError(f"{prefix}xfail-file: {exc}") from None
    for spec in expectations:
        try:
            manifests.append(load_manifest(resolve_manifest(spec), source=spec))
        except ExpectationsError as exc:
            raise CiError(f"{prefix}expectations: {exc}") from None
    if update is not None:
        check_writable(f"{prefix}update-expectations", update)
        if update.exists():
            try:
                # Placeholders allowed: refreshing a file it wrote is what the option is for.
                load_manifest(update, allow_placeholders=True)
            except ExpectationsError as exc:
                raise CiError(f"{prefix}update-expectations: {exc}") from None
    for path in summaries:
        check_writable(f"{prefix}markdown", path)
    try:
        loaded = None if baseline is None else load_baseline(baseline)
    except BaselineError as exc:
        raise CiError(str(exc)) from None
    return CiInputs(
        manifests=tuple(manifests),
        baseline=loaded,
        update=update,
        summaries=tuple(summaries),
        json=json,
        junit=junit,
        html=html,
        certify=certify,
        prefix=prefix,
    )


def prepare_from(args: argparse.Namespace) -> CiInputs:
    """:func:`prepare` of the options :mod:`conformance.ci.options` declared (a run's or a merge's).

    In a ``--certify`` run, fixes the command line's seed, profile and
    examples, and hashes the builder's files
    (:func:`conformance.ci.certify.certify_args`): call it before the run's
    options are resolved.

    Raises:
        CiError: as :func:`prepare`; an unusable ``--html`` path; a
            ``--certify`` run that cannot be made as asked.
    """
    from conformance.ci.markdown import summary_paths

    # A merge declares some of the CI's flags: the others read as not given.
    values = read_values([CI_FLAGS], CLI, lambda dest: getattr(args, dest, None))
    options = CiOptions(**{k: v for k, v in values.items() if v is not None})
    if options.html is not None:
        check_writable("--html", options.html)
    certify = None
    if options.certify:
        from conformance.ci.certify import CertifyError, certify_args

        try:
            certify = certify_args(args)
        except CertifyError as exc:
            raise CiError(str(exc)) from None
    return prepare(
        xfail_file=options.xfail_file,
        expectations=options.expectations,
        baseline=options.baseline,
        update=options.update_expectations,
        summaries=summary_paths(options.markdown),
        json=options.json,
        junit=options.junit,
        html=options.html,
        certify=certify,
    )


def _expectations(report: Report, inputs: CiInputs) -> Report:
    return apply_expectations(report, inputs.manifests) if inputs.manifests else report


def _baseline(report: Report, inputs: CiInputs) -> Report:
    return report if inputs.baseline is None else compare(report, inputs.baseline)


def _certify(report: Report, inputs: CiInputs) -> Report:
    """The report with its certificate (a ``--certify`` run), said on stdout."""
    if inputs.certify is None:
        return report
    from conformance.ci.certify import CertifyError, seal

    try:
        sealed = seal(report, inputs.certify)
    except CertifyError as exc:
        raise CiError(str(exc)) from None
    cert = sealed.certificate or {}
    verdict = "conformant" if cert.get("conformant") else "NOT conformant"
    print(
        f"certified: {verdict}; {len(cert.get('files', ()))} builder files hashed; digest "
        f"{cert['digest']['algorithm']} {cert['digest']['value']} (kvref-conformance verify "
        f"{inputs.json})"
    )
    return sealed


def _file(
    name: str, path_of: Callable[[CiInputs], Path | None], write: Callable[[Report, Path], object]
) -> PostProcessor:
    """A post-processor that writes one file, where its option gave a path."""

    def run(report: Report, inputs: CiInputs) -> list[str]:
        path = path_of(inputs)
        if path is None:
            return []
        try:
            write(report, path)
        except OSError as exc:
            return [f"{inputs.prefix}{name} {str(path)!r}: {exc}"]
        return []

    return PostProcessor(name, write=run)


def _write_json(report: Report, path: Path) -> None:
    import json

    from conformance.ci.shard_reports import sealed
    from conformance.report.render import report_to_dict

    # A shard's report carries its keyed seal where the run holds the key.
    text = json.dumps(sealed(report_to_dict(report)), indent=2, default=str)
    path.write_text(text, encoding="utf-8")


def _write_junit(report: Report, path: Path) -> None:
    from conformance.ci.junit import write_junit

    write_junit(report, path)


def _write_html(report: Report, path: Path) -> None:
    from conformance.ci.html import write_html

    write_html(report, path)


def _markdown(report: Report, inputs: CiInputs) -> list[str]:
    import os

    from conformance.ci.markdown import write_markdown

    errors = []
    step = os.environ.get("GITHUB_STEP_SUMMARY")
    for path in inputs.summaries:
        try:
            # GitHub's step summary collects what every step appends.
            write_markdown(report, path, append=bool(step) and str(path) == step)
        except OSError as exc:
            errors.append(f"{inputs.prefix}markdown {str(path)!r}: {exc}")
    return errors


def _update(report: Report, inputs: CiInputs) -> list[str]:
    if inputs.update is None:
        return []
    try:
        added = update_manifest(report, inputs.update)
    except (OSError, ExpectationsError) as exc:
        return [f"{inputs.prefix}update-expectations {str(inputs.update)!r}: {exc}"]
    print(f"kvref-conformance: {inputs.update}: {added} new entries (fill in the TODOs)")
    return []


#: Every post-processor, in the order it applies.  Those that change the
#: report come first (the certificate seals what the others made); a file that
#: cannot be written does not keep the next one from being written.
POST_PROCESSORS: tuple[PostProcessor, ...] = (
    PostProcessor("expectations", apply=_expectations),
    PostProcessor("baseline", apply=_baseline),
    PostProcessor("certify", apply=_certify),
    _file("json", lambda inputs: inputs.json, _write_json),
    _file("junit", lambda inputs: inputs.junit, _write_junit),
    PostProcessor("markdown", write=_markdown),
    PostProcessor("update-expectations", write=_update),
    _file("html", lambda inputs: inputs.html, _write_html),
)


def finish(report: Report, inputs: CiInputs) -> Report:
    """The report as every post-processor of :data:`POST_PROCESSORS` makes it, in order.

    Raises:
        CiError: the certificate cannot be made (the builder's files changed during the run).
    """
    for processor in POST_PROCESSORS:
        if processor.apply is not None:
            report = processor.apply(report, inputs)
    return report


def write_outputs(report: Report, inputs: CiInputs) -> list[str]:
    """Write every file asked for; returns what could not be (each one tried)."""
    errors: list[str] = []
    for processor in POST_PROCESSORS:
        if processor.write is not None:
            errors += processor.write(report, inputs)
    return errors


def exit_status(report: Report, inputs: CiInputs) -> int:
    """0 or 1; with a baseline, only new failures (or reach below the minimum) give 1."""
    if inputs.baseline is not None and report.baseline is not None:
        return 1 if report.baseline["new"] or report.reach_failed else 0
    return 0 if report.ok else 1
