"""How a scenario's examples are dealt over the model families (strata).

One Hypothesis run of 50 examples over twenty families misses some family
at most seeds, and repeats near-duplicates of what it drew first: a vendor
builder's DeepSeek-V4 branch would run at one seed and not at the next, so
its reach and its verdicts would depend on luck.  Each scenario therefore
deals its examples over strata, each drawn by its own Hypothesis run:

- every built-in family gets an equal share (the seed picks which families
  get the remainder, so that successive seeds cover them all when there are
  fewer examples than families);
- the vendor's models, when given, get half of the examples first (all of
  them with ``--models-only``);
- a family's share is drawn in two runs, one leaning to block-outermost
  layouts and one away from them (where the model allows either), so that
  a gate on the layout class opens at every seed.

A Hypothesis run starts from its simplest example, a family's smallest
model with roomy memory: the same at every seed.  Only the scenario's first
stratum keeps it (a plan every invariant of a small run can judge, as one
Hypothesis run would start); the others skip it, so that their examples are
random draws.  The vendor's models are always kept as given.  The whole deal
is a function of the seed, the scenario and the example count, so a
reproduce line replays it exactly.
"""

from __future__ import annotations

import contextlib
import random
import zlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import hypothesis
import hypothesis.errors
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from conformance.generate.determinism import seed_only_draws
from conformance.generate.engine_paths import EnginePath
from conformance.generate.limits import NO_LIMITS, Limits
from conformance.generate.records import Model
from conformance.run.interrupts import interrupts_unmasked
from conformance.scenarios import registry
from conformance.scenarios.examples import Example

__all__ = [
    "VENDOR_SHARE",
    "Body",
    "FocusExchange",
    "Stratum",
    "deal",
    "draw",
    "draw_examples",
    "draw_pinned",
    "run_strata",
    "sample",
    "split_by_example",
    "stratum_seed",
]

#: Share of a scenario's examples dealt to the vendor's models when they are
#: mixed with the built-in families.
VENDOR_SHARE = 0.5


@attrs.frozen
class Stratum:
    """One source of models with its own Hypothesis run.

    Attributes:
        name: the family, or ``vendor``.
        models: the models it draws.
        share: the fraction of the scenario's examples it gets first (``0``:
            an equal part of what the shares leave).
        not_in: scenarios it can draw no valid example for.
        keep_simplest: keep the run's simplest example in every scenario (the
            vendor's models as given).
        limits: what the run's builder cannot be given (its examples leave it out).
    """

    name: str
    models: st.SearchStrategy[Model] = attrs.field(eq=False)
    share: float = 0.0
    keep_simplest: bool = False
    not_in: frozenset[str] = frozenset()
    limits: Limits = NO_LIMITS

    def examples(
        self,
        scenario: str,
        profile: str,
        paths: frozenset[EnginePath] | None = None,
        lean: bool | None = None,
    ) -> st.SearchStrategy[Example]:
        """This stratum's examples of ``scenario``, fit to the builder's limits.

        ``paths``: only examples on these engine paths (a focus, focus.py);
        ``lean``: towards block-outermost layouts or away from them.
        """
        return registry.examples(
            scenario,
            models=self.models,
            profile=profile,
            limits=self.limits,
            paths=paths,
            lean=lean,
        )


def run_strata(
    vendor: st.SearchStrategy[Model] | None, *, only: bool, limits: Limits = NO_LIMITS
) -> tuple[Stratum, ...]:
    """The strata of a run.

    Args:
        vendor: the vendor's models (``None``: none given).
        only: generate from the vendor's models alone.
        limits: what the builder cannot be given: a family that could serve a
            scenario only with such inputs does not serve it.
    """
    from conformance.generate.families import DEFAULT_FAMILIES, family_strategy

    own = (
        ()
        if vendor is None
        else (Stratum("vendor", vendor, VENDOR_SHARE, keep_simplest=True, limits=limits),)
    )
    if only:
        return tuple(attrs.evolve(s, share=1.0) for s in own)

    def not_in(name: str) -> frozenset[str]:
        return frozenset(s.name for s in registry.scenarios() if not s.admits(name, limits))

    families = (
        Stratum(name, family_strategy(name), not_in=not_in(name), limits=limits)
        for name in DEFAULT_FAMILIES
    )
    return (*own, *families)


