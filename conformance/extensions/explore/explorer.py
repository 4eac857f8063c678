"""Coverage-guided exploration (``--explore SECONDS``): keep what reaches new builder lines.

The default run deals its examples blind (strata.py, focus.py).  Exploration
steers by the builder's own lines, which the run already measures (reach.py):
each candidate example is judged by every invariant of the scenarios
declared ``explored`` (those that take any planning problem as it is:
:class:`~conformance.scenarios.base.Scenario`), and one after which more of the builder's lines
have run than before is kept in a corpus.  Candidates are fresh draws from
the families, or structural mutations of a kept example (:data:`MUTATIONS`:
another layout, the hybrid manager toggled, host offload dropped, the pipeline stages merged, a
decoder layer added (a copy of another), a decoder layer's cache or a whole
cache role dropped, a spec made its base
class, another block count or memory budget; one to three of them stacked,
:data:`STACK`), since a vendor's gates test structure (exact spec classes, a
role present and another absent) and a mutation of an example that opened
one gate is the likeliest to open the next.  A kept example is mutated in
proportion to the new lines it reached (its energy, as in a coverage-guided
fuzzer).  Exploration ends when its time is spent, after
``max_candidates``, or when :data:`PATIENCE` candidates per kept example in
a row reached nothing new.

Why a corpus of the kit's own and not Hypothesis' ``target()``: ``target``
climbs a number, and reach is a set (new lines, not more lines); the
mutations that open a gate are on the example's structure, which Hypothesis
sees only as a choice sequence.  Hypothesis still draws the fresh
candidates, each family with its own seeded run.

The corpus is saved beside the example database (``explore/`` in it, one
file per builder) and judged first by the next run of the same builder, so a
vendor's CI gets deeper with every run, as Hypothesis' database does for
failures; with ``--no-database`` nothing is saved or replayed.
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import attrs

from conformance.extensions.explore.corpus import Corpus, CorpusError
from conformance.generate.coverage import family_of
from conformance.generate.hf import described_again
from conformance.generate.layouts import allowed_layouts
from conformance.generate.limits import Limits
from conformance.generate.problems import model_config_fields
from conformance.generate.records import PlanningProblem
from conformance.scenarios.examples import Example, reference_accepts
from kvref.builder import ReferenceKVCacheConfigBuilder
from kvref.config import PlanningConfig
from kvref.errors import KVRefError
from kvref.planning import plan_kv_cache
from kvref.specs import FullAttentionSpec, KVCacheSpec, SlidingWindowSpec

__all__ = [
    "MUTATIONS",
    "PATIENCE",
    "STACK",
    "Corpus",
    "CorpusError",
    "ExploreSummary",
    "Explorer",
    "mutate",
]

_REFERENCE = ReferenceKVCacheConfigBuilder()

#: Candidates in a row that reach nothing new, per kept example, before exploration stops.
PATIENCE = 300

Workers = tuple[Mapping[str, KVCacheSpec], ...]


def _relayout(rng: random.Random, ex: Example) -> Example | None:
    """Another layout vLLM's resolution could pick for the model (the generator's rule)."""
    others = [m for m in allowed_layouts(ex.merged) if m is not ex.config.kv_cache_layout]
    if not others:
        return None
    # The drawn backends were chosen for the old layout; none is a valid choice for any.
    config = attrs.evolve(ex.config, kv_cache_layout=rng.choice(others), attention_backends=())
    return _with(ex, config=config)


def _hybrid(rng: random.Random, ex: Example) -> Example | None:
    """The hybrid manager back on (the generator turns it off only where promotion allows)."""
    if not ex.config.disable_hybrid_kv_cache_manager:
        return None
    return _with(ex, config=attrs.evolve(ex.config, disable_hybrid_kv_cache_manager=False))


def _no_host(rng: random.Random, ex: Example) -> Example | None:
    """Every layer back on the device: host offload is a deployment's option, not the model's."""
    config = ex.config
    if not config.host_resident_layers or config.hisparse is not None:
        return None  # HiSparse's host pool is its own, sized by its settings
    return _with(
        ex, config=attrs.evolve(config, host_resident_layers=frozenset(), host_pool_bytes=None)
    )


def _blocks(rng: random.Random, ex: Example) -> Example | None:
    choices = [1, rng.randint(2, 4), 2 * rng.randint(2, 31) + 1, rng.randint(17, 1024)]
    choices.append(rng.randint(1025, 1 << 16))
    return _with(ex, num_blocks=rng.choice(choices))


def _memory(rng: random.Random, ex: Example) -> Example | None:
    factor = rng.choice([0.5, 0.9, 1.1, 2.0, 8.0])
    return _with(ex, available_memory=tuple(int(m * factor) for m in ex.available_memory))


def _one_stage(rng: random.Random, ex: Example) -> Example | None:
    if len(ex.workers) < 2:
        return None
    return _with(
        ex,
        config=attrs.evolve(ex.config, pipeline_parallel_size=1),
        workers=(ex.merged,),
        available_memory=(max(ex.available_memory),),
    )


def _restructured(ex: Example, workers: Workers, host: frozenset[str]) -> Example | None:
    """``ex`` with other layers: the config describes the new model (decoder and draft layers).

    ``host`` is what stays host-resident.  HiSparse and a declared grouping
    name their layers themselves, so their examples are not restructured.
    """
    config = ex.config
    if config.hisparse is not None or config.model_kv_cache_grouping is not None:
        return None
    if any(not w for w in workers):
        return None
    merged = {n: s for w in workers for n, s in w.items()}
    fields = model_config_fields(merged)
    fields["hf_config"] = described_again(config.hf_config, merged)
    config = attrs.evolve(config, **fields)
    if host != config.host_resident_layers:
        pool = config.host_pool_bytes if host else None
        config = attrs.evolve(config, host_resident_layers=host, host_pool_bytes=pool)
    return _with(ex, config=config, workers=workers)


def _without(ex: Example, dropped: set[str]) -> Example | None:
    if not dropped:
        return None
    workers = tuple({n: s for n, s in w.items() if n not in dropped} for w in ex.workers)
    return _restructured(ex, workers, ex.config.host_resident_layers - dropped)


#: A decoder layer's cache: ``<head>layers.<index><tail>`` (``model.layers.7.self_attn.attn``).
_DECODER = re.compile(r"^(?P<head>(?:.+\.)?layers\.)(?P<index>\d+)(?P<tail>\..+)?$")


def _tail(name: str) -> str:
    """What follows a decoder layer's index in ``name`` (``.self_attn.attn``)."""
    found = _DECODER.match(name)
    return "" if found is None else found["tail"] or ""


