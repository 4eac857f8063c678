"""kvref's conformance kit for KV cache config builders.

Run :func:`check_builder` (or the ``kvref-conformance`` CLI, or the pytest
plugin) against any builder to check the invariants of vLLM 0.33.0's builder
contract (``docs/contract.md``) on Hypothesis-generated models, including a
real allocation on a torch device.

The kit reads as a pipeline: :mod:`conformance.generate` makes the examples,
:mod:`conformance.run` calls the builder on them, :mod:`conformance.check`
judges what it did, and :mod:`conformance.report` says what was found.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from conformance.check.catalog import Invariant, by_id, catalog
    from conformance.check.violations import Violation
    from conformance.report.model import InvariantResult, Report
    from conformance.run.options import OptionError, RunOptions
    from conformance.run.replay import reproduce
    from conformance.run.runner import check_builder

__all__ = [
    "Invariant",
    "InvariantResult",
    "OptionError",
    "Report",
    "RunOptions",
    "Violation",
    "by_id",
    "catalog",
    "check_builder",
    "reproduce",
]

_HOMES = {
    "Invariant": "conformance.check.catalog",
    "by_id": "conformance.check.catalog",
    "catalog": "conformance.check.catalog",
    "InvariantResult": "conformance.report.model",
    "OptionError": "conformance.run.options",
    "Report": "conformance.report.model",
    "RunOptions": "conformance.run.options",
    "check_builder": "conformance.run.runner",
    "reproduce": "conformance.run.replay",
    "Violation": "conformance.check.violations",
}


def __getattr__(name: str) -> Any:
    # Lazy: the pytest plugin imports this package in every pytest run of the
    # environment, which should not pay for Hypothesis strategies and torch.
    if name in _HOMES:
        import importlib

        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module 'conformance' has no attribute {name!r}")
