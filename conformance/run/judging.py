"""One run's judging half: draw each scenario's examples, observe the builder, count verdicts.

:func:`conformance.run.runner.check_builder` makes one :class:`Run` per
call: it judges every scenario's first deal, then the focus, then
exploration's candidates, tallying what each invariant said of each
example; its reporting half (shrinking, replay, results) is
:class:`conformance.run.findings.Findings`.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import attrs

import conformance.extensions.base as ext
from conformance.check.catalog import Invariant
from conformance.check.observations import builder_spoiled
from conformance.contract import contract_name, version_note
from conformance.generate.coverage import coverage
from conformance.generate.limits import Limits
from conformance.harness.builder_identity import (
    is_vllm_native,
    isolated_resolver,
    resolvable_qualname,
)
from conformance.harness.guard import Guard, clear_interrupt
from conformance.harness.hooks import Context, make_factory
from conformance.report.model import Report
from conformance.run.findings import Findings, judge_outcome
from conformance.run.options import RunOptions
from conformance.run.shard import order_key
from conformance.run.strata import (
    Body,
    Stratum,
    draw,
    run_strata,
)
from conformance.run.tally import Tally
from conformance.run.timing import InvariantClock
from conformance.scenarios import registry
from conformance.scenarios.base import undrawable_reason
from conformance.scenarios.examples import Example
from kvref.builder import KVCacheConfigBuilder
from kvref.versions import VllmVersion

__all__ = ["ContractVersionWarning", "Progress", "Run", "run_report"]

_T = TypeVar("_T")

#: Told ``(phase label, examples done, examples in all)`` as the run goes.
Progress = Callable[[str, int, int], None]


class Run(Findings):
    """One run's state: the tallies of every invariant and the examples that broke them."""

    def __init__(
        self,
        builder: KVCacheConfigBuilder | type[KVCacheConfigBuilder],
        options: RunOptions,
        guard: Guard,
        progress: Progress | None,
        active: Sequence[ext.Active] = (),
    ) -> None:
        self.builder, self.options, self.guard, self.progress = builder, options, guard, progress
        #: The extensions taking part in the run, started (extensions/base.py).
        self.active = tuple(active)
        #: What the run shares with its extensions (reach, focus exchange, reproduce lines).
        self.shared = ext.Shared()
        self.ctx = _context(builder, options, guard)
        if is_vllm_native(builder):
            options.check_native()
        #: The vLLM release whose contract the run judges (kvref/versions.py).
        self.vllm = options.vllm_version
        self.limits = Limits.of(builder, options.unsupported, self.vllm)
        self.tallies: dict[str, Tally] = {}
        self.skipped: dict[str, str] = {}
        self.interrupted = False
        self.rejudge: dict[str, Callable[[], Any]] = {}
        # Where the examples come from (strata.py) and what each scenario drew.
        self.strata: tuple[Stratum, ...] = run_strata(None, only=False, limits=self.limits)
        self.drawn: dict[str, list[Example]] = {}
        self.empty: dict[str, list[str]] = {}
        #: The scenarios judged, each with the invariants that read it (:meth:`execute`).
        self.plan: dict[str, Sequence[Invariant]] = {}
        self.clock = InvariantClock()  # per-invariant time (run/timing.py)
        #: Examples judged so far per (phase, scenario, stratum): their place in the run.
        self.places: dict[tuple[int, str, str], int] = {}

    def observe(self, scenario: str, example: Example) -> Any:
        """What the builder does on ``example`` in ``scenario`` (the invariants judge it)."""
        return registry.observe_in(self.ctx, scenario, example)

    def execute(self, selected: Sequence[Invariant]) -> None:
        """Judge ``selected`` in every scenario that reads them: first deals, focus, exploration."""
        self.skipped = _unsupported(selected, self.limits)
        active = [inv for inv in selected if inv.id not in self.skipped]
        self.tallies = {inv.id: Tally() for inv in active}
        plan = _plan(active)
        self.plan = dict(plan)
        total = len(plan) * self.options.max_examples
        for scenario, checks in plan:
            self.ctx = registry.get(scenario).prepare(self.ctx, self.builder, checks)
        from conformance.check.worker import drop_scratch

        try:
            ext.before_deals(self.active, self)
            for index, (scenario, checks) in enumerate(plan):
                try:
                    self._scenario(scenario, checks, index * self.options.max_examples, total)
                finally:
                    # The tag check's reused backing is for one scenario's examples.
                    drop_scratch()
                self.phase_done(scenario)
            # An extension may judge more examples of any scenario now (judge_more).
            ext.after_deals(self.active, self)
            self._replay(active)
        except KeyboardInterrupt:
            # Ctrl-C: report what was found so far; the rest is inconclusive.
            clear_interrupt()
            self.interrupted = True

    def judge_more(self, scenario: str, name: str, deal: Callable[[Body, Any], _T]) -> _T | None:
        """Judge more of ``scenario``'s examples after the first deals (an extension's).

        ``deal(body, deals)`` draws them (strata.draw_pinned), calling ``body``
        on each; they come after every first deal in the run's order and are
        shown as ``name`` (``"<scenario>, <name>"``).  Returns what ``deal``
        returns; ``None`` when the run judges no invariant in ``scenario``.
        """
        from conformance.check.worker import drop_scratch

        if scenario not in self.plan:
            return None
        total = len(self.plan) * self.options.max_examples
        body = _body(self, scenario, self.plan[scenario], total, total, 1, f"{scenario}, {name}")
        try:
            found = deal(body, self._deals)
        finally:
            drop_scratch()
        self.phase_done(f"{scenario} {name}")
        return found

    def _deals(self, stratum: Stratum) -> bool:
        """Whether the run's deals draw ``stratum`` (every extension keeps it)."""
        return ext.deals(self.active, self, stratum)

    def phase_done(self, label: str) -> None:
        """Tell the extensions that the phase ``label`` of examples is judged."""
        ext.after_phase(self.active, self, label)

    def judge_one(self, scenario: str, stratum: Stratum, ex: Example) -> None:
        """Judge ``ex`` in ``scenario`` by the invariants that read it (an extension's example)."""
        self._judge_one(scenario, self.plan[scenario], stratum, ex)

    def _scenario(
        self, scenario: str, checks: Sequence[Invariant], done_before: int, total: int
    ) -> None:
        """Judge ``scenario``'s first deal."""
        judge = _body(self, scenario, checks, done_before, total, 0, scenario)
        args = (scenario, self.strata, self.options.max_examples, self.options.seed)
        self.empty[scenario] = draw(*args, self.options.profile, judge, self._deals)
        if self.empty[scenario] and not self.drawn.get(scenario):
            _undrawable(self, scenario, checks)

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
        judged = ext.Judged(
            scenario=scenario, stratum=stratum, example=ex, observation=None, first_deal=first_deal
        )
        ext.before_example(self.active, self, judged)
        obs = self.clock.observe(scenario, self.observe, scenario, ex)
        ext.after_example(self.active, self, attrs.evolve(judged, observation=obs))
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