def deal(
    strata: Sequence[Stratum], total: int, seed: int, scenario: str
) -> list[tuple[Stratum, int]]:
    """How many examples each stratum draws: every count >= 1, summing to ``total``.

    The strata with a share take it first (at least one example); the others
    split the rest equally, the seed choosing which of them get one more.
    """
    strata = [s for s in strata if scenario not in s.not_in]
    counts = {s.name: 0 for s in strata}
    left = total
    for stratum in strata:
        if stratum.share:
            take = min(left, max(1, int(total * stratum.share)))
            counts[stratum.name] = take
            left -= take
    equal = [s for s in strata if not s.share]
    if equal:
        base, extra = divmod(left, len(equal))
        lucky = list(equal)
        random.Random(f"{seed}/{scenario}").shuffle(lucky)
        for rank, stratum in enumerate(lucky):
            counts[stratum.name] = base + (rank < extra)
    return [(s, counts[s.name]) for s in strata if counts[s.name]]


def stratum_seed(seed: int, scenario: str, stratum: str) -> int:
    """The Hypothesis seed of one stratum's run."""
    return (seed + zlib.crc32(f"{scenario}/{stratum}".encode())) % 2**32


#: Pools one shard's focus pins with the other shards' (``check_builder(focus_exchange=)``).
FocusExchange = Callable[[Mapping[str, frozenset[EnginePath]]], Mapping[str, frozenset[EnginePath]]]

#: What a scenario's body is told: the stratum, the example, and whether the
#: example is of the first deal (the focus learns from those alone).
Body = Callable[[Stratum, Example, bool], Any]


