"""Coverage-guided exploration (``--explore SECONDS``; explorer.py says how it works).

The extension's hooks: before the first deals, judge the corpus an earlier
exploration saved; around each first-deal example, seed the corpus with
the examples that reached new lines of the builder; after the deals,
explore and save the corpus; at the end, the report's ``reach.explore``.
A failure found on one of its examples is reproduced from the report's
data, since a run of one invariant would not follow the same reach.
"""

from __future__ import annotations

from typing import Any

import attrs

from conformance.extensions.base import Extension, Judged, RunView, run_option
from conformance.extensions.explore.corpus import Corpus, check_corpus
from conformance.extensions.explore.explorer import Explorer
from conformance.run.strata import sample
from conformance.scenarios import registry
from conformance.scenarios.examples import Example

__all__ = ["EXPLORE", "ExploreOptions"]


@attrs.frozen(kw_only=True)
class ExploreOptions:
    """The exploration extension's options: the run's options of the same names.

    Attributes:
        explore: seconds of exploration after the deals (0: none; the saved
            corpus is still judged first).
        explore_candidates: stop after this many candidates (``None``: time only).
    """

    explore: float = run_option("explore")
    explore_candidates: int | None = run_option("explore_candidates")


@attrs.define
class _State:
    """The run's explorer (``None``: the run neither explores nor has a corpus)."""

    explorer: Explorer | None = None
    #: The builder's lines run before the example being observed (seeding only).
    lines_before: int = 0


def _start(_run_options: Any, _options: ExploreOptions) -> _State:
    return _State()


def _explorer(run: RunView) -> Explorer | None:
    """The run's exploration, or ``None`` when it neither explores nor has a corpus."""
    options = run.options
    shard = options.shard_of()
    if shard is not None and shard.count > 1:
        # A shard replays no corpus: its examples would be judged by every shard.
        return None
    corpus = Corpus(options.database, options.builder or repr(run.builder))
    if not options.explore and (corpus.path is None or not corpus.path.is_file()):
        return None
    explored = [s for s in run.plan if registry.get(s).explored]

    def judge(stratum: Any, ex: Example) -> None:
        for scenario in explored:
            run.judge_one(scenario, stratum, ex)

    def fresh(round_: int) -> list[tuple[Any, Example]]:
        label = f"explore/{round_}"
        return [
            (stratum, ex)
            for stratum in run.strata
            for ex in sample("placement", stratum, 1, options.seed, options.profile, label)
        ]

    return Explorer(
        judge=judge,
        lines=run.shared.reach_lines,
        fresh=fresh,
        strata_by_name={s.name: s for s in run.strata},
        limits=run.limits,
        seed=options.seed,
        corpus=corpus,
    )


def _reproduce(explorer: Explorer, invariant: str, example: Any) -> str | None:
    if not explorer.owns(example):
        return None
    # Exploration follows this run's reach, which a run of one invariant
    # would not repeat: its example is replayed from the report's data.
    return (
        'python -c "import conformance; print(conformance.reproduce('
        f"'REPORT.json', '{invariant}'))\"  # REPORT.json: this run's --json report"
    )


def _before_deals(state: _State, run: RunView) -> None:
    from conformance.check.worker import drop_scratch

    state.explorer = explorer = _explorer(run)
    if explorer is None:
        return
    run.shared.reproduce_by.append(
        lambda invariant, example: _reproduce(explorer, invariant, example)
    )
    # An earlier exploration's corpus is judged first.
    explorer.replay(explorer.corpus.load())
    drop_scratch()


def _seeding(state: _State, run: RunView, judged: Judged) -> bool:
    return judged.first_deal and state.explorer is not None and bool(run.options.explore)


def _before_example(state: _State, run: RunView, judged: Judged) -> None:
    if _seeding(state, run, judged):
        state.lines_before = run.shared.reach_lines()


def _after_example(state: _State, run: RunView, judged: Judged) -> None:
    if not _seeding(state, run, judged) or state.explorer is None:
        return
    gain = run.shared.reach_lines() - state.lines_before
    if gain > 0:
        # The examples that grew reach seed exploration's corpus, as in any fuzzer.
        state.explorer.seed(judged.stratum, judged.example, gain)


def _after_deals(state: _State, run: RunView) -> None:
    from conformance.check.worker import drop_scratch

    explorer, options = state.explorer, run.options
    if explorer is None or not options.explore:
        return
    try:
        explorer.run(options.explore, options.explore_candidates)
        run.phase_done("explore")
    finally:
        drop_scratch()
        explorer.corpus.save([ex for _, ex in explorer.kept])


def _end(state: _State, run: RunView, report: Any) -> Any:
    if report.reach is None or state.explorer is None:
        return report
    reach = {**report.reach, "explore": state.explorer.summary.as_dict()}
    return attrs.evolve(report, reach=reach)


EXPLORE = Extension(
    name="explore",
    check=check_corpus,
    options=ExploreOptions,
    start=_start,
    before_deals=_before_deals,
    before_example=_before_example,
    after_example=_after_example,
    after_deals=_after_deals,
    end=_end,
)
