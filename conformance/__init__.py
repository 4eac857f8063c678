"""kvref's conformance kit for KV cache config builders.

Run :func:`check_builder` (or the ``kvref-conformance`` CLI, or the pytest
plugin) against any builder to check the invariants of vLLM 0.33.0's builder
contract on Hypothesis-generated models, including a real allocation on a
torch device.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from conformance.invariants import CATALOG, Invariant
    from conformance.runner import InvariantResult, Report, check_builder
    from conformance.violations import Violation

__all__ = ["CATALOG", "Invariant", "InvariantResult", "Report", "Violation", "check_builder"]

_HOMES = {
    "CATALOG": "conformance.invariants",
    "Invariant": "conformance.invariants",
    "InvariantResult": "conformance.runner",
    "Report": "conformance.runner",
    "check_builder": "conformance.runner",
    "Violation": "conformance.violations",
}


def __getattr__(name: str) -> Any:
    # Lazy: the pytest plugin imports this package in every pytest run of the
    # environment, which should not pay for Hypothesis strategies and torch.
    if name in _HOMES:
        import importlib

        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module 'conformance' has no attribute {name!r}")
