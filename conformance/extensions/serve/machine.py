"""Request streams: the rules of the serving simulation, as a program and as a state machine.

A program is a list of rule calls (add a request, decode, finish,
preempt) that any simulation can replay; Hypothesis draws and shrinks it
like any other value, and its ``repr`` is the rule calls a failure prints.
:func:`serve_machine` wraps the same rules in a Hypothesis
``RuleBasedStateMachine`` for stateful tests.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, cast

import attrs
import torch
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from conformance.check.violations import Violation
from conformance.extensions.serve.pool import PoolExhaustedError
from conformance.extensions.serve.sim import Simulation
from conformance.extensions.serve.worker import POOL
from kvref.layout import KVCacheLayout
from kvref.records import KVCacheConfig
from kvref.specs import KVCacheSpec

__all__ = [
    "AddRequest",
    "Decode",
    "Finish",
    "Op",
    "Preempt",
    "ServeProgram",
    "programs",
    "random_program",
    "serve_machine",
]


@attrs.frozen(kw_only=True)
class AddRequest:
    """A request of ``prompt_len`` tokens; its first ``prefix_len`` copy request ``prefix_of``'s."""

    prompt_len: int
    prefix_of: int | None = None
    prefix_len: int = 0
    encoder_len: int = 0

    def apply(self, sim: Simulation) -> list[Violation]:
        """Run the rule on ``sim``."""
        return sim.add_request(self.prompt_len, self.prefix_of, self.prefix_len, self.encoder_len)

    def __repr__(self) -> str:
        args = [f"prompt_len={self.prompt_len}"]
        if self.prefix_of is not None and self.prefix_len:
            args += [f"prefix_of={self.prefix_of}", f"prefix_len={self.prefix_len}"]
        if self.encoder_len:
            args.append(f"encoder_len={self.encoder_len}")
        return f"state.add_request({', '.join(args)})"


class _SimCall:
    """A rule that is one call of the simulation's method ``_method`` with the rule's one field."""

    _method: ClassVar[str]

    def _argument(self) -> tuple[str, int]:
        (field,) = attrs.fields(cast(Any, type(self)))
        return field.name, getattr(self, field.name)

    def apply(self, sim: Simulation) -> list[Violation]:
        """Run the rule on ``sim``."""
        violations: list[Violation] = getattr(sim, self._method)(self._argument()[1])
        return violations

    def __repr__(self) -> str:
        name, value = self._argument()
        return f"state.{self._method}({name}={value})"


@attrs.frozen(kw_only=True, repr=False)
class Decode(_SimCall):
    """Every running request computes ``tokens`` more tokens."""

    _method = "decode"
    tokens: int = 1


@attrs.frozen(kw_only=True, repr=False)
class Finish(_SimCall):
    """The ``which``-th running request finishes."""

    _method = "finish"
    which: int = 0


@attrs.frozen(kw_only=True, repr=False)
class Preempt(_SimCall):
    """The ``which``-th running request is preempted (and recomputed when it fits again)."""

    _method = "preempt"
    which: int = 0


Op = AddRequest | Decode | Finish | Preempt


@attrs.frozen
class ServeProgram:
    """A request stream: the rule calls, in order."""

    ops: tuple[Op, ...]

    def __repr__(self) -> str:
        return "\n".join(["state = ServeMachine()", *(repr(op) for op in self.ops)])

    def run(self, sim: Simulation) -> list[Violation]:
        """Replay the calls on ``sim`` and stop after the first step that breaks an invariant."""
        for op in self.ops:
            try:
                found = op.apply(sim)
            except PoolExhaustedError as exc:
                # The scheduler checks before it allocates; running dry means the
                # pool's accounting and the managers' disagree.
                return [Violation(invariant=POOL, message=f"{op!r}: the pool ran dry: {exc}")]
            if found:
                return found
        return []


