"""The run's extensions, in the order their hooks are called (phase order).

Adding an extension is one folder under ``conformance/extensions/`` that
declares an :class:`~conformance.extensions.base.Extension`, listed here;
the core of a run reads only this list.
"""

from __future__ import annotations

from conformance.extensions.base import Extension
from conformance.extensions.explore import EXPLORE
from conformance.extensions.flakes import FLAKES
from conformance.extensions.focus import FOCUS
from conformance.extensions.reach import REACH
from conformance.extensions.shard import SHARD
from conformance.extensions.vendor import VENDOR
from conformance.extensions.waste import WASTE

__all__ = ["EXTENSIONS", "extensions"]

#: Every extension, in the order a run calls their hooks and the text report
#: shows their sections (waste before reach: the order of the report's sections).
EXTENSIONS: tuple[Extension, ...] = (VENDOR, SHARD, FOCUS, WASTE, REACH, FLAKES, EXPLORE)


def extensions() -> tuple[Extension, ...]:
    """Every extension, in phase order."""
    return EXTENSIONS
