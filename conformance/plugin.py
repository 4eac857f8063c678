"""pytest plugin: ``pytest --pyargs conformance --kv-builder X --kv-device D``.

One pytest item per invariant; JUnit output through pytest's own
``--junitxml``.  The plugin is loaded in every pytest session of the
environment, so it costs nothing there: no import of torch or the kit, no
header and no work unless ``--kv-builder`` is given.

The options are the CLI's, as ``--kv-*``, made into one
:class:`~conformance.run.options.RunOptions` before collection, with the
kit's defaults (isolated, reach measured when coverage.py is installed, the
``ci`` profile, a random seed the header names).  Bad options, the device
included, are one ``pytest.UsageError`` before collection; so is
``--kv-builder`` in a session that collected none of the kit's items (they
come with ``--pyargs conformance``).

The session's kit items share one run: the first item runs every selected
invariant (those of the items left after ``-k`` and ``--kv-select``) as the
CLI would, and each item reports its invariant's verdict from that run, so
the same options judge the same examples once, whatever the number of items.
That first item's time is the whole run's.  Under pytest-xdist the run is
split: each worker makes one shard of it and every worker reports from all
shards merged, so the verdicts are those of the unsplit run
(:mod:`conformance.plugin_xdist`; benchmarks/plugin_cost.py measures it).

Verdicts map as: PASS passes; FAIL and INCONCLUSIVE fail; N/A and SKIP
skip; XFAIL is an xfail; XPASS is pytest's non-strict XPASS (reported, not
failing), as in the CLI.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

__all__ = [
    "ci_inputs",
    "pytest_addoption",
    "pytest_collection_finish",
    "pytest_collection_modifyitems",
    "pytest_configure",
    "pytest_report_header",
    "pytest_sessionfinish",
    "run_item",
    "run_reach_item",
]

#: The module of the kit's items (``--pyargs conformance`` collects it).
_KIT_MODULE = "conformance.test_conformance"

#: The plugin's flags in the order ``pytest --help`` lists them (each flag's help,
#: type and default are declared on its option's field: :mod:`conformance.flags`).
_ORDER = (
    *("builder", "device", "max_examples", "seed", "profile", "select", "xfail_file"),
    *("expectations", "unsupported", "timeout", "max_alloc_bytes", "no_shrink", "replays"),
    *("database", "models", "models_only", "isolate", "no_isolate", "focus", "explore", "vllm"),
    *("explore_candidates", "worker_memory", "reach", "no_reach", "min_reach", "json"),
)


def _records(extensions: Sequence[type] = ()) -> list[Any]:
    """The flags with ``--kv-*`` spellings: the run's, the CI's, ``extensions``' records'."""
    from conformance.ci.options import CI_FLAGS
    from conformance.run.option_flags import RUN_FLAGS

    return [RUN_FLAGS, CI_FLAGS, *extensions]


def pytest_addoption(parser: pytest.Parser) -> None:
    """Register the kit's options in one group."""
    from conformance.flags import PLUGIN, arguments, place, unplaced

    group = parser.getgroup("kvref-conformance", "kvref KV cache builder conformance")
    flags = arguments(_records(), PLUGIN)
    # An extension's options follow the kit's.
    place(flags, (*_ORDER, *unplaced(flags, _ORDER)), group.addoption)