def _add_layer(rng: random.Random, ex: Example) -> Example | None:
    """One more target decoder layer: a copy of a drawn one's caches, after the last one.

    Half the time the copy leaves one of its caches out: a layer that lacks
    a role its neighbours carry.  The new layer takes the index after its
    namespace's last decoder layer (cache-less ones counted) and joins the
    stage that holds the last target layer; layers numbered after it there
    (an MTP draft, ``model.layers.{n}``) move one up, as the model's own
    numbering would.  A gate that counts layers or
    wants two of a kind (two indexed layers, one of them without its
    indexer) needs a layer that no dropping can make.
    """
    layers: dict[tuple[str, int], list[str]] = {}
    for name, spec in ex.merged.items():
        found = _DECODER.match(name)
        if found is not None and not spec.is_draft:
            layers.setdefault((found["head"], int(found["index"])), []).append(name)
    if not layers:
        return None
    main = next(iter(layers))[0]
    # The layer's kind (the caches it holds) drawn first, as drop-layer draws
    # a role: a model's one indexed layer among a dozen state layers is copied as often.
    kinds: dict[tuple[str, ...], list[tuple[str, int]]] = {}
    for key, names in sorted(layers.items()):
        kinds.setdefault(tuple(sorted(_tail(n) for n in names)), []).append(key)
    head, index = rng.choice(kinds[rng.choice(sorted(kinds))])
    last_index = max(i for h, i in layers if h == head)
    last = set(layers[(head, last_index)])
    new = last_index + 1
    if head == main and ex.config.num_hidden_layers is not None:
        # Decoder layers after the last cache (a Nemotron-H pattern ending in
        # MLP layers) are still layers: the new one comes after them all.
        new = max(new, ex.config.num_hidden_layers)

    def moved(name: str) -> str:
        found = _DECODER.match(name)
        if found is None or found["head"] != head or int(found["index"]) < new:
            return name
        return f"{head}{int(found['index']) + 1}{found['tail'] or ''}"

    copied = layers[(head, index)]
    if len(copied) > 1 and rng.random() < 0.5:
        # A layer without one of the roles its model's layers carry (a layer
        # that reuses another's indexer, as IndexCache's do).
        left_out = rng.choice(copied)
        copied = [n for n in copied if n != left_out]
    copies = {f"{head}{new}{_tail(n)}": ex.merged[n] for n in copied}
    workers: list[dict[str, KVCacheSpec]] = []
    for worker in ex.workers:
        made: dict[str, KVCacheSpec] = {}
        for name, spec in worker.items():
            made[moved(name)] = spec
            if name in last:
                last.discard(name)
                if not last:
                    made.update(copies)
        workers.append(made)
    host = frozenset(moved(n) for n in ex.config.host_resident_layers)
    return _restructured(ex, tuple(workers), host)


