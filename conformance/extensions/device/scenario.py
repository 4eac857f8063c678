"""The ``device`` scenario: placement's calls, whose configs the device checks allocate.

Its invariants materialise the builder's configs on the run's torch device
(tags written through every layer's view, kernels' reads, allocation sizes);
the calls are placement's own.
"""

from __future__ import annotations

from conformance.scenarios.base import Scenario
from conformance.scenarios.examples import PLAIN
from conformance.scenarios.placement import observe_example

__all__ = ["DEVICE"]

DEVICE = Scenario(
    name="device",
    examples=PLAIN.examples_for,
    observe=observe_example,
    focused=True,
    explored=True,
)
