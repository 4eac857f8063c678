"""``check_builder``: drive the invariant catalog over generated examples.

For each scenario the runner draws examples with Hypothesis, observes the
builder once per example and lets every selected invariant of the scenario
judge the observation.  An invariant that fails is then searched again alone
so the report carries a shrunk, minimal counterexample; what no example
judged is reported as such, never as a pass.
"""

from __future__ import annotations

import functools
import time
import warnings
from collections.abc import Sequence
from typing import Any

import attrs
from hypothesis.strategies import SearchStrategy

from conformance.check.catalog import Invariant, catalog
from conformance.extensions.base import check_all, start_all
from conformance.extensions.registry import extensions
from conformance.generate.limits import CAPABILITIES
from conformance.generate.records import Model
from conformance.harness import integrity
from conformance.harness.allocator_settings import older_objects_settled
from conformance.harness.boundary import prepare
from conformance.harness.builder_identity import (
    builder_name,
)
from conformance.harness.guard import Guard
from conformance.harness.hooks import ConstructionFailedError, make_factory
from conformance.report.model import InvariantResult, Report
from conformance.run.judging import ContractVersionWarning, Progress, Run, run_report
from conformance.run.options import PROFILES, OptionError, RunOptions, check_device
from conformance.run.search import check_database
from conformance.run.strata import (
    FocusExchange,
    run_strata,
)
from conformance.run.tally import select_invariants
from conformance.run.threads import one_torch_thread
from kvref.builder import KVCacheConfigBuilder

__all__ = [
    "PROFILES",
    "RUN_ARGUMENTS",
    "ContractVersionWarning",
    "InvariantResult",
    "OptionError",
    "Report",
    "RunOptions",
    "UnknownIdWarning",
    "builder_name",
    "check_builder",
    "check_options",
    "select_invariants",
]


class UnknownIdWarning(UserWarning):
    """An xfail entry names no invariant of the catalog."""


def _preflight(builder: KVCacheConfigBuilder | type[KVCacheConfigBuilder], guard: Guard) -> None:
    """Construct the builder once; a class that cannot be built at all is a usage error."""
    if not isinstance(builder, type):
        return
    try:
        make_factory(builder, guard)()
    except ConstructionFailedError as exc:
        shown = (
            builder.__dict__.get("kvref_class") or f"{builder.__module__}:{builder.__qualname__}"
        )
        raise OptionError(
            f"builder {shown} cannot be constructed with no arguments, as vLLM constructs it: {exc}"
        ) from None


#: What a run takes besides its :class:`RunOptions` fields (see :func:`check_builder`).
RUN_ARGUMENTS = ("progress", "name", "focus_exchange")


def check_options(
    options: RunOptions, *, focus_shared: bool = False, one_release: bool = True
) -> list[Invariant]:
    """Every check of a run's options before its first example; the selected invariants.

    The one validator of every front end (the CLI and the plugin, to refuse
    bad options before anything starts; :func:`check_builder`):
    the values (:meth:`RunOptions.validate`, ``unsupported`` against every
    capability the kit knows), the selection, the release, the device, and
    what the run would read from its database (:func:`~conformance.run.search.check_database`
    and each extension's ``check``).

    Args:
        options: the run's options.
        focus_shared: as :meth:`RunOptions.validate`'s.
        one_release: refuse ``vllm="all"`` (the CLI's compatibility matrix takes it).

    Raises:
        OptionError: the first unusable option.
    """
    invariants = catalog()
    known = {c for inv in invariants for c in inv.requires} | set(CAPABILITIES)
    options.validate(capabilities=known, focus_shared=focus_shared)
    selected = select_invariants(invariants, options.select)
    if one_release:
        options.vllm_version  # noqa: B018 - raises for 'all'
    check_device(options.device)
    # What the run reads from its database is data, checked before anything starts.
    check_database(options.database, options.builder, [inv.id for inv in selected])
    check_all(extensions(), options)
    return selected


