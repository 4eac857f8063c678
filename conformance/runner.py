"""``check_builder``: drive the invariant catalog over generated examples.

For each scenario the runner draws examples with Hypothesis, observes the
builder once per example and lets every selected invariant of the scenario
check the observation.  An invariant that fails is then re-run alone under
``hypothesis.find`` so the report carries a shrunk, minimal counterexample.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import attrs
import hypothesis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.database import DirectoryBasedExampleDatabase, ExampleDatabase

from conformance import strategies as kst
from conformance.guard import Guard
from conformance.invariants import CATALOG, Invariant
from conformance.scenarios import (
    BuilderFactory,
    observe_core,
    observe_grouping,
    observe_host,
    observe_placement,
)
from conformance.violations import Violation
from kvref.builder import KVCacheConfigBuilder
from kvref.config import PlanningConfig
from kvref.specs import KVCacheSpec

__all__ = ["PROFILES", "InvariantResult", "Report", "check_builder", "select_invariants"]

#: Examples per scenario for each profile.
PROFILES: dict[str, int] = {"ci": 50, "thorough": 500}

_CALL_IDS = ("KV-CALL-RAISES", "KV-CALL-RETURN-TYPE", "KV-CALL-TIMEOUT")
_SCENARIOS = ("grouping", "placement", "host", "core", "device")

Progress = Callable[[str, int, int], None]


@attrs.frozen(kw_only=True)
class InvariantResult:
    """What the run found for one invariant.

    Attributes:
        id, title, spec: the invariant.
        status: ``pass``, ``fail``, ``xfail``, ``xpass``, ``skipped`` or ``not-checked``.
        examples: examples that exercised the invariant.
        inconclusive: examples it could not judge (a call it needs failed).
        violations: the violations of the shrunk counterexample.
        counterexample: a readable form of the minimal failing input.
        reason: why it was skipped or not checked.
        reproduce: a command that reproduces the failure.
    """

    id: str
    title: str
    spec: str
    status: str
    examples: int = 0
    inconclusive: int = 0
    violations: tuple[Violation, ...] = ()
    counterexample: str | None = None
    reason: str | None = None
    reproduce: str | None = None


@attrs.frozen(kw_only=True)
class Report:
    """The outcome of :func:`check_builder`.

    Attributes:
        builder: the builder's name.
        device: the torch device of the device checks.
        seed: the seed that reproduces the run.
        profile: the Hypothesis profile.
        max_examples: examples per scenario.
        results: one entry per invariant of the catalog.
        seconds: wall time of the run.
    """

    builder: str
    device: str
    seed: int
    profile: str
    max_examples: int
    results: tuple[InvariantResult, ...]
    seconds: float

    @property
    def failures(self) -> tuple[InvariantResult, ...]:
        """The invariants that failed and were not expected to."""
        return tuple(r for r in self.results if r.status == "fail")

    @property
    def ok(self) -> bool:
        """Whether every selected invariant held (or was expected to fail)."""
        return not self.failures

    @property
    def failed_ids(self) -> frozenset[str]:
        """Ids of the failed invariants."""
        return frozenset(r.id for r in self.failures)

    def by_status(self, status: str) -> tuple[InvariantResult, ...]:
        """The results with ``status``."""
        return tuple(r for r in self.results if r.status == status)


@attrs.frozen
class _Example:
    """One drawn input: a planning problem plus the scenario's extras."""

    config: PlanningConfig
    workers: tuple[Mapping[str, KVCacheSpec], ...]
    available_memory: tuple[int, ...]
    num_blocks: int
    description: str

    @property
    def merged(self) -> dict[str, KVCacheSpec]:
        out: dict[str, KVCacheSpec] = {}
        for worker in self.workers:
            out.update(worker)
        return out

    def __repr__(self) -> str:
        return self.description


def _examples(scenario: str) -> st.SearchStrategy[_Example]:
    @st.composite
    def build(draw: st.DrawFn) -> _Example:
        problem = draw(kst.planning_problems())
        num_blocks = draw(kst.num_blocks())
        config = problem.config
        workers = tuple(problem.workers)
        if scenario == "host":
            merged: dict[str, KVCacheSpec] = {}
            for w in workers:
                merged.update(w)
            first = next(iter(merged.values()), None)
            same = [n for n, s in merged.items() if s == first]
            if not same:
                hypothesis.reject()
            count = draw(st.integers(1, len(same)))
            host = same[:count]
            # Host pages sit in LBNHC at their aligned block stride (SPEC 4.1).
            host_pages = sum(merged[n].block_stride for n in host)
            host_blocks = draw(st.integers(1, 64))
            config = attrs.evolve(
                config,
                host_resident_layers=frozenset(host),
                host_pool_bytes=host_pages * host_blocks + draw(st.integers(0, host_pages - 1)),
            )
        elif config.host_resident_layers:
            config = attrs.evolve(config, host_resident_layers=frozenset(), host_pool_bytes=None)
        if not _reference_accepts(config, workers):
            # Only problems the reference can plan are valid inputs for a builder.
            hypothesis.reject()
        description = f"{problem!r}, num_blocks={num_blocks}"
        if scenario == "host":
            description += (
                f", host_resident_layers={sorted(config.host_resident_layers)}, "
                f"host_pool_bytes={config.host_pool_bytes}"
            )
        return _Example(
            config=config,
            workers=workers,
            available_memory=tuple(problem.available_memory),
            num_blocks=num_blocks,
            description=description,
        )

    return build()


