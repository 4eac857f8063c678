"""Focus: more examples where the builder's own code acts (answers.py says why and how).

The extension's hooks: after each example of a first deal, note whether the
builder answered otherwise than its baseline; after every first deal, pool
what the run's shards learned (``check_builder(focus_exchange=)``) and have
every scenario declared ``focused`` judge its focus
(:data:`~conformance.extensions.focus.answers.FOCUS_SHARE` more examples on
the families and engine paths learned); at the end, the report's ``focus``,
each scenario's ``coverage.focus`` and a shard's ``shard.focus``.  A
reproduce line names the run's focus, which a run of one invariant could
not learn.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from conformance.extensions.base import Extension, Judged, RunView, run_option
from conformance.extensions.focus.answers import FOCUS_SHARE, REFERENCE, Baseline, Focus
from conformance.generate.engine_paths import EnginePath, spell
from conformance.harness.builder_identity import parent_builder
from conformance.run.strata import Body, draw_pinned
from conformance.scenarios import registry

__all__ = ["FOCUS", "FocusOptions"]


@attrs.frozen(kw_only=True)
class FocusOptions:
    """The focus extension's options: the run's options of the same names.

    Attributes:
        focus: where the run draws its extra examples (``None``: learned;
            ``"off"``; or the pins ``family=PATH,...;...``), read by
            ``RunOptions.focus_pins``.
    """

    focus: str | None = run_option("focus")


@attrs.define
class _State:
    """The focus given (``--focus``; ``None``: learn it) and, once the run judges, the focus."""

    given: Mapping[str, frozenset[EnginePath]] | None
    focus: Focus | None = None

    def of(self, run: RunView) -> Focus:
        """The run's focus, made at its first use (its baseline is the prepared builder's)."""
        if self.focus is None:
            parent = None if self.given is not None else parent_builder(run.builder)
            focus = Focus(self.given, REFERENCE if parent is None else Baseline.of(parent))
            run.shared.reproduce_with["focus"] = lambda: spell(focus.pins()) or None
            self.focus = focus
        return self.focus


def _start(run_options: Any, _options: FocusOptions) -> _State:
    # The run's options read (and validated) the pins.
    return _State(given=run_options.focus_pins())


def _after_example(state: _State, run: RunView, judged: Judged) -> None:
    if judged.first_deal:
        state.of(run).note(judged.stratum.name, judged.example.config, judged.observation)


def _after_deals(state: _State, run: RunView) -> None:
    # Every scenario's focus after every first deal: each learns from all of them.
    focus = state.of(run)
    if run.shared.focus_exchange is not None and focus.given is None:
        # A shard learned from its own families only: pool with the other shards.
        focus.adopt(run.shared.focus_exchange(focus.pins()))
    pins, options = focus.pins(), run.options
    count = max(1, int(options.max_examples * FOCUS_SHARE))
    for scenario in (s.name for s in registry.scenarios() if s.focused):

        def deal(body: Body, deals: Any, scenario: str = scenario) -> list[tuple[str, int]]:
            return draw_pinned(
                scenario,
                run.strata,
                count,
                options.seed,
                options.profile,
                body,
                pins,
                deals,
                label=f"{scenario}/focus",
            )

        counts = run.judge_more(scenario, "focus", deal)
        if counts is not None:
            focus.drew(scenario, counts)


def _end(state: _State, run: RunView, report: Any) -> Any:
    pins = dict(state.given or {}) if state.focus is None else state.focus.pins()
    extra = {} if state.focus is None else state.focus.extra
    coverage = {
        s: {**covered, "focus": dict(extra[s])} if extra.get(s) else covered
        for s, covered in report.coverage.items()
    }
    shard = report.shard
    if shard is not None:
        shard = {**shard, "focus": {s: dict(counts) for s, counts in extra.items()}}
    return attrs.evolve(report, focus=spell(pins) or "off", coverage=coverage, shard=shard)


FOCUS = Extension(
    name="focus",
    options=FocusOptions,
    start=_start,
    after_example=_after_example,
    after_deals=_after_deals,
    end=_end,
)
