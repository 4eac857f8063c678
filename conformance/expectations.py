"""Expectations manifests where docs/vendors.md imports them: :mod:`conformance.ci.expectations`.

Every name of the package's ``__all__``, which stays the one list of them.
"""

from conformance.ci.expectations import *  # noqa: F403 (the package's __all__ is the list)
from conformance.ci.expectations import __all__  # noqa: F401 (so this module lists them too)
