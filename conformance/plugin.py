"""pytest plugin: ``pytest --pyargs conformance --kv-builder X --kv-device D``.

One pytest item per invariant (the items share no state, so ``pytest -n auto``
spreads them over cores); JUnit output through pytest's own ``--junitxml``.
The plugin is loaded in every pytest session of the environment, so it costs
nothing there: no import of torch or the kit, no header and no work unless
``--kv-builder`` is given.  Bad options are one ``pytest.UsageError``.

Verdicts map as: PASS passes; FAIL and INCONCLUSIVE fail; N/A and SKIP
skip; XFAIL is an xfail; XPASS is pytest's non-strict XPASS (reported, not
failing), as in the CLI.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

__all__ = ["pytest_addoption", "pytest_configure", "pytest_report_header"]

_OPTIONS = (
    ("--kv-builder", {"default": None, "help": "module:Class of the builder to check"}),
    ("--kv-device", {"default": "cpu", "help": "torch device for the device checks"}),
    ("--kv-max-examples", {"type": int, "default": None, "help": "examples per scenario"}),
    ("--kv-seed", {"type": int, "default": None, "help": "seed (default: random)"}),
    ("--kv-profile", {"default": "ci", "help": "ci or thorough"}),
    ("--kv-xfail-file", {"default": None, "help": "file of invariant ids expected to fail"}),
    (
        "--kv-expectations",
        {
            "action": "append",
            "default": [],
            "help": "expectations manifest (TOML, repeatable): a path, or vllm-0.33.0",
        },
    ),
    ("--kv-unsupported", {"default": "", "help": "capabilities the builder lacks"}),
    ("--kv-timeout", {"type": float, "default": 10.0, "help": "per-call deadline, seconds"}),
    ("--kv-max-alloc-bytes", {"type": int, "default": None, "help": "cap of one allocation"}),
    (
        "--kv-database",
        {"default": None, "help": "Hypothesis example database directory: replay and save"},
    ),
    (
        "--kv-models",
        {"default": None, "help": "your own models (module:attr or a kvref-models/1 JSON file)"},
    ),
    ("--kv-models-only", {"action": "store_true", "help": "generate from --kv-models alone"}),
    (
        "--kv-isolate",
        {
            "action": "store_true",
            "default": True,
            "help": "run the builder in a worker process, its module imported only there "
            "(the default; a crash or a patch of the kit is the builder's failure)",
        },
    ),
    (
        "--kv-no-isolate",
        {
            "action": "store_false",
            "dest": "kv_isolate",
            "help": "run the builder in pytest's process (debugging only: a builder can then "
            "patch the kit)",
        },
    ),
)


def pytest_addoption(parser: pytest.Parser) -> None:
    """Register the kit's options in one group."""
    group = parser.getgroup("kvref-conformance", "kvref KV cache builder conformance")
    for flag, kwargs in _OPTIONS:
        group.addoption(flag, **kwargs)


def _check_options(config: pytest.Config) -> None:
    """Raise one ``pytest.UsageError`` for the first unusable option.

    The rule is ``check_builder``'s own (:meth:`RunOptions.validate`), so the
    plugin, the CLI and Python refuse the same values.
    """
    from conformance.check.catalog import catalog
    from conformance.run.adapters import BuilderLoadError, load_builder
    from conformance.run.options import PROFILES, OptionError, RunOptions

    profile = config.getoption("--kv-profile")
    examples = config.getoption("--kv-max-examples")
    options = RunOptions(
        builder=config.getoption("--kv-builder"),
        device=config.getoption("--kv-device"),
        max_examples=PROFILES.get(profile, 1) if examples is None else examples,
        seed=config.getoption("--kv-seed") or 0,
        profile=profile,
        unsupported=_list(config.getoption("--kv-unsupported")),
        timeout=config.getoption("--kv-timeout"),
        max_alloc_bytes=config.getoption("--kv-max-alloc-bytes"),
        models=config.getoption("--kv-models"),
        models_only=config.getoption("--kv-models-only"),
    )
    try:
        options.validate(capabilities={c for inv in catalog() for c in inv.requires})
    except OptionError as exc:
        raise pytest.UsageError(_as_flag(str(exc))) from None
    from conformance.generate.vendor import VendorModelError, models_for_run

    try:
        models_for_run(options.models, models_only=options.models_only)
    except VendorModelError as exc:
        raise pytest.UsageError(f"--kv-models: {exc}") from None
    xfail_ids(config)
    expectations(config)
    name = config.getoption("--kv-builder")
    try:
        if config.getoption("--kv-isolate"):
            _isolated_builder(config, name)
        else:
            load_builder(name)
    except BuilderLoadError as exc:
        raise pytest.UsageError(f"--kv-builder: {exc}") from None


def _isolated_builder(config: pytest.Config, name: str) -> Any:
    """The run's one worker for the builder, made (and the builder loaded there) once.

    The builder's module is imported only in that worker; every item checks
    the builder through it, so the import is paid once per pytest run.
    """
    from conformance.run.isolate import isolated

    proxy = getattr(config, "_kvref_isolated", None)
    if proxy is None or getattr(proxy, "kvref_name", None) != name:
        proxy = isolated(name, name)
        config._kvref_isolated = proxy  # type: ignore[attr-defined]
    return proxy


