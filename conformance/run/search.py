"""Hypothesis searches for one invariant: replay saved counterexamples, shrink a failure."""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import hypothesis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.database import DirectoryBasedExampleDatabase, ExampleDatabase

from conformance.check.catalog import Invariant, Unjudged
from conformance.errors import OptionError
from conformance.generate.determinism import seed_only_draws
from conformance.run.interrupts import interrupts_unmasked
from conformance.scenarios.examples import Example

__all__ = [
    "SEARCH_OBSERVATIONS",
    "SEARCH_SECONDS",
    "DatabaseError",
    "Namespaced",
    "check_database",
    "fails",
    "search",
]

#: The key under which a corner lists its strata that saved something.
_STRATA = b"\x00strata"
#: A stratum's name: a model family, or ``vendor`` (conformance.run.strata).
_STRATUM = re.compile(r"^[a-z][a-z0-9_]{0,63}$")

#: Observations of the builder one search may make.  A count, not a time: where a
#: clock ended the shrink (it took 8 s), how far it got depended on the machine's
#: load, and two runs of one seed (a run and its shards) reported different
#: counterexamples.  A full shrink of the kit's slowest check (KV-DEV-TAGS on a
#: planted overlap) makes about 120 observations.
SEARCH_OBSERVATIONS = 200
#: Wall-clock bound of one search, for a builder so slow that the count takes longer
#: (only then does the counterexample depend on the machine).
SEARCH_SECONDS = 60.0

#: Observes one example in a scenario (the runner binds the builder and the guard).
Observer = Callable[[str, Example], Any]


class Namespaced(ExampleDatabase):
    """One builder's and one invariant's corner of a shared example database.

    Every invariant's search runs the same test function, so Hypothesis would
    give them one key; the prefix keeps their counterexamples apart.
    """

    def __init__(self, inner: ExampleDatabase, prefix: str, *, stratum: str | None = None) -> None:
        super().__init__()
        self.inner = inner
        self.base = prefix.encode()
        self.stratum = stratum
        # Each stratum (conformance.run.strata) draws with its own strategy, so a
        # saved choice sequence replays only under the stratum that saved it.
        self.prefix = self.base + (b"" if stratum is None else stratum.encode() + b"|")

    def strata(self) -> set[str]:
        """The strata that saved counterexamples in this corner.

        An entry that is no stratum's name names none: the run checked the
        database before it started (:func:`check_database`), and what a
        builder process wrote there since must not stop the replay.
        """
        names = (raw.decode("utf-8", "replace") for raw in self.inner.fetch(self.base + _STRATA))
        return {name for name in names if _STRATUM.match(name)}

    def save(self, key: bytes, value: bytes) -> None:
        """Save under this corner's prefix, and note the stratum for the replay."""
        self.inner.save(self.prefix + key, value)
        if self.stratum is not None:
            self.inner.save(self.base + _STRATA, self.stratum.encode())

    def fetch(self, key: bytes) -> Iterable[bytes]:
        """Fetch from this corner."""
        return self.inner.fetch(self.prefix + key)

    def delete(self, key: bytes, value: bytes) -> None:
        """Delete from this corner."""
        self.inner.delete(self.prefix + key, value)


class DatabaseError(OptionError):
    """The example database holds what no run of the kit wrote: names it (a usage error)."""


def check_database(database: str | None, builder: str | None, ids: Iterable[str]) -> None:
    """Refuse a database the run cannot use, before the run starts.

    Hypothesis checks the examples it saved itself (one it cannot read is
    skipped); the kit's own entries, each corner's list of the strata that
    saved something, must be stratum names.

    Raises:
        DatabaseError: ``database`` is not a directory, or a list of strata
            holds an entry that is no stratum name (the message names it).
    """
    if database is None:
        return
    if not isinstance(database, (str, os.PathLike)) or "\x00" in str(database) or not str(database):
        raise DatabaseError(f"database={database!r} must be the path of a directory")
    path = Path(database)
    if path.exists() and not path.is_dir():
        raise DatabaseError(f"database={database!r} is not a directory")
    if builder is None or not path.is_dir():
        return
    store = DirectoryBasedExampleDatabase(database)
    for ident in ids:
        key = f"{builder}|{ident}|".encode() + _STRATA
        for raw in store.fetch(key):
            if _STRATUM.match(raw.decode("utf-8", "replace")):
                continue
            locate = getattr(store, "_value_path", None)
            entry = f" ({locate(key, raw)})" if callable(locate) else ""
            raise DatabaseError(
                f"database={database!r}: the list of strata of {ident} holds {raw[:40]!r}"
                f"{entry}, which no run of the kit wrote: delete the database directory "
                "(its saved counterexamples are then lost) or run without it"
            )


def fails(inv: Invariant, obs: Any) -> bool:
    """Whether ``obs`` breaks ``inv``."""
    outcome = inv.check(obs)
    return bool(outcome) and not isinstance(outcome, Unjudged)


def search(
    inv: Invariant,
    scenario: str,
    strategy: st.SearchStrategy[Example],
    observe: Observer,
    seed: int,
    *,
    database: ExampleDatabase | None,
    phases: Sequence[hypothesis.Phase],
    failing: Example | None = None,
    seconds: float = SEARCH_SECONDS,
    max_examples: int = 50,
    max_observations: int = SEARCH_OBSERVATIONS,
) -> Example | None:
    """The smallest failing example a Hypothesis search finds (``failing`` if none).

    With ``database`` set, examples saved by earlier runs are replayed first
    and the new minimal counterexample is saved, so a failure reproduces
    from the database as well as from the seed.  The search ends after
    ``max_observations`` observations of the builder (the same for a seed on
    every machine), or past ``seconds`` of a builder slow enough to reach it.
    """
    stop_at = time.perf_counter() + seconds
    smallest = [failing]
    observed = [0]

    class _StillFailsError(Exception):
        pass

    @settings(
        max_examples=max_examples,
        deadline=None,
        database=database,
        suppress_health_check=list(HealthCheck),
        phases=list(phases),
        report_multiple_bugs=False,
    )
    @hypothesis.seed(seed)
    @hypothesis.given(strategy)
    def run(ex: Example) -> None:
        # Hypothesis shrinks towards smaller inputs, so the last failing example
        # it tries is the smallest.  Past the budget nothing fails any more,
        # which ends the search with the best example so far.
        if observed[0] >= max_observations or time.perf_counter() > stop_at:
            return
        observed[0] += 1
        if fails(inv, observe(scenario, ex)):
            smallest[0] = ex
            raise _StillFailsError

    # The search ends, with its best example, on any failure of its own; an
    # interrupt Hypothesis reported as its error stops the run.
    with seed_only_draws(), contextlib.suppress(Exception), interrupts_unmasked():
        run()
    return smallest[0]