def _drop_layer(rng: random.Random, ex: Example) -> Example | None:
    """One cache gone: of a role drawn first, so a rare role's caches are dropped as often.

    Drawn over names alone, a GLM-5 model's dozen state layers would take
    nearly every drop, and its one indexer (whose absence a gate may test) almost none.
    """
    by_role: dict[str, list[str]] = {}
    for name in sorted(ex.merged):
        by_role.setdefault(name.rpartition(".")[2], []).append(name)
    if not by_role:
        return None
    role = rng.choice(sorted(by_role))
    return _without(ex, {rng.choice(by_role[role])})


def _drop_role(rng: random.Random, ex: Example) -> Example | None:
    """Every cache of one role (``...indexer``, ``...attn``) gone: a role absent, the rest kept."""
    roles = sorted({name.rpartition(".")[2] for name in ex.merged})
    if len(roles) < 2:
        return None
    role = rng.choice(roles)
    return _without(ex, {n for n in ex.merged if n.rpartition(".")[2] == role})


def _base_class(rng: random.Random, ex: Example) -> Example | None:
    """Every spec of one class rebuilt as its parent class: an exact-type gate's other side."""
    classes = sorted({type(s) for s in ex.merged.values()}, key=lambda c: c.__qualname__)
    rng.shuffle(classes)
    for cls in classes:
        base = cls.__mro__[1]
        if base not in _BASES:
            continue
        try:
            workers = tuple(
                {n: _as(base, s) if type(s) is cls else s for n, s in w.items()} for w in ex.workers
            )
        except (TypeError, ValueError):
            continue
        return _with(ex, workers=workers)
    return None


#: The parents a spec may become: the concrete classes vLLM has too (an abstract
#: base sizes no page, and a vLLM-native builder must be handed vLLM's classes).
#: (A state spec's parent sizes no state, so no state class is among them.)
_BASES = (FullAttentionSpec, SlidingWindowSpec)


def _as(base: type, spec: KVCacheSpec) -> KVCacheSpec:
    fields = {f.name: getattr(spec, f.name) for f in attrs.fields(base) if f.init}
    made: KVCacheSpec = base(**fields)
    try:
        made.page_size_bytes  # noqa: B018 - a base that sizes no page is not a spec to hand over
    except NotImplementedError:
        raise TypeError(f"{base.__name__} is not a concrete spec class") from None
    return made


#: ``(name, operator)``: each returns the mutated example, or ``None`` where it does not apply.
MUTATIONS: tuple[tuple[str, Callable[[random.Random, Example], Example | None]], ...] = (
    ("layout", _relayout),
    ("hybrid", _hybrid),
    ("no-host", _no_host),
    ("blocks", _blocks),
    ("memory", _memory),
    ("one-stage", _one_stage),
    ("add-layer", _add_layer),
    ("drop-layer", _drop_layer),
    ("drop-role", _drop_role),
    ("base-class", _base_class),
)


