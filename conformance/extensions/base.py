"""What an extension is: an optional mechanism of a run, told of the run's phases by hooks.

The core of a run draws each scenario's examples, observes the builder on
each, lets the invariants judge the observation and tallies their verdicts
(:mod:`conformance.run.judging`).  Everything a run may do besides (measure
waste, replay failures, ...) is an :class:`Extension`: a record of hooks the
core calls at fixed points, in the order of
:data:`conformance.extensions.registry.EXTENSIONS`.  The core never names an
extension (``tests/test_imports.py``), so an extension is one folder under
``conformance/extensions/`` that a maintainer can delete and a vendor can ignore.

An extension may also add invariants the core judges (the device checks, the
serving simulation): its scenarios and check modules, listed in
:data:`conformance.extensions.contributions.CONTRIBUTIONS`, which the
catalog and the scenarios' registry read.

An extension's state for one run is whatever its :attr:`Extension.start`
returns (``None``: it sits this run out); every later hook is given that
state first.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

import attrs

__all__ = [
    "Active",
    "Extension",
    "Judged",
    "RunView",
    "Shared",
    "after_deals",
    "after_example",
    "after_phase",
    "before_deals",
    "before_example",
    "check_all",
    "deals",
    "judges",
    "end",
    "options_of",
    "render",
    "run_option",
    "start_all",
]


class RunView(Protocol):
    """What the core's run shows its extensions (:class:`conformance.run.judging.Run`)."""

    @property
    def builder(self) -> Any:
        """The builder under check, as prepared for the run."""

    @property
    def options(self) -> Any:
        """The run's options (:class:`conformance.run.options.RunOptions`)."""

    @property
    def guard(self) -> Any:
        """The run's guard: ``guard.hung`` is set once the builder hung."""

    @property
    def interrupted(self) -> bool:
        """Whether the run was stopped (Ctrl-C)."""

    @property
    def drawn(self) -> Mapping[str, Any]:
        """The examples judged so far, per scenario."""

    @property
    def strata(self) -> Any:
        """Where the run's examples come from (``conformance.run.strata``)."""

    @property
    def shared(self) -> Shared:
        """What the run shares with its extensions besides its judging (:class:`Shared`)."""

    def judge_more(self, scenario: str, name: str, deal: Callable[[Any, Any], Any]) -> Any:
        """Judge more of ``scenario``'s examples, drawn by ``deal(body, shard)``."""

    def judge_one(self, scenario: str, stratum: Any, ex: Any) -> None:
        """Judge ``ex`` in ``scenario`` by the invariants that read it."""

    def phase_done(self, label: str) -> None:
        """Tell the extensions that the phase ``label`` of examples is judged."""

    @property
    def plan(self) -> Mapping[str, Any]:
        """The scenarios the run judges, each with the invariants that read it."""

    @property
    def limits(self) -> Any:
        """What the builder cannot be given (``conformance.generate.limits.Limits``)."""

    @property
    def tallies(self) -> Mapping[str, Any]:
        """Per invariant judged, its tally (``conformance.run.tally.Tally``)."""

    @property
    def rejudge(self) -> Mapping[str, Callable[[], Any]]:
        """Per failed invariant: its minimal counterexample observed and judged afresh."""

    def observe(self, scenario: str, example: Any) -> Any:
        """What the builder does on ``example`` in ``scenario``."""


def _no_lines() -> int:
    return 0


@attrs.define(kw_only=True)
class Shared:
    """What a run shares with its extensions besides its judging (``RunView.shared``).

    The run's driver sets the first three (``conformance.run.runner``); the
    extensions that learn a reproduce line fill in the last two, which the
    core's reporting reads (``conformance.run.findings``).

    Attributes:
        focus_exchange: pools what a shard learned of the focus with the other
            shards' (``check_builder(focus_exchange=)``; ``None``: none).
        meter: the run's reach meter (``conformance.harness.reach``; ``None``:
            reach is not measured).
        reach_lines: how many of the builder's lines have run so far (0 where
            reach is not measured).
        reproduce_with: per run option, its value for a reproduce line, as an
            extension learned it.
        reproduce_by: per extension that draws examples, its reproduce line
            for one of them (or ``None``).
    """

    focus_exchange: Callable[[Any], Any] | None = None
    meter: Any = None
    reach_lines: Callable[[], int] = _no_lines
    reproduce_with: dict[str, Callable[[], Any]] = attrs.field(factory=dict)
    reproduce_by: list[Callable[[str, Any], str | None]] = attrs.field(factory=list)


