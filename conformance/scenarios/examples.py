"""The examples the scenarios draw: a planning problem plus each scenario's extras."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import hypothesis
from hypothesis import strategies as st

from conformance.generate import strategies as kst
from conformance.generate.engine_paths import EnginePath, engine_path
from conformance.generate.limits import NO_LIMITS, Limits
from conformance.generate.problems import (
    DEFAULT_MAX_MEMORY_BYTES,
    DEFAULT_MAX_WORKERS,
    Steer,
    draw_planning_problem,
    draw_problem_num_blocks,
)
from conformance.generate.records import PlanningProblem
from conformance.report.pycode import to_python
from conformance.report.records import decode_example
from kvref.axes import KVCacheLayout
from kvref.config import PlanningConfig
from kvref.specs import KVCacheSpec

__all__ = ["PLAIN", "Example", "ProblemDraw", "reference_accepts", "without_host"]


@attrs.frozen
class Example:
    """One drawn input: a planning problem plus the scenario's extras.

    Attributes:
        config: the planning config.
        workers: one ``layer -> spec`` mapping per worker.
        available_memory: bytes per worker.
        num_blocks: the block count placement is asked for.
        description: the readable counterexample.
    """

    config: PlanningConfig
    workers: tuple[Mapping[str, KVCacheSpec], ...]
    available_memory: tuple[int, ...]
    num_blocks: int
    description: str

    @property
    def merged(self) -> dict[str, KVCacheSpec]:
        """Every worker's layers in one dict, in worker order (what Core groups)."""
        out: dict[str, KVCacheSpec] = {}
        for worker in self.workers:
            out.update(worker)
        return out

    def to_python(self) -> str:
        """Python source that rebuilds this example's inputs as objects."""
        return to_python(
            {
                "config": self.config,
                "workers": [dict(w) for w in self.workers],
                "available_memory": list(self.available_memory),
                "num_blocks": self.num_blocks,
            }
        )

    @classmethod
    def from_data(cls, data: Any, description: str = "") -> Example:
        """Rebuild an example from its data form (a report's ``counterexample_data``).

        Never from :meth:`to_python`'s source: that is for people to read, and
        executing a report's Python would run whatever the report file holds.

        Raises:
            RecordError: ``data`` is not an example's data form (the message names the field).
        """
        config, workers, available_memory, num_blocks = decode_example(data)
        return cls(
            config=config,
            workers=tuple(workers),
            available_memory=tuple(available_memory),
            num_blocks=num_blocks,
            description=description,
        )

    def __repr__(self) -> str:
        return self.description


def without_host(config: PlanningConfig) -> PlanningConfig:
    """``config`` with no host-resident layers (what most scenarios place)."""
    if not config.host_resident_layers:
        return config
    return attrs.evolve(config, host_resident_layers=frozenset(), host_pool_bytes=None)


def _plain_config(
    _draw: st.DrawFn,
    config: PlanningConfig,
    _workers: Sequence[Mapping[str, KVCacheSpec]],
    _limits: Limits,
) -> PlanningConfig:
    return without_host(config)


def _plain_blocks(draw: st.DrawFn, problem: PlanningProblem) -> tuple[int, str]:
    # Spread over 1, small, odd, large and past-4-GiB backings of this model.
    return draw_problem_num_blocks(draw, problem), ""


def _no_models(_draw: st.DrawFn) -> st.SearchStrategy[kst.Model] | None:
    return None


def _no_suffix(_config: PlanningConfig) -> str:
    return ""