class _Session:
    """The session's one :class:`RunOptions`, and the one run its kit items share."""

    def __init__(self, options: Any, proxy: Any, shard: Any = None) -> None:
        self.options = options
        #: This xdist worker's share of the run (:class:`~conformance.plugin_xdist.XdistShard`).
        self.shard = shard
        #: The builder as the run reaches it: its isolated proxy, or its name.
        self.builder: Any = proxy if proxy is not None else options.builder
        #: The invariants of the kit items left after deselection (``None``: not collected yet).
        self.selected: list[str] | None = None
        self.collected = False
        #: The shared run's report, expectations applied (``None``: not run yet).
        self.report: Any = None
        #: The controller's folder where its xdist workers meet (``None``: none yet).
        self.exchange: str | None = None

    def run(self, invariant: str, inputs: Any) -> Any:
        """The report that judged ``invariant``: the shared run's, made on the first call.

        ``inputs``: the CI post-processors' (:func:`ci_inputs`), applied to the report.
        """
        import attrs

        from conformance.ci.processors import finish
        from conformance.run.runner import check_builder

        if self.report is not None and invariant in {r.id for r in self.report.results}:
            return self.report
        if self.shard is not None:
            self.report = self.run_shard(inputs, merge=True)
            return self.report
        # The collected items' ids, so no prefix of --kv-select widens them again;
        # an item run apart from the session's collection runs alone.
        ids = self.selected if self.selected and invariant in self.selected else [invariant]
        report = _no_verdict(check_builder, self.builder, attrs.evolve(self.options, select=ids))
        report = finish(report, inputs)
        if self.report is None:
            self.report = report
        return report

    def run_shard(self, inputs: Any, *, merge: bool) -> Any:
        """Make this worker's shard, publish it, and (``merge``) the whole run's report."""
        import attrs

        from conformance.ci.processors import finish
        from conformance.run.runner import check_builder

        shard = self.shard
        options = attrs.evolve(self.options, select=self.selected or None, shard=shard.spelled)
        try:
            report = _no_verdict(
                lambda b, o: check_builder(b, o, focus_exchange=shard.share_focus),
                self.builder,
                options,
            )
        except BaseException as exc:
            shard.fail(f"{type(exc).__name__}: {exc}")
            raise
        shard.publish(report)
        if not merge:
            return None
        whole = _no_verdict(lambda _b, _o: shard.whole_run(), None, None)
        return finish(whole, inputs)


def _no_verdict(check: Any, builder: Any, options: Any) -> Any:
    """``check(builder, options)``; what is no verdict on the builder ends the session.

    A builder that cannot be constructed at all is a usage error, and a
    failure of the kit's own code an internal error, as in the CLI (exit 2
    there): one message, not a failure per item.
    """
    from conformance.errors import KitError
    from conformance.run.options import OptionError, flag_message

    try:
        return check(builder, options)
    except OptionError as exc:
        pytest.exit(
            f"kvref-conformance: {flag_message(str(exc), '--kv-')}", pytest.ExitCode.USAGE_ERROR
        )
    except KitError as exc:
        detail = exc.detail or ""
        pytest.exit(
            f"kvref-conformance: {exc}\n{detail.rstrip()}\n{exc.hint}",
            pytest.ExitCode.INTERNAL_ERROR,
        )


def _options(config: pytest.Config) -> Any:
    """The session's :class:`RunOptions` from the ``--kv-*`` options (``None``: the default).

    Raises:
        OptionError: an option that cannot be read (``--kv-no-reach`` with ``--kv-reach``).
    """
    from conformance.flags import PLUGIN, read_values
    from conformance.run.option_flags import RUN_FLAGS
    from conformance.run.options import RunOptions

    values = read_values([RUN_FLAGS], PLUGIN, config.getoption)
    workerinput = getattr(config, "workerinput", None)
    if values["seed"] is None and workerinput is not None:
        # One seed for the whole session: the controller's, sent to each xdist worker.
        values["seed"] = workerinput.get("kvref_seed")
    return RunOptions.create(values.pop("builder"), **values)