def run_report(run: Run, selected: Sequence[Invariant], seconds: float) -> Report:
    """``run``'s report: one result per invariant of ``selected``, and what was drawn."""
    options = run.options
    report = Report(
        builder=options.builder or repr(run.builder),
        device=options.device,
        seed=options.seed,
        profile=options.profile,
        max_examples=options.max_examples,
        results=tuple(run._result(inv) for inv in selected),
        seconds=seconds,
        options=options.as_dict(),
        coverage={s: _coverage(run, s) for s in sorted(run.drawn.keys() | run.empty.keys())},
        interrupted=run.interrupted,
        observe_seconds=run.clock.observe_seconds(),
        warnings=_contract_warnings(run.vllm),
        contract=contract_name(run.vllm),
    )
    done: Report = ext.end(run.active, run, report)
    # An extension's work on an invariant (a replay) is that invariant's time too.
    timed = tuple(attrs.evolve(r, seconds=run.clock.seconds(r.id)) for r in done.results)
    return attrs.evolve(done, results=timed)


def _coverage(run: Run, scenario: str) -> dict[str, Any]:
    covered = coverage(run.drawn.get(scenario, []))
    if run.empty.get(scenario):
        covered["no_valid_examples"] = sorted(run.empty[scenario])
    return covered


def _body(
    run: Run,
    scenario: str,
    checks: Sequence[Invariant],
    done_before: int,
    total: int,
    phase: int,
    label: str,
) -> Body:
    """What judges each example of a deal of ``run``: ``phase`` 0 the first, 1 an extension's."""
    done = done_before
    where = registry.names().index(scenario)
    positions = {s.name: i for i, s in enumerate(run.strata)}

    def judge(stratum: Stratum, ex: Example, first_deal: bool) -> None:
        nonlocal done
        place = (phase, scenario, stratum.name)
        index = run.places[place] = run.places.get(place, -1) + 1
        key = order_key(phase, where, positions[stratum.name], index)
        if ext.judges(run.active, run, stratum, index):
            run._judge_one(scenario, checks, stratum, ex, first_deal=first_deal, key=key)
        done += 1
        if run.progress is not None:
            run.progress(label, min(done, total), total)

    return judge


