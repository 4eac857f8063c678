"""The ``serve`` scenario: a request stream served over every worker's configs.

An example is a generated planning problem, a pool size and a request
stream.  The observer groups the model with the builder (the reference's
groups when the builder's break a grouping invariant, as placement does),
places every worker's projection of the groups with the builder, and serves
the stream over all workers' configs on the run's device.  The invariants
read the violations of the first step that broke one.

The two invariants that read the observation are declared in
:mod:`conformance.extensions.serve.invariants`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
from hypothesis import strategies as st

from conformance.check.geometry import page_bytes
from conformance.check.observations import CallResult
from conformance.extensions.serve.checks import MAX_BYTES, ServeBounds, bounds_for, run_serving
from conformance.extensions.serve.invariants import ServeObservation
from conformance.extensions.serve.machine import ServeProgram, programs
from conformance.generate import strategies as kst
from conformance.generate.limits import NO_LIMITS, Limits
from conformance.harness.hooks import Context, builder_or_reference_groups, call_placement
from conformance.scenarios.base import Scenario
from conformance.scenarios.examples import Example, ProblemDraw
from kvref.planning import project_kv_cache_groups_to_worker
from kvref.records import KVCacheConfig
from kvref.specs import KVCacheSpec

__all__ = [
    "OPS_BY_PROFILE",
    "SERVE",
    "SERVE_SCENARIO",
    "ServeExample",
    "observe_serve",
    "serve_examples",
]

#: The scenario's name.
SERVE = "serve"


def _any_blocks(draw: st.DrawFn, _problem: Any) -> tuple[int, str]:
    # Replaced by the pool size below; drawn so that the choices are those
    # of the scenario's first examples (a saved counterexample replays).
    return draw(kst.num_blocks()), ""


_BASE = ProblemDraw(num_blocks=_any_blocks)

#: Rule calls per request stream for each profile.
OPS_BY_PROFILE = {"ci": 6, "thorough": 24}

#: Block IDs the pool of a serving example may have (the null block included).
POOL_BLOCKS = (4, 48)

#: Bytes of backings (all workers) a serving example aims at; the pool shrinks to fit it.
EXAMPLE_BYTES = 16 << 20


@attrs.frozen
class ServeExample:
    """A planning problem, a pool size (``example.num_blocks``) and a request stream."""

    example: Example
    program: ServeProgram
    bounds: ServeBounds = attrs.field(eq=False)

    @property
    def config(self) -> Any:
        """The planning config."""
        return self.example.config

    @property
    def workers(self) -> tuple[Mapping[str, KVCacheSpec], ...]:
        """Each worker's layers."""
        return self.example.workers

    @property
    def merged(self) -> dict[str, KVCacheSpec]:
        """Every worker's layers in one dict."""
        return self.example.merged

    @property
    def num_blocks(self) -> int:
        """Block IDs of the pool (the null block included)."""
        return self.example.num_blocks

    @property
    def available_memory(self) -> tuple[int, ...]:
        """Bytes per worker (unused: the pool size is ``num_blocks``)."""
        return self.example.available_memory

    @property
    def description(self) -> str:
        """The problem, readable."""
        return self.example.description

    def to_python(self) -> str:
        """Python source of the problem; the stream follows as comments."""
        calls = "\n".join(f"# {line}" for line in repr(self.program).splitlines())
        return f"{self.example.to_python()}\n# request stream:\n{calls}\n"

    def __repr__(self) -> str:
        return f"{self.example!r}\n{self.program!r}"


def serve_examples(
    models: st.SearchStrategy[kst.Model] | None = None,
    *,
    max_ops: int = OPS_BY_PROFILE["ci"],
    limits: Limits = NO_LIMITS,
) -> st.SearchStrategy[ServeExample]:
    """Problems the reference can plan, pools of 4..48 blocks, streams of 1..``max_ops`` calls.

    Pools shrink (down to 2 blocks) where pages are so large that the backings
    would pass :data:`EXAMPLE_BYTES`; never a pool without room beyond the
    null block.  Streams shrink to fewer, shorter requests.
    """
    # Decorated once, at import: a composite made per call costs a source parse.
    return _serve_example(models, max_ops, limits)


@st.composite
def _serve_example(
    draw: st.DrawFn, models: st.SearchStrategy[kst.Model] | None, max_ops: int, limits: Limits
) -> ServeExample:
    base = _BASE.draw_example(draw, models, limits)
    # Every worker's pages of one block, summed: at least what each block ID costs.
    per_block = sum(page_bytes(s) for s in base.merged.values()) or 1
    fit = max(2, EXAMPLE_BYTES // per_block)
    num_blocks = draw(st.integers(min(POOL_BLOCKS[0], fit), min(POOL_BLOCKS[1], fit)))
    bounds = bounds_for(base.merged)
    program = draw(
        programs(max_prompt=bounds.max_prompt, max_ops=max_ops, max_encoder=bounds.max_encoder)
    )
    head = base.description.rsplit(", num_blocks=", 1)[0]
    example = attrs.evolve(
        base, num_blocks=num_blocks, description=f"{head}, num_blocks={num_blocks}"
    )
    return ServeExample(example=example, program=program, bounds=bounds)


def observe_serve(ctx: Context, ex: ServeExample) -> ServeObservation:
    """Place every worker's groups with the builder and serve the stream over them."""
    config = attrs.evolve(ex.config, num_gpu_blocks_override=None)
    groups, source = builder_or_reference_groups(ctx, config, ex.merged)
    builder = ctx.factory()
    configs: list[KVCacheConfig] = []
    calls: list[CallResult] = []
    for w, worker in enumerate(ex.workers):
        # Core's projection onto the stage's layers, as the placement scenario feeds it.
        projected = (
            project_kv_cache_groups_to_worker(groups, worker)
            if len(ex.workers) > 1
            else list(groups)
        )
        result, _ = call_placement(ctx.guard, builder, config, projected, ex.example.num_blocks)
        calls.append(result)
        if not result.ok:
            return ServeObservation(
                example=ex,
                configs=(),
                groups_source=source,
                violations=None,
                reason=f"placement of worker {w} failed (see KV-CALL-* and KV-PLACE-*)",
                calls=tuple(calls),
            )
        configs.append(result.value)
    found = run_serving(
        configs,
        config.kv_cache_layout,
        ctx.device,
        program=ex.program,
        layer_specs=[dict(w) for w in ex.workers],
        bounds=ex.bounds,
        max_bytes=ctx.max_alloc_bytes or MAX_BYTES,
    )
    return ServeObservation(
        example=ex,
        configs=tuple(configs),
        groups_source=source,
        violations=None if found is None else tuple(found),
        reason=None
        if found is not None
        else (
            "the configs cannot be served: views that cannot be built, groups that differ "
            "across workers, or backings above the allocation cap (the static invariants "
            "report the first two)"
        ),
        calls=tuple(calls),
    )


def _observe(ctx: Context, ex: Any) -> ServeObservation:
    return observe_serve(ctx, ex)


SERVE_SCENARIO = Scenario(
    name=SERVE,
    examples=lambda d: serve_examples(d.models, max_ops=OPS_BY_PROFILE[d.profile], limits=d.limits),
    observe=_observe,
    # Request streams draw their own small problems; a lean would only reseed them.
    leans=False,
)