def _check_options(config: pytest.Config) -> _Session:
    """The session's options, every one checked; one ``pytest.UsageError`` for the first bad one.

    The validator is ``check_builder``'s own
    (:func:`~conformance.run.runner.check_options`), so the plugin, the CLI
    and Python refuse the same values.
    """
    from conformance.run.options import OptionError, flag_message
    from conformance.run.runner import check_options

    try:
        options = _options(config)
        # One release a session: the matrix is the CLI's (--vllm all) or check_matrix's.
        check_options(options)
    except OptionError as exc:
        raise pytest.UsageError(flag_message(str(exc), "--kv-")) from None
    from conformance.extensions.vendor.child import models_for_run  # in a contained child
    from conformance.extensions.vendor.models import VendorModelError

    try:
        models_for_run(options.models, models_only=options.models_only)
    except VendorModelError as exc:
        raise pytest.UsageError(f"--kv-models: {exc}") from None
    ci_inputs(config)
    _start_json(config, options)
    from conformance.plugin_xdist import XdistShard

    try:
        shard = XdistShard.of(getattr(config, "workerinput", None))
        if shard is not None:
            import attrs

            check_options(attrs.evolve(options, shard=shard.spelled), focus_shared=True)
    except OptionError as exc:
        raise pytest.UsageError(f"under pytest-xdist: {flag_message(str(exc), '--kv-')}") from None
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    proxy = _load(options)
    if _xdist_controller(config) and proxy is not None:
        # Loaded to refuse a bad builder once, here; only the workers run items.
        proxy.close()
        proxy = None
    return _Session(options, proxy, shard)


def _xdist_controller(config: pytest.Config) -> bool:
    """This is pytest-xdist's controller process (``-n N`` with N >= 1): it runs no item."""
    if getattr(config, "workerinput", None) is not None:
        return False
    return bool(config.getoption("dist", default="no") != "no")


def _load(options: Any) -> Any:
    """Load the builder once, as the run will reach it (an isolated proxy, or ``None``).

    Isolated, its module is imported only in the worker made here, which every
    item's run then uses: the import is paid once per session.
    """
    from conformance.harness.adapters import BuilderLoadError, load_builder

    try:
        if not options.isolate:
            load_builder(options.builder)
            return None
        from conformance.harness.isolate import isolated

        reach = options.measured_reach
        return isolated(
            options.builder,
            options.builder,
            reach=None if reach is False else reach,
            memory=options.worker_memory_bytes,
        )
    except BuilderLoadError as exc:
        raise pytest.UsageError(f"--kv-builder: {exc}") from None


def _start_json(config: pytest.Config, options: Any) -> None:
    """Open ``--kv-json`` for writing before collection, leaving an "incomplete" marker in it.

    As the CLI does: opening is the only honest test that the report can be
    written (a directory that exists may still refuse it, ``/sys`` say), and
    the marker replaces whatever file was there, so a stale or planted report
    never survives a session.  The controller writes it; xdist workers only
    check the path.

    Raises:
        pytest.UsageError: the path is no file path in an existing directory,
            or cannot be written.
    """
    path = config.getoption("--kv-json")
    if path is None:
        return
    target = Path(path)
    if target.is_dir() or not (target.parent if str(target.parent) else Path()).is_dir():
        raise pytest.UsageError(f"--kv-json {path!r}: not a file path in an existing directory")
    if getattr(config, "workerinput", None) is not None:
        return
    from conformance.contract import contract_name
    from conformance.report.render import RunStart, write_incomplete_json

    start = RunStart(
        builder=str(options.builder),
        device=options.device,
        seed=options.seed,
        profile=options.profile,
        max_examples=options.max_examples,
        contract=contract_name(options.vllm_version),
    )
    try:
        write_incomplete_json(start, target)
    except OSError as exc:
        raise pytest.UsageError(
            f"--kv-json {path!r} cannot be written: {exc.strerror or exc}"
        ) from None


def _session(config: pytest.Config) -> _Session | None:
    return getattr(config, "_kvref_session", None)


def pytest_configure(config: pytest.Config) -> None:
    """Check the kit's options once, before collection, when a builder is given."""
    if config.getoption("--kv-builder", default=None) is not None:
        _keep_hypothesis_plain(config)
        config._kvref_session = _check_options(config)  # type: ignore[attr-defined]


#: Packages of the kit's run that pytest marks for assertion rewriting only
#: because they ship a pytest plugin (the kit's own, installed from a wheel).
_NOT_REWRITTEN = ("hypothesis", "kvref", "conformance")