def _with(ex: Example, **changes: Any) -> Example | None:
    try:
        return attrs.evolve(ex, **changes)
    except (TypeError, ValueError):
        # A combination PlanningConfig refuses (its validators name why).
        return None


#: How many operators one candidate stacks, drawn from these.  As a fuzzer's
#: "havoc" stage does: a change that reaches nothing new on its own (one
#: pipeline stage) and one that then opens a gate (a dropped indexer) make one
#: candidate, where a corpus that keeps only reach-growing examples would
#: never keep the first to try the second on it.
STACK = (1, 1, 2, 3)


def _applied(rng: random.Random, ex: Example) -> Iterator[tuple[str, Example]]:
    """The operators that apply to ``ex``, in a random order, each result not yet validated."""
    order = list(MUTATIONS)
    rng.shuffle(order)
    for name, operator in order:
        try:
            made = operator(rng, ex)
        except (TypeError, ValueError):
            made = None
        if made is not None:
            yield name, made


def _valid(made: Example, limits: Limits) -> Example | None:
    config = limits.fit(made.config)
    if reference_accepts(config, made.workers) and _core_can_plan(made, config):
        return attrs.evolve(made, config=config)
    return None


def mutate(rng: random.Random, ex: Example, limits: Limits) -> tuple[str, Example] | None:
    """One to three stacked structural mutations of ``ex``, still a valid problem, or ``None``.

    Valid as every generated example is: what the builder can be given
    (``limits``) and what the reference can plan.  The name is the
    operators', joined by ``+`` (``one-stage+drop-layer``).
    """
    names: list[str] = []
    current = ex
    for _ in range(rng.choice(STACK)):
        step = next(_applied(rng, current), None)
        if step is None:
            break
        names.append(step[0])
        current = step[1]
    if len(names) > 1 and (stacked := _valid(current, limits)) is not None:
        name = "+".join(names)
        return name, attrs.evolve(stacked, description=describe(stacked, ex.description, name))
    # One operator: each in turn until one makes a valid problem.
    for name, made in _applied(rng, ex):
        if (valid := _valid(made, limits)) is not None:
            return name, attrs.evolve(valid, description=describe(valid, ex.description, name))
    return None


def _core_can_plan(ex: Example, config: PlanningConfig) -> bool:
    """Whether the reference's Core flow answers the mutant (a typed refusal is an answer).

    A mutant on which kvref itself fails untyped is outside what the
    generator makes; judging a builder on it would blame the builder.
    """
    try:
        plan_kv_cache(_REFERENCE, config, ex.workers, ex.available_memory)
    except KVRefError:
        return True
    except Exception:
        return False
    return True


def describe(ex: Example, parent: str, operator: str) -> str:
    """The readable counterexample of a mutated example: its own values, its origin named.

    The parent's description (``PlanningProblem('<family>: <model>; ...', ...)``)
    lends its first line, so the family stays readable (coverage, reports).
    """
    head, sep, _ = parent.partition("',\n")
    title = head.removeprefix("PlanningProblem('") if sep else family_of(parent)
    problem = PlanningProblem(
        ex.config,
        list(ex.workers),
        list(ex.available_memory),
        f"{title}; explored: {operator}",
    )
    return f"{problem!r}, num_blocks={ex.num_blocks}"


@attrs.define
class ExploreSummary:
    """What exploration did (the report's ``reach.explore``)."""

    seconds: float = 0.0
    candidates: int = 0
    kept: int = 0
    seeds: int = 0
    replayed: int = 0
    lines_before: int = 0
    lines_after: int = 0
    kept_by: dict[str, int] = attrs.field(factory=dict)
    stopped: str = "not run"

    def as_dict(self) -> dict[str, Any]:
        """JSON-able."""
        return attrs.asdict(self)


#: Judges one example in the explored scenarios (the runner binds its tallies).
Judge = Callable[[Any, Example], None]


