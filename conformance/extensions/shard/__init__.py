"""Shards (``--shard I/N``): one run's work dealt over several machines.

``conformance.run.shard`` says how a run splits (strata dealt whole, a
stratum with a share of its own split by example) and reads ``I/N``, which
the options validate; this extension applies it: two filters on the deal
(the strata this shard draws, the examples of a split stratum it judges)
and, at the end, the report's ``shard`` section that ``merge`` joins.
"""

from __future__ import annotations

from typing import Any

import attrs

from conformance.extensions.base import Extension, RunView, run_option
from conformance.generate.coverage import coverage_sets
from conformance.run.shard import Shard
from conformance.run.strata import Stratum, split_by_example

__all__ = ["SHARD", "ShardOptions"]


@attrs.frozen(kw_only=True)
class ShardOptions:
    """The shard extension's options: the run's options of the same names.

    Attributes:
        shard: ``"I/N"``: this run judges the I-th of N shares (``None``: the whole run).
    """

    shard: str | None = run_option("shard")


def _start(run_options: Any, _options: ShardOptions) -> Shard | None:
    # Read through the options, which validated it (a shard of one is the whole run's too).
    shard: Shard | None = run_options.shard_of()
    return shard


def _deals(shard: Shard, run: RunView, stratum: Stratum) -> bool:
    # A stratum with a share of its own is split by example: every shard draws it.
    positions = [s.name for s in run.strata]
    return split_by_example(stratum) or shard.owns(positions.index(stratum.name))


def _judges(shard: Shard, _run: RunView, stratum: Stratum, index: int) -> bool:
    return not split_by_example(stratum) or shard.owns_example(index)


def _end(shard: Shard, run: RunView, report: Any) -> Any:
    """What ``merge`` needs of a sharded run."""
    data = {
        "index": shard.index,
        "count": shard.count,
        "tallies": {
            r.id: run.tallies[r.id].as_dict() for r in report.results if r.id in run.tallies
        },
        "coverage": {s: coverage_sets(examples) for s, examples in run.drawn.items()},
    }
    return attrs.evolve(report, shard=data)


SHARD = Extension(
    name="shard",
    options=ShardOptions,
    start=_start,
    deals=_deals,
    judges=_judges,
    end=_end,
)