def _reference_accepts(
    config: PlanningConfig, workers: Sequence[Mapping[str, KVCacheSpec]]
) -> bool:
    from kvref.builder import ReferenceKVCacheConfigBuilder
    from kvref.errors import KVRefError
    from kvref.placement import get_kv_cache_config_from_groups

    merged: dict[str, KVCacheSpec] = {}
    for worker in workers:
        merged.update(worker)
    try:
        groups = ReferenceKVCacheConfigBuilder().get_kv_cache_groups(config, merged)
        get_kv_cache_config_from_groups(config, groups, 1)
    except KVRefError:
        return False
    return True


def _observe(scenario: str, factory: BuilderFactory, guard: Guard, ex: _Example) -> Any:
    if scenario == "grouping":
        return observe_grouping(factory, guard, ex.config, ex.merged)
    if scenario in ("placement", "device"):
        return observe_placement(factory, guard, ex.config, ex.merged, ex.num_blocks)
    if scenario == "host":
        return observe_host(factory, guard, ex.config, ex.merged, ex.num_blocks)
    # A builder may bring its own Core (the vLLM adapter runs vLLM's flow).
    core = getattr(factory, "kvref_core", None)
    return observe_core(factory, guard, ex.config, ex.workers, ex.available_memory, core=core)


def select_invariants(
    catalog: Sequence[Invariant], select: Iterable[str] | None
) -> list[Invariant]:
    """The invariants whose id equals or starts with one of ``select`` (all if ``None``).

    Raises:
        ValueError: an entry of ``select`` matches no invariant.
    """
    if select is None:
        return list(catalog)
    chosen: list[Invariant] = []
    for raw in select:
        pattern = raw.strip().upper()
        if not pattern:
            continue
        hits = [
            inv for inv in catalog if inv.id == pattern or inv.id.startswith(pattern.rstrip("*"))
        ]
        if not hits:
            raise ValueError(f"--select {pattern!r} matches no invariant id")
        chosen += [h for h in hits if h not in chosen]
    return chosen


def _factory(builder: KVCacheConfigBuilder | type[KVCacheConfigBuilder]) -> BuilderFactory:
    if isinstance(builder, type):
        return builder
    cls = type(builder)

    def fresh() -> KVCacheConfigBuilder:
        try:
            return cls()
        except Exception:
            return builder

    return fresh


def _capabilities(builder: object, unsupported: Iterable[str] | None) -> frozenset[str]:
    declared = getattr(builder, "kvref_unsupported", ()) or ()
    return frozenset(declared) | frozenset(unsupported or ())