def _plan(active: Sequence[Invariant]) -> list[tuple[str, list[Invariant]]]:
    """The scenarios that ``active`` invariants read, in order, each with those that read it."""
    plan = [(s.name, [inv for inv in active if inv.reads(s.name)]) for s in registry.scenarios()]
    return [(s, checks) for s, checks in plan if checks]


def _undrawable(run: Run, scenario: str, checks: Sequence[Invariant]) -> None:
    """Tally ``checks`` undrawable: no model of ``run`` can give the builder ``scenario``'s inputs.

    Not a verdict on the builder's answers (contract.md#verdicts).
    """
    why = undrawable_reason(registry.get(scenario), run.empty[scenario], run.limits)
    for inv in checks:
        if scenario in inv.scenarios:  # not the call invariants, read everywhere
            run.tallies[inv.id].undrawable(why)


def _context(
    builder: KVCacheConfigBuilder | type[KVCacheConfigBuilder], options: RunOptions, guard: Guard
) -> Context:
    """The harness context the run's scenarios call the builder through."""
    # The profiling scenario resolves builders by this name, as vLLM does.
    qualname, note = resolvable_qualname(builder, options.builder)
    return Context(
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


def _unsupported(selected: Sequence[Invariant], limits: Limits) -> dict[str, str]:
    """Per invariant of ``selected`` that needs what the builder declares it lacks: why."""
    skipped = {}
    for inv in selected:
        missing = inv.requires & limits.lacking
        if missing:
            skipped[inv.id] = f"the builder declares no support for {', '.join(sorted(missing))}"
    return skipped


#: The notes already raised as Python warnings in this process.
_WARNED: set[str] = set()


def _contract_warnings(judged: VllmVersion) -> tuple[str, ...]:
    """The installed vLLM's note (:mod:`conformance.contract`), also as a Python warning.

    Every report carries the note; the Python warning is raised once per
    process (a plugin session or a notebook checks many builders).  Python's
    own once-per-place rule does not hold here: the kit's guard and
    Hypothesis change the warning filters, which resets it.
    """
    note = version_note(judged)
    if note is None:
        return ()
    if note not in _WARNED:
        _WARNED.add(note)
        warnings.warn(note, ContractVersionWarning, stacklevel=3)
    return (note,)


class ContractVersionWarning(UserWarning):
    """The installed vLLM is not the release whose contract the kit checks."""
