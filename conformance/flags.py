"""Each option's flags, declared once, and generated for every front end.

An option record (:class:`~conformance.run.options.RunOptions`,
:class:`~conformance.ci.processors.CiOptions`, an extension's own) is an
attrs class whose every field carries a :class:`Flag` in its metadata
(``None``: a field only Python sets).  The kit's records take them from a
table keyed by field name (:func:`declared`, attrs' field transformer, which
asserts at import that every field has its entry and every entry its field),
kept in a module that imports neither attrs nor the kit: ``--help`` stays
light.  From the tables, or from a record's fields, :func:`arguments` makes
the command line's flags (``--max-examples``) and the pytest plugin's
(``--kv-max-examples``), and :func:`read_values` reads what was given back
into field values.  A front end orders the flags it knows (``--help`` keeps
its order); a flag it does not place, an extension's, comes after them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

__all__ = [
    "CLI",
    "FLAG",
    "PLUGIN",
    "Flag",
    "Front",
    "Off",
    "arguments",
    "declared",
    "flag",
    "place",
    "read_values",
    "tables_of",
    "unplaced",
]

#: The metadata key of a field's :class:`Flag`.
FLAG = "kvref.flag"

#: The flags of a record by field name (``None``: the field has none).
Table = Mapping[str, "Flag | None"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Off:
    """The flag that turns an option off (``--no-reach``), beside or instead of its own.

    Attributes:
        help: its help.
        value: the option's value when it is given.
        contradicts: options that cannot be given with it (a usage error naming both).
        cli: argparse's keywords on the command line (``None``: not there).
        kv: pytest's keywords in the plugin (``None``: not there).
    """

    help: str
    value: Any = False
    contradicts: tuple[str, ...] = ()
    cli: Mapping[str, Any] | None = dataclasses.field(default_factory=dict)
    kv: Mapping[str, Any] | None = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Flag:
    """How one option is given on the command line and in the pytest plugin.

    ``help``, ``type``, ``metavar`` and ``action`` are both front ends';
    ``cli`` and ``kv`` add or replace argparse's and pytest's keywords on one
    of them (``names``: the flag's spellings; a value ``None`` drops the
    keyword), or are ``None`` where that front end has no such flag.  A flag
    not given reads as ``None``: the record's default.

    Attributes:
        help: the flag's help.
        type: turns the given text into the value.
        metavar: how the help names the value.
        action: argparse's action (``store_true``, ``append``...).
        cli: the command line's keywords (``None``: no such flag there).
        kv: the plugin's keywords (``None``: no such flag there).
        off: the flag that turns the option off, if any.
        group: the command line's help section for a front end that does not place it.
    """

    help: str
    type: Callable[[str], Any] | None = None
    metavar: str | None = None
    action: Any = None
    cli: Mapping[str, Any] | None = dataclasses.field(default_factory=dict)
    kv: Mapping[str, Any] | None = dataclasses.field(default_factory=dict)
    off: Off | None = None
    group: str = "extensions"


def flag(help: str, **keywords: Any) -> Flag:
    """A :class:`Flag` (``keywords``: its other fields)."""
    return Flag(help=help, **keywords)


def declared(table: Table) -> Callable[[type, list[Any]], list[Any]]:
    """Attrs' ``field_transformer`` that puts each field's flag from ``table`` in its metadata.

    Asserts, when the record is defined (at import), that every field has its
    entry in ``table`` and every entry its field.
    """

    def transform(cls: type, fields: list[Any]) -> list[Any]:
        names = [f.name for f in fields]
        missing = [n for n in names if n not in table]
        assert not missing, f"{cls.__name__} fields without a flag declared: {missing}"
        extra = [n for n in table if n not in names]
        assert not extra, f"flags declared for no field of {cls.__name__}: {extra}"
        return [f.evolve(metadata={**f.metadata, FLAG: table[f.name]}) for f in fields]

    return transform


def tables_of(sources: Iterable[type | Table]) -> list[Table]:
    """Flag tables, each as given or a record's (its fields' metadata: an extension's record)."""
    tables: list[Table] = []
    for source in sources:
        if isinstance(source, type):
            import attrs

            tables.append({f.name: f.metadata[FLAG] for f in attrs.fields(source)})
        else:
            tables.append(source)
    return tables