@attrs.frozen(kw_only=True)
class Judged:
    """One example the core observes (:attr:`Extension.after_example`'s argument).

    Attributes:
        scenario: the scenario that observed it.
        stratum: the stratum that drew it.
        example: the example.
        observation: what the builder did on it.
        first_deal: whether it is of a scenario's first deal.
    """

    scenario: str
    stratum: Any
    example: Any
    observation: Any
    first_deal: bool


def _start_with_options(_run_options: Any, options: Any) -> Any:
    return True if options is None else options


@attrs.frozen(kw_only=True)
class Extension:
    """One optional mechanism of a run, as hooks the core calls.

    Attributes:
        name: the extension's name (its folder under ``conformance/extensions/``).
        check: ``check(run options)``, when the front ends check a run's
            options, before anything starts: raises an ``OptionError`` for
            what the extension would read that cannot be used (a usage error).
        options: its options record (an attrs class whose fields are read,
            by name, from the run's options: :func:`options_of`; each
            field's ``metadata`` holds its ``flag`` and ``help``), or ``None``.
        start: ``start(run options, own options) -> state``, called once at
            the start of a run, before the builder's worker starts; ``None``
            leaves the extension out of the run.  Default: its options are
            its state (``True`` when it has none).
        deals: ``deals(state, run, stratum) -> bool``, a filter on the deal:
            whether the run's deals draw ``stratum`` at all (a shard draws
            its own strata).
        judges: ``judges(state, run, stratum, index) -> bool``, a filter on
            the deal: whether the run judges the ``index``-th example a deal
            drew of ``stratum``.
        before_deals: ``before_deals(state, run)``, before the first deals;
            the extension may have examples judged here (``run.judge_one``).
        before_example: ``before_example(state, run, judged)``, before the
            core observes one example (``judged.observation`` is ``None``).
        after_example: ``after_example(state, run, judged)``, once the core
            observed one example, before its invariants judge the observation
            (:class:`Judged`).
        after_phase: ``after_phase(state, run, label)``, after each phase of
            examples: a scenario's first deal (``label``: the scenario), its
            focus (``"<scenario> focus"``) and exploration (``"explore"``).
        after_deals: ``after_deals(state, run)``, after every scenario's first
            deal; the extension may have more examples judged here.
        end: ``end(state, run, report) -> report``, at the end of the run:
            the report with the extension's fields filled in.
        render: ``render(report) -> lines``, its section of the text report
            (``conformance.report.render.format_report``), read from the
            fields its ``end`` filled in; each section starts with its blank
            line.  Called for every extension, whether it took part in the
            run or not: a report is also rendered after a merge, from JSON.
        models: ``models(spec) -> strategy of models``, the run's own models
            (its ``vendor`` stratum) from the run's ``models`` option or the
            object given to ``check_builder(models=)``; called before the
            builder's worker starts, only when models are given; raises an
            ``OptionError`` for a spec that cannot be used.
    """

    name: str
    check: Callable[[Any], None] | None = None
    options: type[Any] | None = None
    start: Callable[[Any, Any], Any] = _start_with_options
    deals: Callable[[Any, RunView, Any], bool] | None = None
    judges: Callable[[Any, RunView, Any, int], bool] | None = None
    before_deals: Callable[[Any, RunView], None] | None = None
    before_example: Callable[[Any, RunView, Judged], None] | None = None
    after_example: Callable[[Any, RunView, Judged], None] | None = None
    after_phase: Callable[[Any, RunView, str], None] | None = None
    after_deals: Callable[[Any, RunView], None] | None = None
    end: Callable[[Any, RunView, Any], Any] | None = None
    render: Callable[[Any], list[str]] | None = None
    models: Callable[[Any], Any] | None = None


