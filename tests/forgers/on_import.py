"""A builder whose module patches the kit when it is imported."""

from __future__ import annotations

from forgers import ShortBacking, forge

forge("import")


class ImportForges(ShortBacking):
    """The short backing, from a module that patched whatever process imported it."""
