"""Small kit runs for the tests: ``check_builder`` with the quick options written once.

A test of the kit runs it on a few invariants, a few examples and a fixed
seed; what its claim is not about it need not pay for.  :func:`quick_check`
says those options once (:data:`QUICK`), so a test states only what its claim
is about: the builder, the invariants, the examples, the seed, and whatever
else it turns (``isolate=True``, ``focus="off"``, ``models=...``).
"""

from __future__ import annotations

from typing import Any

from conformance.report.model import Report
from conformance.run.runner import check_builder

#: What a quick run leaves out unless the test asks for it: the builder's worker
#: process (it runs in the test's process; a test of isolation, of the worker's
#: limits, or of what a fresh process sees passes ``isolate=True``) and reach
#: (coverage.py's tracing; the reach tests pass ``reach=True``).  The example
#: database is off too, as by default: a test must not replay what another saved.
QUICK: dict[str, Any] = {"isolate": False, "reach": False}


def quick_check(
    builder: Any, *select: str, examples: int | None = None, seed: int, **overrides: Any
) -> Report:
    """``check_builder(builder)`` on the invariants ``select``, with :data:`QUICK` options.

    Args:
        builder: what ``check_builder`` takes (a class, an instance, ``module:Class``).
        select: invariant ids or prefixes; none: the whole catalog.
        examples: examples per scenario (``None``: the profile's, 50 on ``ci``).
        seed: the run's seed.
        overrides: any other option of ``check_builder``; one :data:`QUICK`
            names replaces the quick value.
    """
    options = {**QUICK, **overrides}
    return check_builder(
        builder, select=list(select) or None, max_examples=examples, seed=seed, **options
    )


def cli_args(*select: str, examples: int, seed: int) -> list[str]:
    """The CLI's options (``kvref-conformance``) of a run like :func:`quick_check`'s.

    The invariants ``select``, the examples and the seed, and no example
    database; the builder, and anything else, the test adds.
    """
    return [
        *("--select", ",".join(select)),
        *("--max-examples", str(examples), "--seed", str(seed), "--no-database"),
    ]


def plugin_args(builder: str, *, examples: int, seed: int) -> list[str]:
    """``pytest``'s arguments that run the kit's plugin on ``builder``: its items, not the cache.

    The test adds which items (``-k``, ``--kv-select``) and the rest.
    """
    return [
        *("--pyargs", "conformance", "-p", "no:cacheprovider", "--kv-builder", builder),
        *("--kv-max-examples", str(examples), "--kv-seed", str(seed)),
    ]
