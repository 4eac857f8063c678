"""What a run of the kit found: one :class:`InvariantResult` per invariant, in a :class:`Report`.

Verdicts (the contract document's "Verdicts" section):

- ``pass``: at least one example judged the invariant and it held on every one;
- ``fail``: an example broke it;
- ``inconclusive``: no example judged it (the builder's calls failed, or no
  example reached it); fails the run like ``fail``;
- ``not-applicable``: it cannot apply to this run (the device cannot measure
  it, or no model of the run can give its scenario an example for this
  builder); does not fail the run;
- ``skipped``: the vendor declared the capability it needs unsupported;
- ``xfail``: listed as expected to fail, and it failed or was not judged;
- ``xpass``: listed as expected to fail, yet it held; reported, does not
  fail the run (the same policy in the CLI, the plugin and ``check_builder``).
"""

from __future__ import annotations

from typing import Any

import attrs

from conformance.check.violations import Violation, bounded
from conformance.contract import CONTRACT

__all__ = ["FAILING", "STATUSES", "InvariantResult", "Replays", "Report"]

#: Every status, in the order reports list their counts.
STATUSES = ("pass", "fail", "inconclusive", "not-applicable", "skipped", "xfail", "xpass")
#: The statuses that fail a run.
FAILING = frozenset({"fail", "inconclusive"})


@attrs.frozen(kw_only=True)
class Replays:
    """What replaying a failure's minimal counterexample found (extensions/flakes).

    Attributes:
        runs: how many times the minimal counterexample was observed and judged again.
        failed: how many of those runs broke the invariant again.
        verdict: ``deterministic`` (every replay failed), ``flaky`` (some
            replay held or could not judge it) or ``not-replayed`` (no
            replays asked for, or the builder hung or the run was stopped,
            so it was not called again).
    """

    runs: int
    failed: int
    verdict: str


@attrs.frozen(kw_only=True)
class InvariantResult:
    """What the run found for one invariant.

    Attributes:
        id, title: the invariant.
        reference: the contract section that states it (``docs/contract.md#...``).
        status: one of :data:`STATUSES`.
        examples: examples that judged the invariant.
        inconclusive: examples that could not judge it.
        violations: the violations of the shrunk counterexample.
        counterexample: a readable form of the minimal failing input.
        counterexample_python: Python that rebuilds the minimal failing input,
            for people to read (a replay never executes it).
        counterexample_data: the minimal failing input as data
            (:mod:`conformance.report.records`), what :func:`conformance.reproduce`
            rebuilds it from; ``None`` where it holds a value data cannot carry.
        scenario: the scenario whose example failed.
        reason: why it was not judged, skipped or expected to fail.
        reproduce: a command that reruns the failing example.
        inherited: set when the builder's parent class fails the same way on
            the counterexample (the failure is inherited, not the builder's own).
        upstream: set when a vLLM-native builder's failure matches a documented
            vLLM 0.33.0 defect that vLLM's own default builder shows on the same
            counterexample (it stays a failure: the vendor ships that code).
    """

    id: str
    title: str
    reference: str
    status: str
    examples: int = 0
    inconclusive: int = 0
    violations: tuple[Violation, ...] = ()
    counterexample: str | None = None
    counterexample_python: str | None = None
    counterexample_data: dict[str, Any] | None = None
    scenario: str | None = None
    # Quotes what a failed call of the builder raised: bounded as a violation's message is.
    reason: str | None = attrs.field(default=None, converter=attrs.converters.optional(bounded))
    reproduce: str | None = None
    inherited: str | None = None
    upstream: str | None = None
    seconds: float = 0.0
    replays: Replays | None = None
    expectation: dict[str, Any] | None = None

    @property
    def strict_xpass(self) -> bool:
        """An XPASS of a ``strict`` expectation: it fails the run."""
        return self.status == "xpass" and bool(self.expectation and self.expectation["strict"])


