"""What a run reports of each invariant: verdicts, failures, their shrinking and replay.

A run (:class:`conformance.run.judging.Run`) judges examples; this part turns
its tallies into results: a failure's minimal counterexample (shrunk by its
stratum's strategy), its reproduce line, whether the builder's parent or
vLLM's default fails the same way, and the saved counterexamples replayed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs
import hypothesis
from hypothesis.database import DirectoryBasedExampleDatabase, ExampleDatabase

from conformance.check.catalog import Invariant, Unjudged
from conformance.extensions.base import Shared
from conformance.harness.builder_identity import (
    builder_name,
    is_vllm_native,
    parent_builder,
    resolvable_qualname,
    vllm_default_builder,
)
from conformance.harness.guard import Guard, clear_interrupt
from conformance.harness.hooks import (
    Context,
    call_grouping,
    make_factory,
    valid_groups,
)
from conformance.report.model import InvariantResult
from conformance.report.records import example_data
from conformance.run.options import RunOptions
from conformance.run.search import Namespaced, search
from conformance.run.shard import order_key
from conformance.run.strata import Stratum, stratum_seed
from conformance.run.tally import Tally, expected_status, verdict
from conformance.run.timing import InvariantClock
from conformance.scenarios.examples import Example
from conformance.scenarios.registry import observe_in
from conformance.upstream import matching_defect
from kvref.builder import KVCacheConfigBuilder

__all__ = ["Findings", "judge_outcome"]

#: The scenarios that place the builder's own groups: placement and device
#: (scenarios.observe_placement), and Core's flow, which projects and places them.
_PLACING = frozenset({"placement", "device", "core"})


class Findings:
    """The reporting half of a run (:class:`conformance.run.judging.Run` is the judging half)."""

    builder: KVCacheConfigBuilder | type[KVCacheConfigBuilder]
    options: RunOptions
    guard: Guard
    tallies: dict[str, Tally]
    skipped: dict[str, str]
    strata: tuple[Stratum, ...]
    drawn: dict[str, list[Example]]
    empty: dict[str, list[str]]
    #: What the run shares with its extensions: their reproduce lines among it.
    shared: Shared
    clock: InvariantClock
    interrupted: bool
    ctx: Context
    #: Per failed invariant: its minimal counterexample observed and judged afresh.
    rejudge: dict[str, Callable[[], Any]]

    def observe(self, scenario: str, example: Example) -> Any:
        """Observe ``example`` in ``scenario`` (the judging half's)."""
        raise NotImplementedError

    def _database(self, inv: Invariant, stratum: Stratum) -> ExampleDatabase | None:
        if self.options.database is None:
            return None
        store = DirectoryBasedExampleDatabase(self.options.database)
        return Namespaced(store, f"{self.options.builder}|{inv.id}|", stratum=stratum.name)

    def _search(
        self,
        inv: Invariant,
        scenario: str,
        stratum: Stratum,
        phases: Sequence[hypothesis.Phase],
        failing: Example | None = None,
    ) -> Example | None:
        return search(
            inv,
            scenario,
            stratum.examples(scenario, self.options.profile),
            self.observe,
            stratum_seed(self.options.seed, scenario, stratum.name),
            database=self._database(inv, stratum),
            phases=phases,
            failing=failing,
        )

    def _replay(self, active: Sequence[Invariant]) -> None:
        if self.options.database is None or self.guard.hung is not None:
            return
        store = DirectoryBasedExampleDatabase(self.options.database)
        # Counterexamples saved by earlier runs fail again first, whatever the seed.
        for inv in active:
            tally = self.tallies[inv.id]
            if tally.failure is not None or inv.id.startswith("KV-CALL"):
                continue
            saved = Namespaced(store, f"{self.options.builder}|{inv.id}|").strata()
            for scenario in inv.scenarios:
                for stratum in (s for s in self.strata if s.name in saved):
                    reuse = [hypothesis.Phase.reuse]
                    replayed = self.clock.judge(inv.id, self._search, inv, scenario, stratum, reuse)
                    if replayed is not None:
                        tally.failure = (scenario, replayed, stratum)
                        # After every example of the run's own (shard.order_key).
                        tally.failure_key = order_key(2, 0, 0, 0)
                        tally.judged += 1
                        break
                if tally.failure is not None:
                    break

    def _result(self, inv: Invariant) -> InvariantResult:
        tally = self.tallies.get(inv.id, Tally())

        def make(status: str, **extra: Any) -> InvariantResult:
            return InvariantResult(
                id=inv.id,
                title=inv.title,
                reference=inv.reference,
                status=status,
                examples=tally.judged,
                inconclusive=tally.unjudged,
                seconds=self.clock.seconds(inv.id),
                **extra,
            )

        if inv.id in self.skipped:
            return make("skipped", reason=self.skipped[inv.id])
        status, reason = verdict(tally, interrupted=self.interrupted)
        shown = expected_status(status, inv.id in self.options.xfail)
        if status == "fail":
            return make(shown, **self.clock.judge(inv.id, self._failure, inv, tally))
        return make(shown, reason=reason)

    def note_introduced(
        self,
        inv: Invariant,
        scenario: str,
        example: Example,
        stratum: Stratum,
        key: tuple[int, ...] | None,
    ) -> None:
        """Ask the parent whether it fails ``example`` too, until one failure is the builder's own.

        A vendor builder that calls ``super()`` inherits its parent's defects,
        which may fail an invariant on many examples; the report must still
        show the vendor's own failure of that invariant where there is one,
        or a documented upstream defect would hide it (and an expectations
        manifest would excuse it).
        """
        tally = self.tallies[inv.id]
        if not tally.wants_parent_check() or parent_builder(self.builder) is None:
            return
        tally.inherit_checks += 1
        if self._inherited(inv, scenario, example) is None:
            tally.introduced = (scenario, example, stratum)
            tally.introduced_key = key

    def _failure(self, inv: Invariant, tally: Tally) -> dict[str, Any]:
        """The shrunk counterexample of a failed invariant and how to reproduce it."""
        if tally.shown is None:
            raise ValueError(f"{inv.id} has no failure to report")
        scenario, failing, stratum = tally.shown
        minimal = failing
        if self.options.shrink and self.guard.hung is None and not self.interrupted:
            try:
                minimal = self._shrink(inv, scenario, failing, stratum)
            except KeyboardInterrupt:
                clear_interrupt()
                self.interrupted = True
        outcome = judge_outcome(inv, self.observe(scenario, minimal))
        reproduced = bool(outcome) and not isinstance(outcome, Unjudged)
        inherited = self._inherited(inv, scenario, minimal) if reproduced else None
        # Shrinking may also walk from the builder's own failure to its parent's.
        if not reproduced or (tally.introduced is not None and inherited is not None):
            minimal = failing
            outcome = judge_outcome(inv, self.observe(scenario, failing))
            inherited = self._inherited(inv, scenario, minimal)
        # The same observation and judgement, for an extension to repeat (extensions/flakes).
        self.rejudge[inv.id] = lambda: self.clock.judge(
            inv.id, lambda: judge_outcome(inv, self.observe(scenario, minimal))
        )
        violations = () if not outcome or isinstance(outcome, Unjudged) else tuple(outcome)
        if not violations:
            # A builder that hung is not called again: keep what the run saw.
            violations = tally.found
        return {
            "inherited": inherited,
            "upstream": self._upstream(inv, scenario, minimal),
            "violations": violations[:5],
            "counterexample": repr(minimal),
            "counterexample_python": minimal.to_python(),
            "counterexample_data": example_data(minimal),
            "scenario": scenario,
            "reproduce": self._reproduce(inv, failing),
        }

    def _reproduce(self, inv: Invariant, failing: Example) -> str:
        """The command that fails ``inv`` again."""
        for line in (by(inv.id, failing) for by in self.shared.reproduce_by):
            if line is not None:
                return line
        learned = {k: v() for k, v in self.shared.reproduce_with.items()}
        return self.options.reproduce(inv.id, **learned)

    def _inherited(self, inv: Invariant, scenario: str, example: Example) -> str | None:
        """Whether the builder's parent builder fails the same way on the counterexample.

        In the scenarios that place the builder's own groups, the parent also
        places those groups: a builder that regroups and leaves placement to
        ``super()`` ships its parent's placement, defects included.
        """
        parent = parent_builder(self.builder)
        how = None if parent is None else self._also_fails(parent, inv, scenario, example)
        if parent is None or how is None:
            return None
        return (
            f"also fails with the parent builder {builder_name(parent)} {how}: "
            "inherited, not introduced by this builder"
        )

    def _upstream(self, inv: Invariant, scenario: str, example: Example) -> str | None:
        """The documented vLLM defect a vLLM-native builder's failure matches (``None``: none).

        It matches when the inputs have the defect's shape and vLLM's own
        default builder fails the same invariant on them (run/upstream.py).
        """
        if not is_vllm_native(self.builder):
            return None
        defect = matching_defect(inv.id, example)
        if defect is None:
            return None
        default = vllm_default_builder()
        how = None if default is None else self._also_fails(default, inv, scenario, example)
        if how is None:
            return None
        return f"{defect.describe()}; vLLM's own DefaultKVCacheConfigBuilder fails it {how} too"

    def _also_fails(
        self, other: Any, inv: Invariant, scenario: str, example: Example
    ) -> str | None:
        """How ``other`` fails ``inv`` on ``example`` too (``None``: it does not).

        On the counterexample itself, or, where the scenario places the
        builder's own groups, with those groups.
        """
        if self._fails_with(other, inv, scenario, example):
            return "on this counterexample"
        if self._fails_placing_own_groups(other, inv, scenario, example):
            return "with this builder's own groups of this counterexample"
        return None

    def _fails_placing_own_groups(
        self, other: Any, inv: Invariant, scenario: str, example: Example
    ) -> bool:
        """Whether ``other`` fails ``inv`` on ``example`` when it places this builder's groups.

        Only the placing scenarios place the builder's own groups; the groups
        are asked of the builder again (through the run's guard), as they were,
        and used only when they keep the grouping invariants (a failure that
        invalid groups cause is the builder's own).
        """
        if scenario not in _PLACING or not isinstance(other, type) or self.guard.hung is not None:
            return False
        ctx = self.ctx

        def builders_groups(config: Any, specs: Any) -> list[Any]:
            result, _ = call_grouping(ctx.guard, ctx.factory(), config, specs)
            if not valid_groups(config, specs, result):
                raise ValueError("the builder's groups break the grouping invariants")
            return list(result.value)

        placing = type(
            f"{other.__name__}PlacingBuildersGroups",
            (other,),
            {"get_kv_cache_groups": lambda self, config, specs: builders_groups(config, specs)},
        )
        return self._fails_with(placing, inv, scenario, example)

    def _fails_with(self, other: Any, inv: Invariant, scenario: str, example: Example) -> bool:
        """Whether ``other`` (a default builder, run here) fails ``inv`` on ``example``."""
        if self.guard.hung is not None:
            return False
        guard = Guard(self.options.timeout)
        qualname, note = resolvable_qualname(other, builder_name(other))
        ctx = attrs.evolve(
            self.ctx,
            factory=make_factory(other, guard),
            guard=guard,
            core=getattr(other, "kvref_core", None),
            qualname=qualname,
            qualname_note=note,
            # The default builder runs in this process, so resolution does too.
            resolver=None,
        )
        try:
            broken = judge_outcome(inv, observe_in(ctx, scenario, example))
        except Exception:
            return False
        return bool(broken) and not isinstance(broken, Unjudged)

    def _shrink(self, inv: Invariant, scenario: str, failing: Example, stratum: Stratum) -> Example:
        if inv.id == "KV-CALL-TIMEOUT":
            return failing
        phases = [hypothesis.Phase.generate, hypothesis.Phase.shrink]
        if self.options.database is not None:
            phases.insert(0, hypothesis.Phase.reuse)
        # The stratum that drew the failure shrinks it: its strategy can draw it again.
        found = self._search(inv, scenario, stratum, phases, failing)
        return found or failing


def judge_outcome(inv: Invariant, obs: Any) -> Any:
    """``inv``'s outcome on ``obs``; a builder that could not be built judges only construction."""
    from conformance.check.observations import ConstructFailure

    if isinstance(obs, ConstructFailure) and inv.id != "KV-CALL-CONSTRUCT":
        return Unjudged("the builder could not be constructed for this example (KV-CALL-CONSTRUCT)")
    return inv.check(obs)