def check_builder(
    builder: KVCacheConfigBuilder | type[KVCacheConfigBuilder] | str,
    options: RunOptions | None = None,
    **overrides: Any,
) -> Report:
    """Check ``builder`` against the invariant catalog and return a :class:`Report`.

    The run's options are one :class:`~conformance.run.options.RunOptions`
    (its attributes say what each option does and its default): ``options``
    as the CLI and the plugin pass it, or built from the keyword ``overrides``
    (a keyword left out, or ``None``, takes the kit's default, the same on
    every front end).  Keywords given with ``options`` replace its values.

    Args:
        builder: the builder's importable name (``module:Class`` or
            ``path/to/file.py:Class``; isolated, its module is imported only
            in the worker process, never in the caller's), or a builder
            class (instantiated afresh where vLLM would) or instance.
        options: the whole run's options (default: from the keywords).
        **overrides: any :class:`RunOptions` field by name (``seed=1``,
            ``select=[...]``, ``vllm="0.33"``...), where ``models`` may also be
            the vendor's models object itself
            (:func:`conformance.extensions.vendor.child.load_models`); and, besides,
            ``progress`` (called as ``progress(scenario, done, total)``),
            ``name`` (the builder's importable name in the report and its
            reproduce lines) and ``focus_exchange`` (for the shards of one run
            made at the same time, the pytest plugin under pytest-xdist:
            called once, after the first deals, with what this shard learned
            of the focus; returns the union over every shard, which the shard
            then draws, so a shard may learn the focus).

    Raises:
        OptionError: a keyword names no option, an option has an unusable
            value (a ``ValueError``; the device included), or the builder
            class cannot be constructed at all; raised before any example runs.
    """
    started = time.perf_counter()
    fields = {f.name for f in attrs.fields(RunOptions)} - {"builder"}
    unknown = sorted(set(overrides) - fields - set(RUN_ARGUMENTS))
    if unknown:
        raise OptionError(
            f"{unknown[0]}={overrides[unknown[0]]!r}: check_builder has no such option "
            "(the options are RunOptions' fields)"
        )
    progress: Progress | None = overrides.pop("progress", None)
    name: str | None = overrides.pop("name", None)
    focus_exchange: FocusExchange | None = overrides.pop("focus_exchange", None)
    models = overrides.get("models")
    overrides["models"] = _models_label(models)
    options = _options(builder, options, name, overrides)
    # One release a run: 'all' is refused here.
    selected = check_options(options, focus_shared=focus_exchange is not None)
    known = {inv.id for inv in catalog()}
    for entry in options.xfail:
        if entry not in known:
            warnings.warn(
                f"xfail entry {entry!r} matches no invariant id", UnknownIdWarning, stacklevel=2
            )
    with one_torch_thread():
        return _check(builder, options, selected, progress, models, started, focus_exchange)


def _models_label(models: object | None) -> str | None:
    """What the options record of ``models``: its spec, or a mark for an object."""
    return models if models is None or isinstance(models, str) else "<models object>"


def _options(
    builder: object, options: RunOptions | None, name: str | None, keywords: dict[str, Any]
) -> RunOptions:
    """The run's one :class:`RunOptions`: ``options`` with the given keywords, or the keywords'."""
    given = {k: v for k, v in keywords.items() if v is not None}
    if options is None:
        return RunOptions.create(name or builder_name(builder), **given)
    if name is not None or options.builder is None:
        given["builder"] = name or builder_name(builder)
    return attrs.evolve(options, **given) if given else options