@attrs.frozen(kw_only=True)
class Report:
    """The outcome of :func:`conformance.check_builder`.

    Attributes:
        builder: the builder's importable name.
        device: the torch device of the device checks.
        seed: the seed that reproduces the run.
        profile: the Hypothesis profile.
        max_examples: examples per scenario.
        results: one entry per selected invariant, in catalog order.
        seconds: wall time of the run.
        options: every option that shaped the run (what the reproduce lines carry).
        coverage: per scenario, what the run's examples covered (models, layouts, ...).
        reach: what the run executed of the builder's own code, when measured.
        interrupted: the run was stopped before it finished (Ctrl-C); the
            invariants it did not reach are inconclusive.
        builder_output: the last bytes the builder printed in its worker
            process (stdout and stderr, bounded), kept apart from the kit's
            own output; empty when it printed nothing or ran in this process.
        waste: the efficiency warnings of the waste extension (its record,
            ``conformance.extensions.waste.records.WasteSummary``, which the
            core never names): plans that hold less than half of what the
            reference's holds; never a verdict (``None``: the core scenario
            did not run, or the extension is not installed).
        observe_seconds: per scenario, the time spent observing the builder on
            the examples its invariants share (:mod:`conformance.run.timing`).
        started: when the run started, ISO 8601 UTC to the second, without a
            zone suffix (``None``: not recorded; the JUnit file then reckons it).
        warnings: what the run says of itself, never a verdict: the
            expectations manifest's notes (unknown ids, entries that matched
            nothing) and an installed vLLM other than the contract's
            (:mod:`conformance.contract`).
        contract: the vLLM contract the invariants check.
        baseline: with a baseline report (:mod:`conformance.ci.baseline`), the
            failing ids new in this run, fixed since, and unchanged; the run then
            fails only on new ones (``None``: no baseline).
        certificate: in a ``--certify`` run's report, what it certifies and the
            digest of the report (:mod:`conformance.ci.certify`); ``None`` otherwise.
        focus: the focus the run used, as ``--focus`` takes it (learned or
            given; ``off``: none), so a later run can be given it.
        shard: in a sharded run's report (``--shard I/N``), what ``merge`` needs
            to join the shards' reports (:mod:`conformance.run.shard`); ``None``
            otherwise.
        containment: what kept the builder's processes apart from the judging
            one in this run (:func:`conformance.harness.confine.summary`: the
            mechanisms that held per process role, and warnings where one did
            not; docs/trust.md); ``None``: not isolated.
    """

    builder: str
    device: str
    seed: int
    profile: str
    max_examples: int
    results: tuple[InvariantResult, ...]
    seconds: float
    options: dict[str, Any] = attrs.field(factory=dict)
    coverage: dict[str, Any] = attrs.field(factory=dict)
    reach: dict[str, Any] | None = None
    interrupted: bool = False
    waste: Any = None
    builder_output: str = ""
    observe_seconds: dict[str, float] = attrs.field(factory=dict)
    started: str | None = None
    warnings: tuple[str, ...] = ()
    baseline: dict[str, Any] | None = None
    contract: str = CONTRACT
    certificate: dict[str, Any] | None = None
    focus: str | None = None
    shard: dict[str, Any] | None = None
    containment: dict[str, Any] | None = None

    @property
    def failures(self) -> tuple[InvariantResult, ...]:
        """The results that fail the run.

        Those that failed or could not be judged and were not expected to,
        and the XPASSes of strict expectations.
        """
        return tuple(r for r in self.results if r.status in FAILING or r.strict_xpass)

    @property
    def ok(self) -> bool:
        """Whether every selected invariant was judged and held (or was expected to fail)."""
        return not self.failures and not self.interrupted and not self.reach_failed

    @property
    def reach_failed(self) -> bool:
        """Whether the run measured less reach than ``--min-reach`` asked for."""
        return bool(self.reach and self.reach.get("below_minimum"))

    @property
    def failed_ids(self) -> frozenset[str]:
        """Ids of the invariants that failed (not those that were only inconclusive)."""
        return frozenset(r.id for r in self.results if r.status == "fail")

    @property
    def failing_ids(self) -> frozenset[str]:
        """Ids of every invariant that fails the run (failed or inconclusive)."""
        return frozenset(r.id for r in self.failures)

    def by_status(self, status: str) -> tuple[InvariantResult, ...]:
        """The results with ``status``."""
        return tuple(r for r in self.results if r.status == status)

    def result(self, invariant: str) -> InvariantResult:
        """The result of ``invariant``.

        Raises:
            KeyError: the invariant was not selected in this run.
        """
        for r in self.results:
            if r.id == invariant:
                return r
        raise KeyError(invariant)