def _keep_hypothesis_plain(config: pytest.Config) -> None:
    """Import Hypothesis and the kit as Python does, not assertion-rewritten, for the kit's run.

    pytest rewrites the asserts of every installed package that ships a
    plugin, Hypothesis and the kit included, so that their failures explain
    themselves.  The kit's run drives Hypothesis's engine hard: rewriting
    its modules (on every run where bytecode is not cached) and running its
    rewritten asserts made the plugin about a quarter slower than the CLI
    for the same run (benchmarks/plugin_cost.py).  The kit reports its own
    failures, and the kit's items (the collected test module) are rewritten
    as any test module is, so nothing is lost.  pytest offers no public way
    to unmark a package: where its rewrite hook does not look as expected,
    this does nothing.
    """
    hook = getattr(config.pluginmanager, "rewrite_hook", None)
    marked = getattr(hook, "_must_rewrite", None)
    cache = getattr(hook, "_marked_for_rewrite_cache", None)
    if not isinstance(marked, set) or not isinstance(cache, dict):
        return
    for name in _NOT_REWRITTEN:
        marked.discard(name)
    cache.clear()


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """Under pytest-xdist: every worker runs with the controller's seed, and meets the others."""
    session = _session(node.config)
    if session is not None:
        from conformance.plugin_xdist import exchange_folder

        node.workerinput["kvref_seed"] = session.options.seed
        if session.exchange is None:
            session.exchange = exchange_folder()
        node.workerinput["kvref_exchange"] = session.exchange


def _is_reach_item(item: pytest.Item) -> bool:
    module = getattr(item, "module", None)
    return getattr(module, "__name__", None) == _KIT_MODULE and item.name == "test_reach_minimum"


def _invariant(item: pytest.Item) -> str | None:
    """The invariant a kit item checks (``None``: not one of the kit's items)."""
    module = getattr(item, "module", None)
    callspec = getattr(item, "callspec", None)
    if getattr(module, "__name__", None) != _KIT_MODULE or callspec is None:
        return None
    invariant = callspec.params.get("invariant")
    return invariant if isinstance(invariant, str) else None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    """Note that the kit's items were collected, and deselect those ``--kv-select`` leaves out."""
    state = _session(config)
    if state is None:
        return
    kit = [item for item in items if _invariant(item) is not None]
    state.collected = bool(kit)
    if state.options.min_reach is None:
        # The reach item judges only a minimum given: without one it is no test at all.
        items[:] = [item for item in items if not _is_reach_item(item)]
    if state.options.select is None or not kit:
        return
    from conformance.check.catalog import catalog
    from conformance.run.tally import select_invariants

    chosen = {inv.id for inv in select_invariants(catalog(), state.options.select)}
    dropped = [item for item in kit if _invariant(item) not in chosen]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if item not in dropped]