def _check(
    builder: KVCacheConfigBuilder | type[KVCacheConfigBuilder] | str,
    options: RunOptions,
    selected: Sequence[Invariant],
    progress: Progress | None,
    models: object | None,
    started: float,
    focus_exchange: FocusExchange | None = None,
) -> Report:
    """Run the validated ``options`` over ``selected`` and make the report.

    Isolated, from before the first of its builder processes starts (the
    models child, the certified builder's files child and the worker
    included) to the report, the run imports no code that changed since
    (harness/integrity.py).
    """
    from conformance.harness import confine

    vendor = _vendor_models(options.models if models is None else models)
    since = None
    if options.isolate:
        since = integrity.mark()
        # A proxy the caller isolated (the plugin keeps one per session) started
        # earlier; so did the models child, here or in the CLI before the run.
        started_at = getattr(getattr(builder, "_kvref_worker", None), "marked", None)
        earlier = [m for m in (started_at, confine.builder_code_since()) if isinstance(m, int)]
        since = min([since, *earlier])
    try:
        with integrity.guarded(since), older_objects_settled():
            return _check_guarded(
                builder, options, selected, progress, vendor, started, focus_exchange
            )
    finally:
        confine.forget_builder_code_since()


def _check_guarded(
    builder: KVCacheConfigBuilder | type[KVCacheConfigBuilder] | str,
    options: RunOptions,
    selected: Sequence[Invariant],
    progress: Progress | None,
    vendor: SearchStrategy[Model] | None,
    started: float,
    focus_exchange: FocusExchange | None,
) -> Report:
    isolate = options.isolate
    guard = Guard(options.timeout, watchdog=not isolate)
    # Before the builder's worker starts: an extension may need to be there first.
    active = start_all(extensions(), options)
    # One rule for every front end (boundary.py): isolated unless asked not
    # to; a builder given by name is imported only in its worker.
    prepared = prepare(
        builder,
        options.builder,
        isolate=isolate,
        reach=options.measured_reach,
        min_reach=options.min_reach,
        memory=options.worker_memory_bytes,
    )
    # The worker this run started ends with it (Prepared's context): a caller
    # that checks many builders (a test suite, a notebook) would otherwise keep
    # one per run.
    with prepared:
        builder, meter = prepared.builder, prepared.meter
        _preflight(builder, guard)
        run = Run(builder, options, guard, progress, active)
        run.shared.focus_exchange = focus_exchange
        run.strata = run_strata(vendor, only=options.models_only, limits=run.limits)
        if meter is not None:
            # Isolated, the builder's code runs only in its worker, which traces it;
            # tracing this process's threads too would cost time and find nothing.
            meter.start(trace_here=not isolate)
            if not isolate:
                # In process the builder runs on the guard's threads: traced only if started now.
                guard.renew_threads()
            run.shared.meter = meter
            run.shared.reach_lines = functools.partial(meter.lines_reached, builder)
        try:
            run.execute(selected)
        finally:
            if meter is not None:
                meter.stop()
                worker = getattr(builder, "_kvref_worker", None)
                if worker is not None:
                    meter.add_lines(worker.reach_lines())
        try:
            report = run_report(run, selected, time.perf_counter() - started)
        finally:
            from conformance.harness.twin import close_twin

            # The run's twin process ends with the run, not whenever its guard is collected.
            close_twin(run.ctx)
        worker = getattr(builder, "_kvref_worker", None)
        if worker is not None:
            report = attrs.evolve(
                report, builder_output=worker.output_tail(), containment=_containment(worker)
            )
        return report


def _containment(worker: Any) -> dict[str, Any]:
    """What kept the builder's processes apart from this one (docs/trust.md)."""
    from conformance.harness import confine
    from conformance.report.trust import summary

    return summary(
        {**confine.seen(), "worker": worker.containment},
        judge_dumpable=confine.judge_dumpable(),
        key_env=confine.KEY_ENV,
    )


def _vendor_models(models: object | None) -> SearchStrategy[Model] | None:
    """The vendor's models, read now: before the builder's code runs anywhere.

    Read by the extension that reads models (``Extension.models``: in a
    contained child, so the vendor's module never runs in this process).

    Raises:
        OptionError: the models cannot be used, or no extension reads models.
    """
    # models_only without models was refused by RunOptions.validate already.
    if models is None:
        return None
    for extension in extensions():
        if extension.models is not None:
            strategy: SearchStrategy[Model] = extension.models(models)
            return strategy
    raise OptionError(f"models={models!r:.200}: no extension of this kit reads models")