def check_builder(
    builder: KVCacheConfigBuilder | type[KVCacheConfigBuilder],
    *,
    device: str = "cpu",
    max_examples: int | None = None,
    seed: int | None = None,
    select: Iterable[str] | None = None,
    xfail: Iterable[str] | None = None,
    timeout: float = 10.0,
    unsupported: Iterable[str] | None = None,
    profile: str = "ci",
    max_alloc_bytes: int | None = None,
    progress: Progress | None = None,
    name: str | None = None,
    shrink: bool = True,
    database: str | None = None,
) -> Report:
    """Check ``builder`` against the invariant catalog and return a :class:`Report`.

    Args:
        builder: a builder class (instantiated afresh where vLLM would) or instance.
        device: torch device for the device invariants (``cpu``, ``cuda``, ``meta``...).
        max_examples: examples per scenario (default: the profile's).
        seed: makes the run reproducible (random if ``None``; the report says which).
        select: invariant ids or id prefixes to run (default: all).
        xfail: ids expected to fail; a failure is reported as XFAIL, a pass as XPASS.
        timeout: per-call deadline in seconds for every builder hook.
        unsupported: capabilities the builder lacks (e.g. ``host_resident``), in
            addition to its ``kvref_unsupported`` attribute.
        profile: ``ci`` (fast, the default) or ``thorough``.
        max_alloc_bytes: cap of any single device allocation of the device checks.
        progress: called as ``progress(invariant_or_scenario, done, total)``.
        name: the builder's name in the report.
        shrink: shrink failures to minimal counterexamples.
        database: directory of a Hypothesis example database: counterexamples of
            earlier runs are replayed first and new ones are saved there.

    Raises:
        ValueError: an unknown profile or an unknown id in ``select``.
    """
    if profile not in PROFILES:
        raise ValueError(f"profile={profile!r} is not one of {sorted(PROFILES)}")
    started = time.perf_counter()
    examples_per_scenario = max_examples or PROFILES[profile]
    seed = seed if seed is not None else random.randrange(2**32)
    catalog = list(CATALOG) + _device_invariants(device, max_alloc_bytes)
    selected = select_invariants(catalog, select)
    xfail_ids = {x.strip().upper() for x in (xfail or ())}
    lacking = _capabilities(builder, unsupported)
    factory = _factory(builder)
    guard = Guard(timeout)
    label = name or _name(builder)

    skipped: dict[str, str] = {}
    for inv in selected:
        missing = inv.requires & lacking
        if missing:
            skipped[inv.id] = f"the builder declares no support for {', '.join(sorted(missing))}"
    active = [inv for inv in selected if inv.id not in skipped]
    call_checks = [inv for inv in active if inv.id in _CALL_IDS]
    by_scenario = {
        s: [inv for inv in active if inv.scenario == s and inv.id not in _CALL_IDS]
        for s in _SCENARIOS
    }
    # The call invariants need at least one scenario to observe calls.
    if call_checks and not any(by_scenario.values()):
        by_scenario["grouping"] = []
    stats: dict[str, list[int]] = {inv.id: [0, 0] for inv in active}
    first_failure: dict[str, tuple[str, _Example]] = {}
    scenarios = [s for s in _SCENARIOS if by_scenario[s] or (call_checks and s == "grouping")]
    total = len(scenarios) * examples_per_scenario

    for scenario in scenarios:
        _run_scenario(
            scenario,
            by_scenario[scenario] + call_checks,
            factory,
            guard,
            examples_per_scenario,
            seed,
            stats,
            first_failure,
            _ticker(progress, scenario, total),
            done_before=scenarios.index(scenario) * examples_per_scenario,
        )

    store = DirectoryBasedExampleDatabase(database) if database is not None else None

    def db(inv: Invariant) -> ExampleDatabase | None:
        return _Namespaced(store, f"{label}|{inv.id}|") if store is not None else None

    if store is not None and guard.hung is None:
        # Counterexamples saved by earlier runs fail again first, whatever the seed.
        for inv in active:
            if inv.id in first_failure or inv.id in _CALL_IDS:
                continue
            replayed = _search(
                inv,
                inv.scenario,
                factory,
                guard,
                seed,
                database=db(inv),
                phases=[hypothesis.Phase.reuse],
            )
            if replayed is not None:
                first_failure[inv.id] = (inv.scenario, replayed)
                stats[inv.id][0] += 1

    results: list[InvariantResult] = []
    for inv in catalog:
        if inv not in selected:
            continue
        if inv.id in skipped:
            results.append(_result(inv, "skipped", reason=skipped[inv.id]))
            continue
        checked, inconclusive = stats[inv.id]
        found_in = first_failure.get(inv.id)
        expected = inv.id in xfail_ids
        if found_in is None:
            if checked == 0:
                status, reason = (
                    "not-checked",
                    (
                        f"all {inconclusive} examples were inconclusive: the calls it needs failed "
                        "(see KV-CALL-*), no example applied, or the device cannot measure it "
                        "(cpu and meta have no memory counter; configs above the allocation cap)"
                    ),
                )
            else:
                status, reason = ("xpass" if expected else "pass"), None
            explain = inv.why_unmeasured() if inv.why_unmeasured is not None else None
            if status == "not-checked" and explain:
                reason = f"not measured on {device} in {inconclusive} examples: {explain}"
            results.append(_result(inv, status, checked, inconclusive, reason=reason))
            continue
        scenario, failing = found_in
        minimal = failing
        if shrink and guard.hung is None:
            minimal = _shrink(inv, scenario, factory, guard, failing, seed, db(inv))
        violations = tuple(inv.check(_observe(scenario, factory, guard, minimal)) or ())
        if not violations:
            minimal = failing
            violations = tuple(inv.check(_observe(scenario, factory, guard, failing)) or ())
        results.append(
            InvariantResult(
                id=inv.id,
                title=inv.title,
                spec=inv.spec,
                status="xfail" if expected else "fail",
                examples=checked,
                inconclusive=inconclusive,
                violations=violations[:5],
                counterexample=repr(minimal),
                reproduce=f"kvref-conformance {label} --select {inv.id} --seed {seed} "
                f"--max-examples {examples_per_scenario} --device {device}",
            )
        )
    return Report(
        builder=label,
        device=device,
        seed=seed,
        profile=profile,
        max_examples=examples_per_scenario,
        results=tuple(results),
        seconds=time.perf_counter() - started,
    )