def pytest_collection_finish(session: pytest.Session) -> None:
    """Refuse a builder given to a session without the kit's items; note the run's invariants."""
    state = _session(session.config)
    if state is None:
        return
    if not state.collected:
        builder = state.options.builder
        raise pytest.UsageError(
            f"--kv-builder {builder} was given, but none of the kit's tests were collected, "
            f"so nothing would check it: add --pyargs conformance "
            f"(pytest --pyargs conformance --kv-builder {builder})"
        )
    state.selected = [i for item in session.items if (i := _invariant(item)) is not None]


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Make a shard no item asked for, write ``--kv-json`` and stop the session's worker."""
    state = _session(session.config)
    if state is None:
        return
    path = session.config.getoption("--kv-json")
    first_worker = state.shard is None or state.shard.index == 1
    if state.shard is not None and state.report is None and state.collected:
        # The controller gave this xdist worker no item: its shard is still the run's.
        wanted = path is not None and first_worker
        state.report = state.run_shard(ci_inputs(session.config), merge=wanted)
    if state.exchange is not None:
        import shutil

        shutil.rmtree(state.exchange, ignore_errors=True)
    if state.report is not None and first_worker:
        from conformance.ci.processors import write_outputs

        errors = write_outputs(state.report, ci_inputs(session.config))
        for error in errors:
            print(f"kvref-conformance: error: {error}", file=sys.stderr)
        if errors:
            session.exitstatus = pytest.ExitCode.INTERNAL_ERROR
    close = getattr(state.builder, "close", None)
    if callable(close) and not isinstance(state.builder, str):
        close()


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    """Name exactly what is being tested, so a typo shows at once."""
    state = _session(config)
    if state is None:
        return None
    from conformance.contract import contract_name, version_note

    o = state.options
    note = version_note(o.vllm_version)
    reach = o.measured_reach
    return [
        f"kvref-conformance: builder={o.builder} device={o.device} profile={o.profile} "
        f"max_examples={o.max_examples} seed={o.seed} "
        f"xfail_file={config.getoption('--kv-xfail-file')} "
        f"unsupported={','.join(o.unsupported) or '-'} "
        f"isolate={o.isolate} reach={'off' if reach is False else 'on'}",
        f"kvref-conformance: checks the {contract_name(o.vllm_version)} builder contract"
        + ("" if note is None else f"; warning: {note}"),
    ]


def ci_inputs(config: pytest.Config) -> Any:
    """The inputs of the CI post-processors, read once: xfail file, expectations, JSON path.

    An id no invariant has is a warning.  Cached on ``config``; the plugin
    applies them through the one list of :mod:`conformance.ci.processors`, as
    the CLI and ``merge`` do.

    Raises:
        pytest.UsageError: a manifest or the xfail file is invalid (naming the
            entry, field and value).
    """
    cached = getattr(config, "_kvref_ci_inputs", None)
    if cached is not None:
        return cached
    from conformance.check.catalog import catalog
    from conformance.ci.options import CI_FLAGS
    from conformance.ci.processors import CiError, CiOptions, prepare
    from conformance.flags import PLUGIN, read_values

    values = read_values([CI_FLAGS], PLUGIN, config.getoption)
    given = CiOptions(**{k: v for k, v in values.items() if v is not None})
    try:
        inputs = prepare(
            xfail_file=given.xfail_file,
            expectations=given.expectations,
            json=given.json,
            prefix="--kv-",
        )
    except CiError as exc:
        raise pytest.UsageError(str(exc)) from None
    known = [inv.id for inv in catalog()]
    for warning in (w for manifest in inputs.manifests for w in manifest.unknown_ids(known)):
        config.issue_config_time_warning(pytest.PytestWarning(warning), stacklevel=2)
    config._kvref_ci_inputs = inputs  # type: ignore[attr-defined]
    return inputs


def run_reach_item(request: pytest.FixtureRequest) -> None:
    """Fail when the run's reach is below ``--kv-min-reach`` (the CLI's exit 1 for it)."""
    state = _session(request.config)
    if state is None:
        pytest.skip("give --kv-builder module:Class to check a builder")
    from conformance.check.catalog import catalog

    ids = state.selected or [inv.id for inv in catalog()]
    report = state.run(ids[0], ci_inputs(request.config))
    if report.reach_failed:
        pytest.fail(
            f"the run reached {report.reach['percent']}% of the builder's lines, below "
            f"--kv-min-reach {state.options.min_reach:g}%",
            pytrace=False,
        )


def run_item(invariant: str, request: pytest.FixtureRequest) -> None:
    """Report ``invariant``'s verdict from the session's run, mapped onto pytest's outcomes."""
    import attrs

    from conformance.report.render import format_report

    config = request.config
    state = _session(config)
    if state is None:
        pytest.skip("give --kv-builder module:Class to check a builder")
    report = state.run(invariant, ci_inputs(config))
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
        # The invariant's own row and finding, as the CLI prints them.
        pytest.fail(format_report(attrs.evolve(report, results=(result,))), pytrace=False)