class Explorer:
    """One run's exploration (see the module docstring)."""

    def __init__(
        self,
        *,
        judge: Judge,
        lines: Callable[[], int],
        fresh: Callable[[int], list[tuple[Any, Example]]],
        strata_by_name: Mapping[str, Any],
        limits: Limits,
        seed: int,
        corpus: Corpus,
    ) -> None:
        self.judge = judge
        self.corpus = corpus
        self.lines = lines
        self.fresh = fresh
        self.strata_by_name = strata_by_name
        self.limits = limits
        self.rng = random.Random(f"explore/{seed}")
        self.kept: list[tuple[Any, Example]] = []
        #: Per kept example, the new lines it reached: its share of the mutations.
        self.gains: list[int] = []
        self.summary = ExploreSummary()
        #: Batches of fresh candidates drawn so far (each its own seed).
        self.rounds = 0
        self._judged: set[int] = set()
        # Keeps the judged examples alive, so that no other object takes their ids.
        self._alive: list[Example] = []

    def owns(self, ex: Example) -> bool:
        """Whether ``ex`` was judged by exploration (a candidate or a replayed corpus entry)."""
        return id(ex) in self._judged

    def _judge(self, stratum: Any, ex: Example) -> None:
        self._judged.add(id(ex))
        self._alive.append(ex)
        self.judge(stratum, ex)

    def _stratum_of(self, ex: Example) -> Any:
        found = self.strata_by_name.get(family_of(ex.description))
        return found if found is not None else next(iter(self.strata_by_name.values()))

    def seed(self, stratum: Any, ex: Example, gain: int = 1) -> None:
        """Keep a first-deal example that reached ``gain`` new lines (the corpus' seeds)."""
        self._keep(stratum, ex, gain)
        self.summary.seeds += 1

    def _keep(self, stratum: Any, ex: Example, gain: int) -> None:
        self.kept.append((stratum, ex))
        self.gains.append(max(1, gain))

    def replay(self, saved: Sequence[Example]) -> None:
        """Judge a saved corpus first: the kept examples of earlier runs."""
        for ex in saved:
            stratum = self._stratum_of(ex)
            before = self.lines()
            self._judge(stratum, ex)
            self._keep(stratum, ex, self.lines() - before)
        self.summary.replayed = len(saved)

    def run(self, seconds: float, max_candidates: int | None = None) -> ExploreSummary:
        """Explore for ``seconds`` (or ``max_candidates`` candidates, whichever ends first)."""
        started = time.perf_counter()
        summary = self.summary
        summary.lines_before = reached = self.lines()
        batch: list[tuple[Any, Example]] = []
        idle = barren = 0
        summary.stopped = "time spent"
        while time.perf_counter() - started < seconds:
            if max_candidates is not None and summary.candidates >= max_candidates:
                summary.stopped = f"{max_candidates} candidates"
                break
            # Every kept example is owed its own mutations before exploration gives up.
            patience = PATIENCE * max(1, len(self.kept))
            if idle >= patience:
                summary.stopped = f"{patience} candidates in a row reached nothing new"
                break
            picked = self._candidate(batch)
            if picked is None:
                barren += 1
                if barren >= PATIENCE:
                    summary.stopped = f"{PATIENCE} tries in a row made no valid candidate"
                    break
                continue
            barren = 0
            how, stratum, ex = picked
            self._judge(stratum, ex)
            summary.candidates += 1
            now = self.lines()
            if now > reached:
                self._keep(stratum, ex, now - reached)
                reached, idle = now, 0
                summary.kept += 1
                summary.kept_by[how] = summary.kept_by.get(how, 0) + 1
            else:
                idle += 1
        summary.lines_after = reached
        summary.seconds = round(time.perf_counter() - started, 3)
        return summary

    def _candidate(self, batch: list[tuple[Any, Example]]) -> tuple[str, Any, Example] | None:
        if self.kept and self.rng.random() < 0.7:
            # As a fuzzer's energy: an example that opened more new code is
            # mutated more often (it reaches deeper into the builder).
            stratum, parent = self.rng.choices(self.kept, weights=self.gains)[0]
            made = mutate(self.rng, parent, self.limits)
            return None if made is None else (made[0], stratum, made[1])
        if not batch:
            batch.extend(self.fresh(self.rounds))
            self.rounds += 1
            if not batch:
                return None
        stratum, ex = batch.pop()
        return "fresh", stratum, ex