def run_option(name: str) -> Any:
    """A field of an extension's options record that is the run's option ``name``.

    Its default and its metadata (the flag the CLI and the plugin spell) are
    the run's option's: an option is declared once, in
    :class:`~conformance.run.options.RunOptions`.
    """
    from conformance.run.options import RunOptions

    field = attrs.fields_dict(RunOptions)[name]
    return attrs.field(default=field.default, metadata=field.metadata)


def options_of(extension: Extension, run_options: Any) -> Any:
    """``extension``'s options record, its fields read from ``run_options`` by name."""
    if extension.options is None:
        return None
    names = [f.name for f in attrs.fields(extension.options)]
    return extension.options(**{n: getattr(run_options, n) for n in names})


@attrs.frozen
class Active:
    """An extension that takes part in one run, with its state for that run."""

    extension: Extension
    state: Any


def check_all(extensions: Iterable[Extension], run_options: Any) -> None:
    """Let every one of ``extensions`` refuse what a run of ``run_options`` would read."""
    for extension in extensions:
        if extension.check is not None:
            extension.check(run_options)


def start_all(extensions: Iterable[Extension], run_options: Any) -> tuple[Active, ...]:
    """Start every one of ``extensions`` for a run of ``run_options``: those that take part."""
    active = []
    for extension in extensions:
        state = extension.start(run_options, options_of(extension, run_options))
        if state is not None:
            active.append(Active(extension, state))
    return tuple(active)


def deals(active: Iterable[Active], run: RunView, stratum: Any) -> bool:
    """Whether the run's deals draw ``stratum``: no active extension leaves it out."""
    return all(
        a.extension.deals(a.state, run, stratum) for a in active if a.extension.deals is not None
    )


def judges(active: Iterable[Active], run: RunView, stratum: Any, index: int) -> bool:
    """Whether the run judges the ``index``-th example of ``stratum``: no extension leaves it."""
    return all(
        a.extension.judges(a.state, run, stratum, index)
        for a in active
        if a.extension.judges is not None
    )


def _tell(
    active: Iterable[Active], hook: Callable[[Extension], Callable[..., None] | None], *args: Any
) -> None:
    """Call ``hook`` of every active extension that has it, with its state and ``args``."""
    for a in active:
        call = hook(a.extension)
        if call is not None:
            call(a.state, *args)


def before_deals(active: Iterable[Active], run: RunView) -> None:
    """Tell every active extension that the first deals start."""
    _tell(active, lambda e: e.before_deals, run)


def before_example(active: Iterable[Active], run: RunView, judged: Judged) -> None:
    """Tell every active extension of one example about to be observed."""
    _tell(active, lambda e: e.before_example, run, judged)


def after_example(active: Iterable[Active], run: RunView, judged: Judged) -> None:
    """Tell every active extension of one judged example."""
    _tell(active, lambda e: e.after_example, run, judged)


def after_phase(active: Iterable[Active], run: RunView, label: str) -> None:
    """Tell every active extension that the phase ``label`` of examples is judged."""
    _tell(active, lambda e: e.after_phase, run, label)


def after_deals(active: Iterable[Active], run: RunView) -> None:
    """Tell every active extension that every scenario's first deal is judged."""
    _tell(active, lambda e: e.after_deals, run)


def end(active: Iterable[Active], run: RunView, report: Any) -> Any:
    """The run's report, with every active extension's fields filled in (phase order)."""
    for a in active:
        if a.extension.end is not None:
            report = a.extension.end(a.state, run, report)
    return report


def render(extensions: Iterable[Extension], report: Any) -> list[str]:
    """The text report's sections of ``extensions``, in their order (phase order)."""
    return [line for e in extensions if e.render is not None for line in e.render(report)]
