"""The serving simulation: a block pool and request stream over a builder's configs.

The static invariants judge one config's byte layout; this scenario serves
requests over it (prefix sharing, windows that free blocks, Mamba states,
preemption) and checks that no request ever reads another's bytes.  Entry
point: :func:`conformance.extensions.serve.checks.run_serving`.
"""

from __future__ import annotations

from conformance.extensions.serve.checks import (
    ISOLATION,
    POOL,
    SERVE_INVARIANTS,
    run_serving,
    serve_bounds,
)
from conformance.extensions.serve.machine import (
    ServeProgram,
    programs,
    random_program,
    serve_machine,
)
from conformance.extensions.serve.sim import Simulation

__all__ = [
    "ISOLATION",
    "POOL",
    "SERVE_INVARIANTS",
    "ServeProgram",
    "Simulation",
    "programs",
    "random_program",
    "run_serving",
    "serve_bounds",
    "serve_machine",
]