def programs(
    *, max_prompt: int, max_ops: int = 8, max_decode: int | None = None, max_encoder: int = 0
) -> st.SearchStrategy[ServeProgram]:
    """Request streams of 1..``max_ops`` rule calls; they shrink to fewer, shorter requests.

    Never a prompt longer than ``max_prompt`` or an encoder input longer than ``max_encoder``.
    """
    decode_max = max_decode or max(1, max_prompt)
    encoder = st.integers(0, max_encoder) if max_encoder else st.just(0)
    add = st.builds(
        AddRequest,
        prompt_len=st.integers(1, max(1, max_prompt)),
        prefix_of=st.none() | st.integers(0, 7),
        prefix_len=st.integers(0, max(1, max_prompt)),
        encoder_len=encoder,
    )
    ops = st.one_of(
        add,
        st.builds(Decode, tokens=st.integers(1, decode_max)),
        st.builds(Finish, which=st.integers(0, 7)),
        st.builds(Preempt, which=st.integers(0, 7)),
    )
    return st.lists(ops, min_size=1, max_size=max_ops).map(lambda xs: ServeProgram(tuple(xs)))


def random_program(steps: int, seed: int, *, max_prompt: int, max_encoder: int = 0) -> ServeProgram:
    """A reproducible request stream of ``steps`` calls without Hypothesis (for benchmarks)."""
    rng = random.Random(seed)
    ops: list[Op] = []
    for i in range(steps):
        roll = rng.random()
        if i == 0 or roll < 0.35:
            shared = rng.random() < 0.5 and i > 0
            ops.append(
                AddRequest(
                    prompt_len=rng.randint(1, max(1, max_prompt)),
                    prefix_of=rng.randrange(8) if shared else None,
                    prefix_len=rng.randint(1, max(1, max_prompt)) if shared else 0,
                    encoder_len=rng.randint(0, max_encoder) if max_encoder else 0,
                )
            )
        elif roll < 0.85:
            ops.append(Decode(tokens=rng.randint(1, max(1, max_prompt // 2))))
        elif roll < 0.95:
            ops.append(Finish(which=rng.randrange(8)))
        else:
            ops.append(Preempt(which=rng.randrange(8)))
    return ServeProgram(tuple(ops))


def serve_machine(
    make: Callable[[], Simulation], *, max_prompt: int, max_encoder: int = 0
) -> type[RuleBasedStateMachine]:
    """A ``RuleBasedStateMachine`` class whose rules drive a fresh ``make()`` simulation.

    Its invariant raises ``AssertionError`` listing the violations (with their
    ids) of the step that broke one; Hypothesis then shrinks and prints the
    minimal sequence of rule calls.
    """
    prompt = st.integers(1, max(1, max_prompt))

    class ServeMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.sim = make()

        @rule(
            prompt_len=prompt,
            prefix_of=st.none() | st.integers(0, 7),
            prefix_len=prompt,
            encoder_len=st.integers(0, max_encoder) if max_encoder else st.just(0),
        )
        def add_request(
            self, prompt_len: int, prefix_of: int | None, prefix_len: int, encoder_len: int
        ) -> None:
            self.sim.add_request(prompt_len, prefix_of, prefix_len, encoder_len)

        @rule(tokens=prompt)
        def decode(self, tokens: int) -> None:
            self.sim.decode(tokens)

        @rule(which=st.integers(0, 7))
        def finish(self, which: int) -> None:
            self.sim.finish(which)

        @rule(which=st.integers(0, 7))
        def preempt(self, which: int) -> None:
            self.sim.preempt(which)

        @invariant()
        def no_violation(self) -> None:
            if self.sim.violations:
                raise AssertionError("\n".join(str(v) for v in self.sim.violations[:5]))

        def teardown(self) -> None:
            for alloc in self.sim.allocations:
                alloc.close()

    return ServeMachine


def simulation_factory(
    configs: Sequence[KVCacheConfig],
    layout: KVCacheLayout | str | None,
    device: str | torch.device,
    **kwargs: Any,
) -> Callable[[], Simulation]:
    """A zero-argument factory of :class:`Simulation` (what :func:`serve_machine` takes)."""
    specs: Sequence[Mapping[str, KVCacheSpec]] | None = kwargs.pop("layer_specs", None)

    def make() -> Simulation:
        return Simulation(configs, layout, device, layer_specs=specs, **kwargs)

    return make
