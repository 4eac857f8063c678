"""Shards: one run's work dealt over several machines, joined again by ``merge``.

A run deals every scenario's examples over strata (strata.py), each drawn by
its own Hypothesis run whose seed depends only on the run's seed, the
scenario and the stratum, never on the others.  So the run splits exactly
along strata: shard ``I/N`` runs the strata at positions ``I-1``,
``I-1+N``, ... of the run's strata (the vendor's models first, then the
built-in families), in every scenario and in the focus, with each
scenario's deal computed over all strata as the whole run computes it.

The vendor's stratum (``--models``) takes half of every scenario's examples,
or all of them with ``--models-only``: dealt whole, it would make one shard
the run's slowest by far.  So a stratum with a share of its own is split by
example instead: every shard draws its examples (drawing costs little next
to judging, and the examples do not depend on which are judged) and judges
those at positions ``I-1``, ``I-1+N``, ... of them (:meth:`Shard.owns_example`).

Each shard's report carries what the merge needs to rebuild the whole run's
report (:mod:`conformance.ci.merge`): the per-invariant tallies with the place
of each first failure (the whole run reports the first failure in its order,
so the merge keeps the earliest), the distinct models and block counts per
scenario, and the executed lines of the builder's functions.

The focus is learned from every stratum's answers, which no shard sees: a
sharded run takes it as given (``--focus off``, or a focus an earlier run
learned).
"""

from __future__ import annotations

import attrs

__all__ = ["Shard", "order_key"]


@attrs.frozen
class Shard:
    """Shard ``index`` of ``count`` (1-based)."""

    index: int
    count: int

    @classmethod
    def parse(cls, text: str) -> Shard:
        """``"I/N"`` read.

        Raises:
            ValueError: not ``I/N`` with integers ``1 <= I <= N`` (the message says which).
        """
        if not isinstance(text, str):
            raise ValueError("must be a string I/N")
        index, sep, count = text.strip().partition("/")
        if not sep or not index.strip().isdigit() or not count.strip().isdigit():
            raise ValueError("must be I/N: the shard's number I of N shards, e.g. 2/3")
        shard = cls(int(index), int(count))
        if shard.count < 1 or not 1 <= shard.index <= shard.count:
            raise ValueError(f"must have 1 <= I <= N (got I={shard.index}, N={shard.count})")
        return shard

    def owns(self, position: int) -> bool:
        """Whether the stratum at ``position`` of the run's strata is this shard's."""
        return position % self.count == self.index - 1

    def owns_example(self, index: int) -> bool:
        """Whether the ``index``-th example of a split stratum (module docstring) is this one's."""
        return index % self.count == self.index - 1

    def spell(self) -> str:
        """``I/N``."""
        return f"{self.index}/{self.count}"


def order_key(phase: int, scenario: int, stratum: int, example: int) -> tuple[int, int, int, int]:
    """Where an example falls in the whole run's order.

    The whole run judges every scenario's first deal (``phase`` 0) in
    scenario order, stratum by stratum, then every scenario's focus
    (``phase`` 1); a failure replayed from the example database comes last
    (``phase`` 2).  Sorting by this key puts examples of several shards back
    in the order the whole run would have judged them.
    """
    return (phase, scenario, stratum, example)