@dataclasses.dataclass(frozen=True)
class Front:
    """A front end's spelling of the flags: ``--`` (the CLI) or ``--kv-`` (the plugin)."""

    prefix: str
    #: Which keywords of a :class:`Flag` or :class:`Off` are this front end's (``cli``, ``kv``).
    side: str

    def spell(self, name: str) -> str:
        """The flag of option ``name`` (``max_examples`` -> ``--max-examples``)."""
        return self.prefix + name.replace("_", "-")

    def dest(self, name: str) -> str:
        """Where the parsed flag of option ``name`` is stored."""
        return self.spell(name)[2:].replace("-", "_")


CLI = Front("--", "cli")
PLUGIN = Front("--kv-", "kv")


def _flags(sources: Iterable[type | Table]) -> Iterable[tuple[str, Flag]]:
    for table in tables_of(sources):
        for name, declared in table.items():
            if declared is not None:
                yield name, declared


def arguments(
    records: Sequence[type | Table], front: Front
) -> dict[str, tuple[tuple[str, ...], dict[str, Any]]]:
    """Every flag of ``records`` on ``front``, in field order.

    Keyed by its name (the option's; ``no_<option>`` for an off flag), each
    is its spellings and the keywords of ``add_argument`` / ``addoption``.
    """
    out: dict[str, tuple[tuple[str, ...], dict[str, Any]]] = {}
    for name, declared in _flags(records):
        own = getattr(declared, front.side)
        if own is not None:
            base = {
                "help": declared.help,
                "type": declared.type,
                "metavar": declared.metavar,
                "action": declared.action,
            }
            out[name] = _spelled(front, name, {**base, **own})
        off = declared.off
        if off is not None and getattr(off, front.side) is not None:
            keywords = {"action": "store_true", "help": off.help, **getattr(off, front.side)}
            out[f"no_{name}"] = _spelled(front, f"no_{name}", keywords)
    return out


def _spelled(
    front: Front, name: str, keywords: dict[str, Any]
) -> tuple[tuple[str, ...], dict[str, Any]]:
    names = tuple(keywords.pop("names", None) or (front.spell(name),))
    return names, {k: v for k, v in keywords.items() if v is not None}


def place(
    flags: Mapping[str, tuple[tuple[str, ...], dict[str, Any]]],
    names: Iterable[str],
    add: Callable[..., object],
) -> None:
    """``add(*spellings, **keywords)`` of each flag in ``names``, in that order."""
    for name in names:
        spellings, keywords = flags[name]
        add(*spellings, **keywords)


def unplaced(
    flags: Mapping[str, tuple[tuple[str, ...], dict[str, Any]]], placed: Iterable[str]
) -> list[str]:
    """The flags a front end's order does not name (an extension's), in field order."""
    known = set(placed)
    return [name for name in flags if name not in known]


def _given(value: object) -> bool:
    return value not in (None, False, "", [], ())


def read_values(
    records: Sequence[type | Table], front: Front, get: Callable[[str], Any]
) -> dict[str, Any]:
    """The field values of ``records`` given on ``front`` (``get``: a parsed flag by its dest).

    A flag not given, or a ``store_true`` flag left off, reads as ``None`` (the
    record's default); an off flag gives its value.

    Raises:
        OptionError: an off flag given with an option it contradicts.
    """
    from conformance.errors import OptionError

    values: dict[str, Any] = {}
    for name, declared in _flags(records):
        off = declared.off
        if (
            off is not None
            and getattr(off, front.side) is not None
            and get(front.dest(f"no_{name}"))
        ):
            if any(_given(get(front.dest(c))) for c in off.contradicts):
                raise OptionError(
                    f"{front.spell(f'no_{name}')} contradicts "
                    + "/".join(front.spell(c) for c in off.contradicts)
                )
            values[name] = off.value
            continue
        own = getattr(declared, front.side)
        if own is not None:
            value = get(front.dest(name))
            switch = own.get("action", declared.action) == "store_true"
            values[name] = None if value is False and switch else value
    return values