def _ticker(progress: Progress | None, scenario: str, total: int) -> Callable[[int], object]:
    def tick(done: int) -> None:
        if progress is not None:
            progress(scenario, min(done, total), total)

    return tick


def _run_scenario(
    scenario: str,
    checks: list[Invariant],
    factory: BuilderFactory,
    guard: Guard,
    max_examples: int,
    seed: int,
    stats: dict[str, list[int]],
    first_failure: dict[str, tuple[str, _Example]],
    tick: Callable[[int], object],
    *,
    done_before: int,
) -> None:
    done = done_before

    @settings(
        max_examples=max_examples,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
        phases=[hypothesis.Phase.explicit, hypothesis.Phase.generate],
    )
    @hypothesis.seed(seed)
    @hypothesis.given(_examples(scenario))
    def run(ex: _Example) -> None:
        nonlocal done
        obs = _observe(scenario, factory, guard, ex)
        for inv in checks:
            found = inv.check(obs)
            if found is None:
                stats[inv.id][1] += 1
                continue
            stats[inv.id][0] += 1
            if found and inv.id not in first_failure:
                first_failure[inv.id] = (scenario, ex)
        done += 1
        tick(done)

    run()


def _result(
    inv: Invariant,
    status: str,
    examples: int = 0,
    inconclusive: int = 0,
    *,
    reason: str | None = None,
) -> InvariantResult:
    return InvariantResult(
        id=inv.id,
        title=inv.title,
        spec=inv.spec,
        status=status,
        examples=examples,
        inconclusive=inconclusive,
        reason=reason,
    )


class _Namespaced(ExampleDatabase):
    """One builder's and one invariant's corner of a shared example database.

    Every invariant's search runs the same test function, so Hypothesis would
    give them one key; the prefix keeps their counterexamples apart.
    """

    def __init__(self, inner: ExampleDatabase, prefix: str) -> None:
        super().__init__()
        self.inner = inner
        self.prefix = prefix.encode()

    def save(self, key: bytes, value: bytes) -> None:
        self.inner.save(self.prefix + key, value)

    def fetch(self, key: bytes) -> Iterable[bytes]:
        return self.inner.fetch(self.prefix + key)

    def delete(self, key: bytes, value: bytes) -> None:
        self.inner.delete(self.prefix + key, value)


def _search(
    inv: Invariant,
    scenario: str,
    factory: BuilderFactory,
    guard: Guard,
    seed: int,
    *,
    database: ExampleDatabase | None,
    phases: Sequence[hypothesis.Phase],
    failing: _Example | None = None,
    seconds: float = 8.0,
) -> _Example | None:
    """The smallest failing example a Hypothesis search finds (``failing`` if none).

    With ``database`` set, examples saved by earlier runs are replayed first
    and the new minimal counterexample is saved, so a failure reproduces
    from the database as well as from the seed.
    """
    stop_at = time.perf_counter() + seconds
    smallest = [failing]

    class _StillFailsError(Exception):
        pass

    @settings(
        max_examples=max(PROFILES["ci"], 50),
        deadline=None,
        database=database,
        suppress_health_check=list(HealthCheck),
        phases=list(phases),
        report_multiple_bugs=False,
    )
    @hypothesis.seed(seed)
    @hypothesis.given(_examples(scenario))
    def search(ex: _Example) -> None:
        # Hypothesis shrinks towards smaller inputs, so the last failing example
        # it tries is the smallest.  Past the time budget nothing fails any more,
        # which ends the search with the best example so far.
        if time.perf_counter() > stop_at:
            return
        if inv.check(_observe(scenario, factory, guard, ex)):
            smallest[0] = ex
            raise _StillFailsError

    with contextlib.suppress(Exception):
        search()
    return smallest[0]


def _shrink(
    inv: Invariant,
    scenario: str,
    factory: BuilderFactory,
    guard: Guard,
    failing: _Example,
    seed: int,
    database: ExampleDatabase | None = None,
) -> _Example:
    if inv.id == "KV-CALL-TIMEOUT":
        return failing
    phases = [hypothesis.Phase.generate, hypothesis.Phase.shrink]
    if database is not None:
        phases.insert(0, hypothesis.Phase.reuse)
    found = _search(
        inv, scenario, factory, guard, seed, database=database, phases=phases, failing=failing
    )
    return found or failing


def _name(builder: object) -> str:
    cls = builder if isinstance(builder, type) else type(builder)
    return f"{cls.__module__}:{cls.__qualname__}"


def _device_invariants(device: str, max_alloc_bytes: int | None) -> list[Invariant]:
    try:
        from conformance import device_invariants
    except ImportError:  # pragma: no cover - the device module ships with the kit
        return []
    return device_invariants.invariants(device, max_alloc_bytes)
