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
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import attrs
from hypothesis.strategies import SearchStrategy

from conformance.check.catalog import Invariant, catalog
from conformance.check.observations import CoreObservation, builder_spoiled
from conformance.check.waste import WasteMeter
from conformance.contract import version_note
from conformance.generate.coverage import coverage, coverage_sets
from conformance.generate.engine_paths import EnginePath, spell
from conformance.generate.limits import CAPABILITIES, Limits
from conformance.generate.records import Model
from conformance.harness import integrity
from conformance.harness.boundary import prepare
from conformance.harness.guard import Guard, clear_interrupt
from conformance.harness.heap import older_objects_settled
from conformance.harness.hooks import ConstructionFailedError, Context, make_factory
from conformance.harness.lineage import (
    builder_name,
    isolated_resolver,
    parent_builder,
    resolvable_qualname,
)
from conformance.harness.reach import ReachMeter
from conformance.report.model import InvariantResult, Report
from conformance.run.explore import Corpus, Explorer
from conformance.run.findings import Findings, judge_outcome
from conformance.run.focus import REFERENCE, Baseline, Focus, FocusExchange
from conformance.run.options import PROFILES, OptionError, RunOptions, check_device
from conformance.run.shard import order_key
from conformance.run.strata import (
    Stratum,
    draw,
    draw_focus,
    run_strata,
    sample,
    split_by_example,
)
from conformance.run.tally import Tally, select_invariants
from conformance.run.threads import one_torch_thread
from conformance.run.timing import InvariantClock
from conformance.scenarios import registry
from conformance.scenarios.base import undrawable_reason
from conformance.scenarios.examples import Example
from kvref.builder import KVCacheConfigBuilder

__all__ = [
    "PROFILES",
    "InvariantResult",
    "OptionError",
    "Report",
    "RunOptions",
    "UnknownIdWarning",
    "builder_name",
    "check_builder",
    "select_invariants",
]

Progress = Callable[[str, int, int], None]


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
    }
    options = _options(builder, options, name, keywords)
    invariants = catalog()
    options.validate(
        capabilities={c for inv in invariants for c in inv.requires} | set(CAPABILITIES),
        focus_shared=focus_exchange is not None,
    )
    selected = select_invariants(invariants, options.select)
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
    _preflight(builder, guard)
    run = _Run(builder, options, guard, progress)
    run.focus_exchange = focus_exchange
    run.strata = run_strata(vendor, only=options.models_only, limits=run.limits)
    if meter is not None:
        # Isolated, the builder's code runs only in its worker, which traces it;
        # tracing this process's threads too would cost time and find nothing.
        meter.start(trace_here=not isolate)
        if not isolate:
            # In process the builder runs on the guard's threads: traced only if started now.
            guard.renew_threads()
        run.reach_lines = functools.partial(_lines_reached, meter, builder)
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