@attrs.frozen(kw_only=True)
class ProblemDraw:
    """How a scenario turns a generated planning problem into its example.

    Each hook draws only what its scenario needs, so a scenario's examples
    are those of the generator plus its own extras.

    Attributes:
        models: the models to draw from when the run gives none (``None``:
            the built-in families).
        num_blocks: the block count placement is asked for, and what the
            description says of how it was chosen.
        config: the scenario's config for the problem (default: no
            host-resident layers).
        per_worker: each worker's layers must be plannable alone too (a
            scenario that plans one worker at a time).
        describe: what the description adds of the final config.
    """

    models: Callable[[st.DrawFn], st.SearchStrategy[kst.Model] | None] = _no_models
    num_blocks: Callable[[st.DrawFn, PlanningProblem], tuple[int, str]] = _plain_blocks
    config: Callable[
        [st.DrawFn, PlanningConfig, Sequence[Mapping[str, KVCacheSpec]], Limits], PlanningConfig
    ] = _plain_config
    per_worker: bool = False
    describe: Callable[[PlanningConfig], str] = _no_suffix

    def examples(
        self,
        models: st.SearchStrategy[kst.Model] | None = None,
        limits: Limits = NO_LIMITS,
        paths: frozenset[EnginePath] | None = None,
        lean: bool | None = None,
    ) -> st.SearchStrategy[Example]:
        """The examples drawn from ``models`` (default: :attr:`models`, else the families).

        ``limits`` says what the builder cannot be given (never drawn for it);
        ``paths``: only problems on these engine paths (conformance.extensions.focus);
        ``lean``: towards block-outermost layouts or away from them
        (:class:`~conformance.generate.problems.Steer`).
        """
        # Decorated once, at import: a composite made per call costs a source parse.
        return _problem_example(self, models, limits, paths, lean)

    def draw_example(
        self,
        draw: st.DrawFn,
        models: st.SearchStrategy[kst.Model] | None = None,
        limits: Limits = NO_LIMITS,
    ) -> Example:
        """One draw of :meth:`examples`, made with the caller's ``draw`` (no strategy built)."""
        return _draw_problem_example(draw, self, models, limits, None, None)

    def examples_for(self, d: Any) -> st.SearchStrategy[Example]:
        """:meth:`examples` for what a run asks (a :class:`~conformance.scenarios.base.Draw`)."""
        return self.examples(d.models, d.limits, d.paths, d.lean)


#: A scenario that places the problem as generated, without host-resident layers.
PLAIN = ProblemDraw()


def _steer(paths: frozenset[EnginePath] | None, lean: bool | None) -> Steer | None:
    """The config settings a focus's engine paths fix (the rest is drawn, then checked)."""
    if paths is None:
        return None if lean is None else Steer(block_outer=lean)
    flags = {off for _, off, _ in paths}
    return Steer(
        layouts=frozenset(KVCacheLayout[layout] for layout, _, _ in paths),
        hybrid_off=next(iter(flags)) if len(flags) == 1 else None,
    )


@functools.cache
def _all_families() -> st.SearchStrategy[kst.Model]:
    """The built-in families' models, built once (see :func:`draw_planning_problem`)."""
    return kst.models()


def _draw_problem_example(
    draw: st.DrawFn,
    how: ProblemDraw,
    models: st.SearchStrategy[kst.Model] | None,
    limits: Limits,
    paths: frozenset[EnginePath] | None,
    lean: bool | None,
) -> Example:
    chosen = models if models is not None else how.models(draw)
    problem = draw_planning_problem(
        draw,
        chosen if chosen is not None else _all_families(),
        DEFAULT_MAX_WORKERS,
        DEFAULT_MAX_MEMORY_BYTES,
        _steer(paths, lean) or Steer(),
    )
    num_blocks, extra = how.num_blocks(draw, problem)
    workers = tuple(problem.workers)
    config = limits.fit(how.config(draw, problem.config, workers, limits))
    if paths is not None and engine_path(config) not in paths:
        hypothesis.reject()  # a focus keeps the engine paths the builder acted on
    if not reference_accepts(config, workers):
        # Only problems the reference can plan are valid inputs for a builder.
        hypothesis.reject()
    if how.per_worker and not all(reference_accepts(config, (w,)) for w in workers):
        hypothesis.reject()
    return Example(
        config=config,
        workers=workers,
        available_memory=tuple(problem.available_memory),
        num_blocks=num_blocks,
        description=f"{problem!r}, num_blocks={num_blocks}{extra}{how.describe(config)}",
    )


_problem_example = st.composite(_draw_problem_example)


def reference_accepts(config: PlanningConfig, workers: Sequence[Mapping[str, KVCacheSpec]]) -> bool:
    """Whether the reference can group and place the problem (only such problems are valid)."""
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
