"""The ``device`` scenario: placement's calls, whose configs the device checks allocate.

Its invariants materialise the builder's configs on the run's torch device
(tags written through every layer's view, kernels' reads, allocation sizes);
the calls are placement's own.
"""

from __future__ import annotations

import attrs

from conformance.scenarios.placement import PLACEMENT

__all__ = ["DEVICE"]

#: Placement's scenario (its examples, its calls) under the device checks' name.
DEVICE = attrs.evolve(PLACEMENT, name="device")