class _Run(Findings):
    """One run's state: the tallies of every invariant and the examples that broke them."""

    def __init__(
        self,
        builder: KVCacheConfigBuilder | type[KVCacheConfigBuilder],
        options: RunOptions,
        guard: Guard,
        progress: Progress | None,
    ) -> None:
        self.builder = builder
        self.options = options
        self.guard = guard
        self.progress = progress
        # The profiling scenario resolves builders by this name, as vLLM does.
        qualname, note = resolvable_qualname(builder, options.builder)
        self.ctx = Context(
            factory=make_factory(builder, guard),
            guard=guard,
            device=options.device,
            max_alloc_bytes=options.max_alloc_bytes,
            # A builder may bring its own Core (the vLLM adapter runs vLLM's flow).
            core=getattr(builder, "kvref_core", None),
            qualname=qualname,
            qualname_note=note,
            resolver=None if qualname is None else isolated_resolver(builder),
        )
        self.limits = Limits.of(builder, options.unsupported)
        self.tallies: dict[str, Tally] = {}
        self.skipped: dict[str, str] = {}
        self.interrupted = False
        # Where the examples come from (strata.py) and what each scenario drew.
        self.strata: tuple[Stratum, ...] = run_strata(None, only=False, limits=self.limits)
        self.drawn: dict[str, list[Example]] = {}
        self.empty: dict[str, list[str]] = {}
        # Efficiency warnings from the core plans (never a verdict).
        self.waste = WasteMeter.for_builder(builder)
        # Where the builder's answers differed from its parent's or the reference's (focus.py).
        pins = options.focus_pins()
        baseline = REFERENCE if pins is not None else Baseline.of(parent_builder(builder))
        self.focus = Focus(pins, baseline)
        #: Pools the focus with the run's other shards (check_builder(focus_exchange=)).
        self.focus_exchange: FocusExchange | None = None
        #: How many of the builder's lines have run so far (set when reach is measured).
        self.reach_lines: Callable[[], int] = lambda: 0
        self.measures_reach = False
        #: ``{"after": phase, "examples": judged so far, "lines": builder lines run}``.
        self.reach_curve: list[dict[str, Any]] = []
        self.explorer: Explorer | None = None
        self.clock = InvariantClock()  # per-invariant time (run/timing.py)
        #: The share of the run's strata this run judges (``None``: all of them).
        self.shard = options.shard_of()
        #: Examples judged so far per (phase, scenario, stratum): their place in the run.
        self._places: dict[tuple[int, str, str], int] = {}

    def observe(self, scenario: str, example: Example) -> Any:
        return registry.observe_in(self.ctx, scenario, example)

    def execute(self, selected: Sequence[Invariant]) -> None:
        for inv in selected:
            missing = inv.requires & self.limits.lacking
            if missing:
                self.skipped[inv.id] = (
                    f"the builder declares no support for {', '.join(sorted(missing))}"
                )
        active = [inv for inv in selected if inv.id not in self.skipped]
        self.tallies = {inv.id: Tally() for inv in active}
        plan = [
            (s.name, [inv for inv in active if inv.reads(s.name)]) for s in registry.scenarios()
        ]
        plan = [(s, checks) for s, checks in plan if checks]
        total = len(plan) * self.options.max_examples
        for scenario, checks in plan:
            self.ctx = registry.get(scenario).prepare(self.ctx, self.builder, checks)
        from conformance.check.worker import drop_scratch

        explorer = self._explorer(plan)
        try:
            if explorer is not None:
                # An earlier exploration's corpus is judged first (explore.py).
                explorer.replay(explorer.corpus.load())
                drop_scratch()
            for index, (scenario, checks) in enumerate(plan):
                try:
                    self._scenario(scenario, checks, index * self.options.max_examples, total)
                finally:
                    # The tag check's reused backing is for one scenario's examples.
                    drop_scratch()
                self._mark_reach(scenario)
            # Every scenario's focus after every first deal: each learns from all of them.
            if self.focus_exchange is not None and self.focus.given is None:
                # A shard learned from its own families only: pool with the other shards.
                self.focus.adopt(self.focus_exchange(self.focus.pins()))
            for scenario, checks in plan:
                if registry.get(scenario).focused:
                    try:
                        self._scenario(scenario, checks, total, total, focus=self.focus.pins())
                    finally:
                        drop_scratch()
                    self._mark_reach(f"{scenario} focus")
            if explorer is not None and self.options.explore:
                try:
                    explorer.run(self.options.explore, self.options.explore_candidates)
                    self._mark_reach("explore")
                finally:
                    drop_scratch()
                    explorer.corpus.save([ex for _, ex in explorer.kept])
            self._replay(active)
        except KeyboardInterrupt:
            # Ctrl-C: report what was found so far; the rest is inconclusive.
            clear_interrupt()
            self.interrupted = True

    def _mark_reach(self, phase: str) -> None:
        """Note the builder's lines run so far against the examples judged (reach over time)."""
        if self.measures_reach:
            judged = sum(len(examples) for examples in self.drawn.values())
            self.reach_curve.append(
                {"after": phase, "examples": judged, "lines": self.reach_lines()}
            )

    def _explorer(self, plan: Sequence[tuple[str, Sequence[Invariant]]]) -> Explorer | None:
        """The run's exploration, or ``None`` when it neither explores nor has a corpus."""
        if self.shard is not None and self.shard.count > 1:
            # A shard replays no corpus: its examples would be judged by every shard.
            return None
        corpus = Corpus(self.options.database, self.options.builder or repr(self.builder))
        if not self.options.explore and (corpus.path is None or not corpus.path.is_file()):
            return None
        explored = [(s, checks) for s, checks in plan if registry.get(s).explored]

        def judge(stratum: Any, ex: Example) -> None:
            for scenario, checks in explored:
                self._judge_one(scenario, checks, stratum, ex)

        def fresh(round_: int) -> list[tuple[Any, Example]]:
            label = f"explore/{round_}"
            seed, profile = self.options.seed, self.options.profile
            return [
                (stratum, ex)
                for stratum in self.strata
                for ex in sample("placement", stratum, 1, seed, profile, label)
            ]

        self.explorer = Explorer(
            judge=judge,
            lines=self.reach_lines,
            fresh=fresh,
            strata_by_name={s.name: s for s in self.strata},
            limits=self.limits,
            seed=self.options.seed,
            corpus=corpus,
        )
        return self.explorer

    def _scenario(
        self,
        scenario: str,
        checks: Sequence[Invariant],
        done_before: int,
        total: int,
        focus: Mapping[str, frozenset[EnginePath]] | None = None,
    ) -> None:
        """Judge ``scenario``'s first deal, or with ``focus`` its focus (focus.py)."""
        done = done_before
        phase, where = 0 if focus is None else 1, registry.names().index(scenario)
        label = scenario if focus is None else f"{scenario}, focus"
        positions = {s.name: i for i, s in enumerate(self.strata)}

        def judge(stratum: Stratum, ex: Example, first_deal: bool) -> None:
            nonlocal done
            place = (phase, scenario, stratum.name)
            index = self._places[place] = self._places.get(place, -1) + 1
            key = order_key(phase, where, positions[stratum.name], index)
            shard = self.shard
            if shard is None or not split_by_example(stratum) or shard.owns_example(index):
                self._judge_one(scenario, checks, stratum, ex, first_deal=first_deal, key=key)
            done += 1
            if self.progress is not None:
                self.progress(label, min(done, total), total)

        args = (scenario, self.strata, self.options.max_examples, self.options.seed)
        profile, shard = self.options.profile, self.shard
        if focus is None:
            self.empty[scenario] = draw(*args, profile, judge, shard)
            if self.empty[scenario] and not self.drawn.get(scenario):
                # No model of the run can give this builder the scenario's inputs:
                # not a verdict on its answers (contract.md#verdicts).
                why = undrawable_reason(registry.get(scenario), self.empty[scenario], self.limits)
                for inv in checks:
                    if scenario in inv.scenarios:  # not the call invariants, read everywhere
                        self.tallies[inv.id].undrawable(why)
        else:
            self.focus.drew(scenario, draw_focus(*args, profile, judge, focus, shard))

    def _judge_one(
        self,
        scenario: str,
        checks: Sequence[Invariant],
        stratum: Stratum,
        ex: Example,
        *,
        first_deal: bool = False,
        key: tuple[int, ...] | None = None,
    ) -> None:
        """Observe ``ex`` in ``scenario`` and count what each of ``checks`` says of it.

        ``key``: where ``ex`` falls in the whole run's order (shard.order_key).
        """
        self.drawn.setdefault(scenario, []).append(ex)
        seeding = first_deal and self.explorer is not None and bool(self.options.explore)
        before = self.reach_lines() if seeding else 0
        obs = self.clock.observe(scenario, self.observe, scenario, ex)
        if seeding and self.explorer is not None and (gain := self.reach_lines() - before) > 0:
            # The examples that grew reach seed exploration's corpus, as in any fuzzer.
            self.explorer.seed(stratum, ex, gain)
        if first_deal:
            self.focus.note(stratum.name, ex.config, obs)
        if isinstance(obs, CoreObservation):
            self.waste.add(obs, ex)
        for inv in checks:
            failed = self.tallies[inv.id].add(
                self.clock.judge(inv.id, judge_outcome, inv, obs),
                scenario,
                ex,
                primary=scenario == inv.scenario,
                stratum=stratum,
                spoiled=functools.partial(builder_spoiled, obs),
                key=key,
            )
            if failed:
                self.note_introduced(inv, scenario, ex, stratum, key)

    def report(self, selected: Sequence[Invariant], seconds: float) -> Report:
        results = [self._result(inv) for inv in selected]
        return Report(
            builder=self.options.builder or repr(self.builder),
            device=self.options.device,
            seed=self.options.seed,
            profile=self.options.profile,
            max_examples=self.options.max_examples,
            results=tuple(results),
            seconds=seconds,
            options=self.options.as_dict(),
            coverage={s: self._coverage(s) for s in self.drawn.keys() | self.empty.keys()},
            interrupted=self.interrupted,
            waste=self.waste.summary() if "core" in self.drawn else None,
            observe_seconds=self.clock.observe_seconds(),
            warnings=_contract_warnings(),
            focus=spell(self.focus.pins()) or "off",
            shard=self._shard_data(selected),
        )

    def _shard_data(self, selected: Sequence[Invariant]) -> dict[str, Any] | None:
        """What ``merge`` needs of a sharded run (``None``: not sharded)."""
        if self.shard is None:
            return None
        return {
            "index": self.shard.index,
            "count": self.shard.count,
            "tallies": {
                inv.id: self.tallies[inv.id].as_dict() for inv in selected if inv.id in self.tallies
            },
            "coverage": {s: coverage_sets(examples) for s, examples in self.drawn.items()},
            "focus": {s: dict(counts) for s, counts in self.focus.extra.items()},
        }

    def _coverage(self, scenario: str) -> dict[str, Any]:
        covered = coverage(self.drawn.get(scenario, []))
        if self.empty.get(scenario):
            covered["no_valid_examples"] = sorted(self.empty[scenario])
        if self.focus.extra.get(scenario):
            covered["focus"] = dict(self.focus.extra[scenario])
        return covered


def _lines_reached(meter: ReachMeter, builder: object) -> int:
    """The builder's lines run so far, here and in its worker (exploration's signal)."""
    worker = getattr(builder, "_kvref_worker", None)
    if worker is not None:
        meter.add_lines(worker.reach_lines())
    return meter.executed_count()


#: The notes already raised as Python warnings in this process.
_WARNED: set[str] = set()


def _contract_warnings() -> tuple[str, ...]:
    """The installed vLLM's note (:mod:`conformance.contract`), also as a Python warning.

    Every report carries the note; the Python warning is raised once per
    process (a plugin session or a notebook checks many builders).  Python's
    own once-per-place rule does not hold here: the kit's guard and
    Hypothesis change the warning filters, which resets it.
    """
    note = version_note()
    if note is None:
        return ()
    if note not in _WARNED:
        _WARNED.add(note)
        warnings.warn(note, ContractVersionWarning, stacklevel=3)
    return (note,)


class ContractVersionWarning(UserWarning):
    """The installed vLLM is not the release whose contract the kit checks."""
