"""The examples the runner draws: a planning problem plus each scenario's extras."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import hypothesis
from hypothesis import strategies as st

from conformance.generate import strategies as kst
from conformance.generate.engine_paths import EnginePath, engine_path
from conformance.generate.limits import NO_LIMITS, Limits
from conformance.generate.problems import Steer
from conformance.report.pycode import to_python
from conformance.report.records import decode_example
from kvref.axes import KVCacheLayout
from kvref.config import PlanningConfig
from kvref.specs import KVCacheSpec

__all__ = ["Example", "examples", "reference_accepts"]


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


def _host_config(
    draw: st.DrawFn, config: PlanningConfig, merged: Mapping[str, KVCacheSpec]
) -> PlanningConfig:
    first = next(iter(merged.values()), None)
    same = [n for n, s in merged.items() if s == first]
    if not same:
        hypothesis.reject()
    count = draw(st.integers(1, len(same)))
    host = same[:count]
    # Host pages sit in LBNHC at their aligned block stride.
    host_pages = sum(merged[n].block_stride for n in host)
    host_blocks = draw(st.integers(1, 64))
    return attrs.evolve(
        config,
        host_resident_layers=frozenset(host),
        host_pool_bytes=host_pages * host_blocks + draw(st.integers(0, host_pages - 1)),
    )


def examples(
    scenario: str,
    models: st.SearchStrategy[kst.Model] | None = None,
    profile: str = "ci",
    limits: Limits = NO_LIMITS,
    paths: frozenset[EnginePath] | None = None,
) -> st.SearchStrategy[Any]:
    """The examples of ``scenario``, drawn from ``models`` (default: the built-in families).

    ``profile`` sizes what grows with it (the request streams of ``serve``);
    ``limits`` says what the builder cannot be given (never drawn for it);
    ``paths``: only problems on these engine paths (conformance.run.focus).
    """
    if scenario == "serve":
        from conformance.scenarios.serve import OPS_BY_PROFILE, serve_examples

        return serve_examples(models, max_ops=OPS_BY_PROFILE[profile])
    return problem_examples(scenario, models, limits, paths)


def problem_examples(
    scenario: str,
    models: st.SearchStrategy[kst.Model] | None = None,
    limits: Limits = NO_LIMITS,
    paths: frozenset[EnginePath] | None = None,
) -> st.SearchStrategy[Example]:
    """The planning-problem part of ``scenario``'s examples (what ``serve`` builds on)."""
    # Decorated once, at import: a composite made per call costs a source parse.
    return _problem_example(scenario, models, limits, paths)


def _steer(paths: frozenset[EnginePath] | None) -> Steer | None:
    """The config settings a focus's engine paths fix (the rest is drawn, then checked)."""
    if paths is None:
        return None
    flags = {off for _, off, _ in paths}
    return Steer(
        layouts=frozenset(KVCacheLayout[layout] for layout, _, _ in paths),
        hybrid_off=next(iter(flags)) if len(flags) == 1 else None,
    )


@st.composite
def _problem_example(
    draw: st.DrawFn,
    scenario: str,
    models: st.SearchStrategy[kst.Model] | None,
    limits: Limits,
    paths: frozenset[EnginePath] | None,
) -> Example:
    chosen = models
    if scenario == "host" and models is None and draw(st.booleans()):
        # Half the host examples are HiSparse-served models: their host
        # pool is HiSparse's, which the host invariants judge too.
        from conformance.generate.families.hisparse import hisparse_models

        chosen = hisparse_models()
    problem = draw(kst.planning_problems(models_strategy=chosen, steer=_steer(paths)))
    # Spread over 1, small, odd, large and past-4-GiB backings of this model
    # (serving sizes its own pool).
    if scenario == "serve":
        num_blocks = draw(kst.num_blocks())
    else:
        num_blocks = draw(kst.problem_num_blocks(problem))
    config = problem.config
    workers = tuple(problem.workers)
    extra = ""
    if scenario == "profiling":
        from conformance.scenarios.profiling import profiling_block_count, profiling_sizes

        reqs, capture = draw(profiling_sizes())
        num_blocks = profiling_block_count(reqs, capture)
        extra = f", max_num_reqs={reqs}, max_cudagraph_capture_size={capture}"
    if scenario == "host" and config.hisparse is None:
        if not limits.draws_generic_host():
            hypothesis.reject()  # a vendor model without HiSparse: nothing to keep on the host
        merged: dict[str, KVCacheSpec] = {}
        for w in workers:
            merged.update(w)
        # A model-declared grouping owns every layer's group, host residency
        # included (vLLM refuses it beside HiSparse): host examples have none.
        config = _host_config(draw, attrs.evolve(config, model_kv_cache_grouping=None), merged)
    elif config.host_resident_layers and scenario != "core":
        # Core keeps the generator's host layers: its host exclusions (pool
        # bytes, admission) are judged on the builder's own answers.
        config = attrs.evolve(config, host_resident_layers=frozenset(), host_pool_bytes=None)
    config = limits.fit(config)
    if paths is not None and engine_path(config) not in paths:
        hypothesis.reject()  # a focus keeps the engine paths the builder acted on
    if not reference_accepts(config, workers):
        # Only problems the reference can plan are valid inputs for a builder.
        hypothesis.reject()
    if scenario == "profiling" and not all(reference_accepts(config, (w,)) for w in workers):
        # The profiling path plans each worker alone.
        hypothesis.reject()
    description = f"{problem!r}, num_blocks={num_blocks}{extra}"
    if scenario == "host":
        description += (
            f", host_resident_layers={sorted(config.host_resident_layers)}, "
            f"host_pool_bytes={config.host_pool_bytes}"
        )
    return Example(
        config=config,
        workers=workers,
        available_memory=tuple(problem.available_memory),
        num_blocks=num_blocks,
        description=description,
    )


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
