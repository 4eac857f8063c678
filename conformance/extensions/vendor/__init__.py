"""Vendor models: the shapes a vendor's builder exists for, mixed into a run's generation.

A run draws from the kit's built-in model families; given ``--models``
(``check_builder(models=)``), it draws from the vendor's models too (or
from them alone, ``--models-only``), as its ``vendor`` stratum.  The
extension's one hook, :attr:`~conformance.extensions.base.Extension.models`,
loads them before the builder's worker starts:

- :mod:`.models`: the forms a models spec takes, the variants drawn around
  each fixed model, and the ``kvref-models/1`` JSON reader;
- :mod:`.deployment`: what a model is served with besides its layers
  (speculative config, HiSparse, declared grouping, layout), from Python
  or JSON;
- :mod:`.data`: a model as ``kvref-models/1`` data, how models cross from
  the child below to the judge;
- :mod:`.child`: the contained child that evaluates a ``module:attr`` spec,
  so the vendor's code never runs in the judging process (docs/trust.md).

A run without models never imports them.
"""

from __future__ import annotations

from typing import Any

from conformance.extensions.base import Extension

__all__ = ["VENDOR"]


def _models(spec: object) -> Any:
    """The run's strategy of the vendor's models, read in a contained child.

    Raises:
        OptionError: the spec, or a model or spec it names, is unusable.
    """
    from conformance.errors import OptionError
    from conformance.extensions.vendor.child import load_models
    from conformance.extensions.vendor.models import VendorModelError

    try:
        return load_models(spec)
    except VendorModelError as exc:
        raise OptionError(str(exc)) from None


def _sit_out(_run_options: Any, _options: Any) -> None:
    # Its models are read before the run starts (``models``), not in its phases.
    return None


VENDOR = Extension(name="vendor", start=_sit_out, models=_models)