def draw(
    scenario: str,
    strata: Sequence[Stratum],
    total: int,
    seed: int,
    profile: str,
    body: Body,
    deals: Callable[[Stratum], bool] | None = None,
) -> list[str]:
    """Run ``body`` on every example of ``scenario``'s first deal, stratum by stratum.

    Returns the strata that could draw no valid example for ``scenario``
    (an attention-free model has nothing to keep on the host, say): the
    report lists them, since their share of examples judged nothing.
    ``deals``: only the strata it keeps run (a shard's; the deal is the whole run's).
    """
    empty: list[str] = []
    owns = deals or _every
    for index, (stratum, count) in enumerate(deal(strata, total, seed, scenario)):
        if not owns(stratum):
            continue
        skip = index > 0 and not stratum.keep_simplest
        # A family's examples lean half to block-outermost layouts, half away
        # from them: a platform's gates read that first, and two or three
        # examples left to chance all fell on one side at some seeds.  The
        # vendor's models keep their own layouts; a lean the model cannot
        # follow draws among the layouts it allows.
        halves = (
            [(count - count // 2, True, scenario), (count // 2, False, f"{scenario}/layer-outer")]
            if count >= 2 and not stratum.share and registry.get(scenario).leans
            else [(count, None, scenario)]
        )
        drew = False
        for part, lean, label in halves:
            try:
                _one_run(
                    scenario, stratum, part, seed, profile, body,
                    skip_simplest=skip, lean=lean, label=label,
                )  # fmt: skip
                drew = True
            except hypothesis.errors.Unsatisfiable:
                pass
            skip = not stratum.keep_simplest
        if not drew:
            empty.append(stratum.name)
    return empty


def draw_examples(scenario: str, seed: int, max_examples: int) -> list[Any]:
    """The examples a run with ``seed`` draws for ``scenario`` (the runner's own deal)."""
    drawn: list[Any] = []
    draw(
        scenario,
        run_strata(None, only=False),
        max_examples,
        seed,
        "ci",
        lambda _stratum, ex, _first: drawn.append(ex),
    )
    return drawn


def draw_pinned(
    scenario: str,
    strata: Sequence[Stratum],
    count: int,
    seed: int,
    profile: str,
    body: Body,
    pins: Mapping[str, frozenset[EnginePath]],
    deals: Callable[[Stratum], bool] | None = None,
    *,
    label: str,
) -> list[tuple[str, int]]:
    """Run ``body`` on ``count`` more examples of ``scenario``, on pinned engine paths.

    They are dealt equally over the strata ``pins`` names (``label`` seeds
    the deal), each drawn on its engine paths only (a focus:
    conformance.extensions.focus).  Returns the examples dealt to each
    stratum (``deals``: to the strata it keeps, the only ones that run).
    """
    owns = deals or _every
    # The scenario's own exclusions (deal is told the label, not the scenario).
    pinned = [
        attrs.evolve(s, share=0.0) for s in strata if s.name in pins and scenario not in s.not_in
    ]
    if not pinned:
        return []
    extra = [(s, n) for s, n in deal(pinned, count, seed, label) if owns(s)]
    for stratum, part in extra:
        # No valid example on those paths: the first deal's verdicts stand alone.
        with contextlib.suppress(hypothesis.errors.Unsatisfiable):
            _one_run(
                scenario,
                stratum,
                part,
                seed,
                profile,
                body,
                skip_simplest=True,
                paths=pins[stratum.name],
                label=label,
                first_deal=False,
            )
    return [(s.name, n) for s, n in extra]


def _every(_stratum: Stratum) -> bool:
    """Every stratum runs (a run that is not a shard)."""
    return True


def split_by_example(stratum: Stratum) -> bool:
    """Whether a sharded run splits ``stratum``'s examples rather than dealing it whole."""
    return stratum.share > 0


def sample(
    scenario: str, stratum: Stratum, count: int, seed: int, profile: str, label: str
) -> list[Example]:
    """``count`` examples of ``stratum`` for ``scenario``, drawn with ``label``'s own seed.

    For exploration (conformance.extensions.explore): fresh candidates, none of them
    the family's simplest example.  Empty when the stratum has no valid one.
    """
    drawn: list[Example] = []
    with contextlib.suppress(hypothesis.errors.Unsatisfiable):
        _one_run(
            scenario,
            stratum,
            count,
            seed,
            profile,
            lambda _s, ex, _first: drawn.append(ex),
            skip_simplest=True,
            label=label,
            first_deal=False,
        )
    return drawn


def _one_run(
    scenario: str,
    stratum: Stratum,
    count: int,
    seed: int,
    profile: str,
    body: Body,
    *,
    skip_simplest: bool,
    paths: frozenset[EnginePath] | None = None,
    label: str | None = None,
    lean: bool | None = None,
    first_deal: bool = True,
) -> None:
    skip = [skip_simplest]

    # A run's examples are fixed by its seed and it keeps no database: without
    # a database key Hypothesis parses no source on every run, and an
    # interrupt has less time to land before its engine exists.
    @settings(
        max_examples=count,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
        phases=[hypothesis.Phase.explicit, hypothesis.Phase.generate],
    )
    @hypothesis.seed(stratum_seed(seed, label or scenario, stratum.name))
    @hypothesis.given(stratum.examples(scenario, profile, paths, lean))
    def run(ex: Example) -> None:
        if skip[0]:
            # The family's simplest model (module docstring).
            skip[0] = False
            hypothesis.reject()
        body(stratum, ex, first_deal)

    run._hypothesis_internal_database_key = None  # type: ignore[attr-defined]
    # Hypothesis may meet an interrupt before its engine exists and raise its
    # own error: the run was interrupted, nothing failed.
    with seed_only_draws(), interrupts_unmasked():
        run()
