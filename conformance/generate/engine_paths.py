"""Engine paths: the settings that decide which planning path an engine takes, and their spelling.

A focus (:mod:`conformance.extensions.focus`) keeps them and redraws everything
else; ``--focus`` and the reproduce lines spell them
(``family=PATH,PATH;family=PATH``, a path ``LAYOUT[/flag...]``).  Kept apart
from the focus itself so that reading the options imports no planning code.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from kvref.axes import KVCacheLayout

if TYPE_CHECKING:
    from kvref.config import PlanningConfig

__all__ = ["EnginePath", "engine_path", "parse", "spell", "spell_path"]

#: ``(layout, hybrid manager off, HiSparse)``.
EnginePath = tuple[str, bool, bool]


def engine_path(config: PlanningConfig) -> EnginePath:
    """The settings that decide which planning path an engine takes.

    These are what a platform's gates read besides the model (which layout
    its kernels run, whether per-kind tables exist, whether a connector owns
    the grouping), not sizes: a focus keeps them and redraws everything else.
    Host residency and a model-declared grouping are left out: scenarios
    set or clear them themselves (the host scenario draws its own host
    layers and drops a declared grouping), so a path learned in one
    scenario would never be drawn in another; a declared grouping comes
    with its family anyway.
    """
    return (
        config.kv_cache_layout.name,
        config.disable_hybrid_kv_cache_manager,
        config.hisparse is not None,
    )


#: The flags of an engine path's spelling, in :data:`EnginePath`'s order after the layout.
_FLAGS = ("hybrid-off", "hisparse")


def spell_path(path: EnginePath) -> str:
    """``BLNHC`` or ``LBNHC/hybrid-off/hisparse``: the layout, then the flags that are set."""
    return "/".join([path[0], *(f for f, on in zip(_FLAGS, path[1:], strict=True) if on)])


def spell(pins: Mapping[str, frozenset[EnginePath]]) -> str:
    """The ``--focus`` value that replays ``pins``: ``family=PATH,PATH;family=PATH``."""
    return ";".join(
        f"{name}={','.join(sorted(spell_path(p) for p in pins[name]))}" for name in sorted(pins)
    )


def parse(value: str, families: Sequence[str]) -> dict[str, frozenset[EnginePath]]:
    """The pins a ``--focus`` value names (see :func:`spell`).

    Raises:
        ValueError: a family, layout or flag the kit does not know, or a
            malformed entry; the message names the part and the value.
    """
    pins: dict[str, frozenset[EnginePath]] = {}
    for entry in filter(None, (e.strip() for e in value.split(";"))):
        name, sep, spelled = entry.partition("=")
        name = name.strip()
        if not sep or not spelled.strip():
            raise ValueError(f"focus entry {entry!r} is not family=PATH[,PATH...]")
        if name not in families:
            raise ValueError(f"focus family {name!r} is not one of {', '.join(families)}")
        paths: set[EnginePath] = set()
        for one in spelled.split(","):
            layout, *flags = one.strip().split("/")
            if layout not in KVCacheLayout.__members__:
                raise ValueError(
                    f"focus path {one.strip()!r} of {name}: layout {layout!r} is not one of "
                    f"{', '.join(KVCacheLayout.__members__)}"
                )
            unknown = sorted(set(flags) - set(_FLAGS))
            if unknown:
                raise ValueError(
                    f"focus path {one.strip()!r} of {name}: flag {unknown[0]!r} is not one of "
                    f"{', '.join(_FLAGS)}"
                )
            paths.add((layout, "hybrid-off" in flags, "hisparse" in flags))
        pins[name] = frozenset(paths)
    return pins
