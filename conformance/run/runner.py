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
from collections.abc import Iterable, Sequence
from typing import Any

import attrs
from hypothesis.strategies import SearchStrategy

from conformance.check.catalog import Invariant, catalog
from conformance.generate.limits import CAPABILITIES
from conformance.generate.records import Model
from conformance.harness import integrity
from conformance.harness.boundary import prepare
from conformance.harness.guard import Guard
from conformance.harness.heap import older_objects_settled
from conformance.harness.hooks import ConstructionFailedError, make_factory
from conformance.harness.lineage import (
    builder_name,
)
from conformance.report.model import InvariantResult, Report
from conformance.run.focus import FocusExchange
from conformance.run.judging import ContractVersionWarning, Progress, Run, lines_reached
from conformance.run.options import PROFILES, OptionError, RunOptions, check_device
from conformance.run.strata import (
    run_strata,
)
from conformance.run.tally import select_invariants
from conformance.run.threads import one_torch_thread
from kvref.builder import KVCacheConfigBuilder

__all__ = [
    "PROFILES",
    "ContractVersionWarning",
    "InvariantResult",
    "OptionError",
    "Report",
    "RunOptions",
    "UnknownIdWarning",
    "builder_name",
    "check_builder",
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


def check_builder(
    builder: KVCacheConfigBuilder | type[KVCacheConfigBuilder] | str,
    options: RunOptions | None = None,
    *,
    progress: Progress | None = None,
    name: str | None = None,
    models: object | None = None,
    device: str | None = None,
    max_examples: int | None = None,
    seed: int | None = None,
    select: Iterable[str] | None = None,
    xfail: Iterable[str] | None = None,
    timeout: float | None = None,
    unsupported: Iterable[str] | None = None,
    profile: str | None = None,
    max_alloc_bytes: int | None = None,
    shrink: bool | None = None,
    database: str | None = None,
    isolate: bool | None = None,
    reach: bool | Sequence[str] | None = None,
    min_reach: float | None = None,
    models_only: bool | None = None,
    replays: int | None = None,
    worker_memory: float | None = None,
    focus: str | None = None,
    explore: float | None = None,
    explore_candidates: int | None = None,
    shard: str | None = None,
    vllm: str | None = None,
    focus_exchange: FocusExchange | None = None,
) -> Report:
    """Check ``builder`` against the invariant catalog and return a :class:`Report`.

    The run's options are one :class:`~conformance.run.options.RunOptions`:
    ``options`` as the CLI and the plugin pass it, or built from the keywords
    (a keyword left out, or ``None``, takes the kit's default, the same on
    every front end).  Keywords given with ``options`` replace its values.

    Args:
        builder: the builder's importable name (``module:Class`` or
            ``path/to/file.py:Class``; isolated, its module is imported only
            in the worker process, never in the caller's), or a builder
            class (instantiated afresh where vLLM would) or instance.
        options: the whole run's options (default: from the keywords).
        progress: called as ``progress(scenario, done, total)``.
        name: the builder's importable name in the report and its reproduce lines.
        models: the vendor's models, mixed into generation: ``"module:attr"``, a
            JSON file path, or the object itself
            (:func:`conformance.generate.vendor.load_models`).
        device: torch device for the device invariants (``cpu``, the default;
            ``cuda``, ``meta``...); one torch cannot use is an :class:`OptionError`.
        max_examples: examples per scenario (default: the profile's; must be >= 1).
        seed: makes the run reproducible (random if ``None``; the report says which).
        select: invariant ids or id prefixes to run (default: all; never empty).
        xfail: ids expected to fail; a failure is reported as XFAIL, a pass as XPASS.
        timeout: per-call deadline in seconds for every builder hook (default 10).
        unsupported: capabilities the builder lacks (e.g. ``host_resident``), in
            addition to its ``kvref_unsupported`` attribute.
        profile: ``ci`` (fast, the default) or ``thorough``.
        max_alloc_bytes: cap of any single device allocation of the device checks.
        shrink: shrink failures to minimal counterexamples (default ``True``).
        database: directory of a Hypothesis example database: counterexamples of
            earlier runs are replayed first and new ones are saved there
            (default: none).
        isolate: run the builder's hooks in a worker process (the default;
            :func:`conformance.harness.isolate.isolated`): a hook that ends or crashes
            the process, or patches the kit, is reported as the builder's failure,
            and its answers reach the kit as data.  ``False`` runs it in this
            process, for debugging only: a builder can then patch the kit.
        reach: measure which lines of the builder's own code the run executed
            (``True``: its class's module and package; or module names;
            ``False``: not); default: measured when coverage.py is installed.
        min_reach: fail the run when less than this percentage of those lines ran.
        models_only: generate from ``models`` alone.
        replays: how many times each failure's minimal counterexample is
            judged again, to tell deterministic failures from flaky ones
            (default 2; 0: none).
        worker_memory: GiB of private memory the isolated worker may take over
            its size at start (default 16): a hook that leaks past it fails
            ``KV-CALL-RAISES`` with the limit named.
        focus: where the run draws extra examples (:mod:`conformance.run.focus`):
            ``None`` learns it from where the builder's answers differ from the
            reference's, ``"off"`` draws none, ``family=PATH,...;...`` replays a
            report's (its reproduce lines carry it).
        explore: seconds of coverage-guided exploration after the run
            (:mod:`conformance.run.explore`; default 0: none).  Needs reach
            measured; its corpus is saved in ``database`` and judged first next time.
        explore_candidates: stop exploring after this many candidates (the
            time limit still holds): a reproducible exploration.
        shard: ``"I/N"``: judge only the I-th of N shares of the run's strata
            (needs ``focus`` given); :func:`conformance.merge.merge_reports`
            joins the N reports into the whole run's (docs/vendors.md#shards).
        vllm: the vLLM release whose contract the run judges (``"0.33"``,
            ``"0.34.0"``; default: the installed vLLM when supported, else the
            newest; a vLLM-native builder only under the installed one).
        focus_exchange: for the shards of one run made at the same time (the
            pytest plugin under pytest-xdist): called once, after the first
            deals, with what this shard learned of the focus; returns the union
            over every shard, which the shard then draws.  With it, a shard
            may learn the focus (``focus`` left ``None``).

    Raises:
        OptionError: an option has an unusable value (a ``ValueError``; the
            device included), or the builder class cannot be constructed at
            all; raised before any example runs.
    """
    started = time.perf_counter()
    keywords = {
        "device": device,
        "max_examples": max_examples,
        "seed": seed,
        "select": select,
        "xfail": xfail,
        "timeout": timeout,
        "unsupported": unsupported,
        "profile": profile,
        "max_alloc_bytes": max_alloc_bytes,
        "shrink": shrink,
        "database": database,
        "isolate": isolate,
        "reach": reach,
        "min_reach": min_reach,
        "models": _models_label(models),
        "models_only": models_only,
        "replays": replays,
        "worker_memory": worker_memory,
        "focus": focus,
        "explore": explore,
        "explore_candidates": explore_candidates,
        "shard": shard,
        "vllm": vllm,
    }
    options = _options(builder, options, name, keywords)
    invariants = catalog()
    options.validate(
        capabilities={c for inv in invariants for c in inv.requires} | set(CAPABILITIES),
        focus_shared=focus_exchange is not None,
    )
    selected = select_invariants(invariants, options.select)
    options.vllm_version  # noqa: B018 - one release a run: 'all' is refused here
    check_device(options.device)
    known = {inv.id for inv in invariants}
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

    Isolated, from before the builder's worker starts to the report, the
    run imports no code that changed since (harness/integrity.py); the
    vendor's models are read before.
    """
    vendor = _vendor_models(options.models if models is None else models)
    since = None
    if options.isolate:
        since = integrity.mark()
        # A proxy the caller isolated (the plugin keeps one per session) started earlier.
        started_at = getattr(getattr(builder, "_kvref_worker", None), "marked", None)
        if isinstance(started_at, int):
            since = min(since, started_at)
    with integrity.guarded(since), older_objects_settled():
        return _check_guarded(builder, options, selected, progress, vendor, started, focus_exchange)


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
    builder, meter = prepared.builder, prepared.meter
    try:
        return _run_prepared(
            builder, meter, options, guard, selected, progress, vendor, started, focus_exchange
        )
    finally:
        if prepared.owned:
            # The worker this run started ends with it: a caller that checks many
            # builders (a test suite, a notebook) would otherwise keep one per run.
            builder.close()  # type: ignore[union-attr]


def _run_prepared(
    builder: Any,
    meter: Any,
    options: RunOptions,
    guard: Guard,
    selected: Sequence[Invariant],
    progress: Progress | None,
    vendor: SearchStrategy[Model] | None,
    started: float,
    focus_exchange: FocusExchange | None,
) -> Report:
    isolate = options.isolate
    _preflight(builder, guard)
    run = Run(builder, options, guard, progress)
    run.focus_exchange = focus_exchange
    run.strata = run_strata(vendor, only=options.models_only, limits=run.limits)
    if meter is not None:
        # Isolated, the builder's code runs only in its worker, which traces it;
        # tracing this process's threads too would cost time and find nothing.
        meter.start(trace_here=not isolate)
        if not isolate:
            # In process the builder runs on the guard's threads: traced only if started now.
            guard.renew_threads()
        run.reach_lines = functools.partial(lines_reached, meter, builder)
        run.measures_reach = True
    try:
        run.execute(selected)
    finally:
        if meter is not None:
            meter.stop()
            worker = getattr(builder, "_kvref_worker", None)
            if worker is not None:
                meter.add_lines(worker.reach_lines())
    try:
        report = run.report(selected, time.perf_counter() - started)
    finally:
        from conformance.harness.twin import close_twin

        # The run's twin process ends with the run, not whenever its guard is collected.
        close_twin(run.ctx)
    if meter is not None:
        reach = meter.summary()
        reach["over_time"] = run.reach_curve
        if run.explorer is not None:
            reach["explore"] = run.explorer.summary.as_dict()
        report = attrs.evolve(report, reach=reach)
    worker = getattr(builder, "_kvref_worker", None)
    if worker is not None:
        report = attrs.evolve(report, builder_output=worker.output_tail())
    return report


def _vendor_models(models: object | None) -> SearchStrategy[Model] | None:
    """The vendor's models, read now: before the builder's code runs anywhere."""
    # models_only without models was refused by RunOptions.validate already.
    from conformance.generate.vendor import VendorModelError, load_models

    try:
        return None if models is None else load_models(models)
    except VendorModelError as exc:
        raise OptionError(str(exc)) from None
