"""A builder class whose code names some of :mod:`callee_pkg.shared`."""

from __future__ import annotations

from callee_pkg import shared
from callee_pkg.shared import REGISTRY, OnlyAnnotated


class Builder:
    """The root of the walk."""

    def hook(self, kind: OnlyAnnotated) -> int:
        return shared.Plan().used() + REGISTRY["r"]()