def _as_flag(message: str) -> str:
    # RunOptions names keyword arguments; the pytest user typed --kv-* options.
    key, sep, rest = message.partition("=")
    if sep and key.isidentifier():
        return f"--kv-{key.replace('_', '-')}={rest}"
    return message


def pytest_configure(config: pytest.Config) -> None:
    """Check the kit's options once, before collection, when a builder is given."""
    if config.getoption("--kv-builder", default=None) is not None:
        _check_options(config)


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    """Name exactly what is being tested, so a typo shows at once."""
    builder = config.getoption("--kv-builder", default=None)
    if builder is None:
        return None
    from conformance.contract import CONTRACT, version_note

    xfail = config.getoption("--kv-xfail-file")
    note = version_note()
    return [
        f"kvref-conformance: builder={builder} device={config.getoption('--kv-device')} "
        f"profile={config.getoption('--kv-profile')} "
        f"max_examples={config.getoption('--kv-max-examples')} "
        f"seed={config.getoption('--kv-seed')} "
        f"xfail_file={xfail} unsupported={config.getoption('--kv-unsupported') or '-'}",
        f"kvref-conformance: checks the {CONTRACT} builder contract"
        + ("" if note is None else f"; warning: {note}"),
    ]


def _list(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def xfail_ids(config: pytest.Config) -> list[str]:
    """Ids of the ``--kv-xfail-file``, warning about ids that match no invariant.

    Raises:
        pytest.UsageError: the file cannot be read.
    """
    from conformance.check.catalog import catalog
    from conformance.report.render import XfailFileError, read_xfail_file

    path = config.getoption("--kv-xfail-file")
    if not path:
        return []
    try:
        ids = read_xfail_file(Path(path))
    except XfailFileError as exc:
        raise pytest.UsageError(f"--kv-xfail-file: {exc}") from None
    known = {inv.id for inv in catalog()}
    for entry in ids:
        if entry not in known:
            config.issue_config_time_warning(
                pytest.PytestWarning(f"--kv-xfail-file names {entry!r}, which is no invariant id"),
                stacklevel=2,
            )
    return ids


def expectations(config: pytest.Config) -> Any:
    """The ``--kv-expectations`` manifests, validated once (cached on ``config``).

    Raises:
        pytest.UsageError: a manifest is invalid (naming its entry, field and value).
    """
    cached = getattr(config, "_kvref_expectations", None)
    if cached is not None:
        return cached
    from conformance.expectations import ExpectationsError, load_manifest, resolve_manifest

    try:
        manifests = tuple(
            load_manifest(resolve_manifest(spec), source=spec)
            for spec in config.getoption("--kv-expectations")
        )
    except ExpectationsError as exc:
        raise pytest.UsageError(f"--kv-expectations: {exc}") from None
    config._kvref_expectations = manifests  # type: ignore[attr-defined]
    return manifests


def run_item(invariant: str, request: pytest.FixtureRequest) -> None:
    """Check one invariant and map its verdict onto pytest's outcomes."""
    from conformance.report.render import format_report
    from conformance.run.adapters import load_builder
    from conformance.run.runner import check_builder

    config = request.config
    builder_name = config.getoption("--kv-builder")
    if builder_name is None:
        pytest.skip("give --kv-builder module:Class to check a builder")
    xfail = xfail_ids(config)
    isolate = config.getoption("--kv-isolate")
    builder = _isolated_builder(config, builder_name) if isolate else load_builder(builder_name)
    report = check_builder(
        builder,
        device=config.getoption("--kv-device"),
        max_examples=config.getoption("--kv-max-examples"),
        seed=config.getoption("--kv-seed"),
        select=[invariant],
        xfail=[x for x in xfail if x == invariant],
        timeout=config.getoption("--kv-timeout"),
        unsupported=_list(config.getoption("--kv-unsupported")),
        profile=config.getoption("--kv-profile"),
        max_alloc_bytes=config.getoption("--kv-max-alloc-bytes"),
        name=builder_name,
        database=config.getoption("--kv-database"),
        models=config.getoption("--kv-models"),
        models_only=config.getoption("--kv-models-only"),
        isolate=isolate,
    )
    manifests = expectations(config)
    if manifests:
        from conformance.expectations import apply_expectations

        report = apply_expectations(report, manifests)
    result: Any = report.result(invariant)
    if result.strict_xpass:
        pytest.fail(f"{invariant} held, yet a strict expectation says it fails", pytrace=False)
    if result.status in ("skipped", "not-applicable"):
        pytest.skip(f"{result.status}: {result.reason}")
    if result.status == "xfail":
        why = result.expectation["reason"] if result.expectation else result.reason
        pytest.xfail(f"{invariant} is expected to fail: {why or result.title}")
    if result.status == "xpass":
        request.applymarker(pytest.mark.xfail(strict=False, reason=f"{invariant} in xfail file"))
        return
    if result.status in ("fail", "inconclusive"):
        pytest.fail(format_report(report), pytrace=False)
