"""Reading and validating an expectations manifest (TOML, format ``kvref-expectations/1``).

Every problem is found before any example runs and named by its entry, field
and value (:class:`ExpectationsError`; the CLI exits 2).  Ids the catalog does
not know are not errors but warnings (an older or newer kit may know them).
"""

from __future__ import annotations

import re
import sys
import unicodedata
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib  # type: ignore[import-not-found, unused-ignore]

__all__ = [
    "CONDITIONS",
    "FORMAT",
    "PLACEHOLDER_LINK",
    "PLACEHOLDER_REASON",
    "Entry",
    "ExpectationsError",
    "Manifest",
    "load_manifest",
    "resolve_manifest",
    "shipped_manifests",
    "xfail_manifest",
]

#: The manifest layout this kit reads and writes.
FORMAT = "kvref-expectations/1"
#: What ``--update-expectations`` writes where only the vendor can say why.
PLACEHOLDER_REASON = "TODO: say why this invariant fails (written by --update-expectations)"
PLACEHOLDER_LINK = "TODO: link to the issue that tracks it"
#: The conditions an entry's ``when`` table may set: each a string or a list of them.
CONDITIONS = ("device", "vllm", "family", "scenario", "upstream")
_FIELDS = ("id", "reason", "link", "strict", "when", "now_passes")
#: The longest reason or link an entry may have.
TEXT_LIMIT = 2000
_ID = re.compile(r"^KV-[A-Z0-9]+(-[A-Z0-9]+)*$")


class ExpectationsError(ValueError):
    """An expectations manifest cannot be used: names the file, entry, field and value."""


@attrs.frozen(kw_only=True)
class Entry:
    """One expected failure.

    Attributes:
        id: the invariant id.
        reason: why it fails.
        link: where that is tracked (an issue, a document).
        strict: an XPASS (it held) fails the run.
        when: conditions, each a tuple of accepted values: ``device`` (the
            run's device or its type: ``cuda`` matches ``cuda:1``), ``vllm``
            (the installed vLLM version; ``0.33.*`` matches a prefix),
            ``family`` (the model family of the minimal counterexample),
            ``scenario`` (the failing scenario), ``upstream`` (the vLLM
            defect key the report names for the failure, run/upstream.py).
        now_passes: set by ``--update-expectations`` when the invariant held.
        source: the manifest the entry came from.
        index: its position there (1-based), for messages.
    """

    id: str
    reason: str
    link: str
    strict: bool = False
    when: Mapping[str, tuple[str, ...]] = attrs.field(factory=dict)
    now_passes: str | None = None
    source: str = ""
    index: int = 0

    def name(self) -> str:
        """How messages name the entry."""
        return f"{self.source}: entry {self.index} ({self.id})"


@attrs.frozen(kw_only=True)
class Manifest:
    """A validated manifest: its entries and where it came from."""

    source: str
    entries: tuple[Entry, ...]

    def unknown_ids(self, known: Iterable[str]) -> list[str]:
        """Warnings for the entries whose id is no invariant of the catalog."""
        ids = set(known)
        return [
            f"{e.name()}: id {e.id!r} matches no invariant; the entry is ignored"
            for e in self.entries
            if e.id not in ids
        ]


def shipped_manifests() -> dict[str, Path]:
    """The manifests the kit ships, by name (``vllm-0.34.0``: vLLM 0.34.0's documented defects)."""
    here = Path(__file__).parent
    return {p.stem: p for p in sorted(here.glob("*.toml"))}


def resolve_manifest(spec: str) -> Path:
    """The path of a manifest given by shipped name or by path.

    Raises:
        ExpectationsError: it is neither a shipped name nor an existing file.
    """
    shipped = shipped_manifests()
    if spec in shipped:
        return shipped[spec]
    path = Path(spec)
    if not path.is_file():
        raise ExpectationsError(
            f"expectations {spec!r} is neither a file nor a manifest the kit ships "
            f"({', '.join(shipped) or 'none'})"
        )
    return path


def load_manifest(
    path: Path, *, allow_placeholders: bool = False, source: str | None = None
) -> Manifest:
    """Read and validate the manifest at ``path`` (``source``: how messages name it).

    ``allow_placeholders`` accepts the placeholder reason and link that
    ``--update-expectations`` writes (when it refreshes the file); a run that
    uses the manifest refuses them, so no failure is waved through unexplained.

    Raises:
        ExpectationsError: unreadable, not TOML, or an entry is invalid.
    """
    source = source or str(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ExpectationsError(f"cannot read expectations {source!r}: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ExpectationsError(f"expectations {source!r} is not valid TOML: {exc}") from None
    unknown = sorted(set(data) - {"format", "expected"})
    if unknown:
        raise ExpectationsError(
            f"{source}: unknown top-level field {unknown[0]!r} (known: format, expected)"
        )
    if data.get("format") != FORMAT:
        raise ExpectationsError(f"{source}: format {data.get('format')!r} must be {FORMAT!r}")
    raw = data.get("expected", [])
    if not isinstance(raw, list):
        raise ExpectationsError(f"{source}: expected must be an array of tables ([[expected]])")
    entries = tuple(
        _entry(item, source, index, allow_placeholders) for index, item in enumerate(raw, 1)
    )
    return Manifest(source=source, entries=entries)


def _entry(item: Any, source: str, index: int, allow_placeholders: bool) -> Entry:
    where = f"{source}: entry {index}"
    if not isinstance(item, dict):
        raise ExpectationsError(f"{where}: must be a table, not {item!r}")
    ident = item.get("id")
    if isinstance(ident, str):
        where += f" ({ident})"
    unknown = sorted(set(item) - set(_FIELDS))
    if unknown:
        raise ExpectationsError(
            f"{where}: unknown field {unknown[0]!r} (known: {', '.join(_FIELDS)})"
        )
    for field in ("id", "reason", "link"):
        value = item.get(field)
        if not isinstance(value, str) or not value.strip():
            raise ExpectationsError(f"{where}: {field} {value!r} must be a non-empty string")
    for field in ("reason", "link"):
        problem = _text_problem(item[field])
        if problem:
            raise ExpectationsError(f"{where}: {field} {item[field]!r:.80} {problem}")
    if not _ID.match(item["id"]):
        raise ExpectationsError(f"{where}: id {item['id']!r} is not an invariant id (KV-...)")
    for field in ("reason", "link"):
        if not allow_placeholders and item[field].strip().startswith("TODO"):
            raise ExpectationsError(
                f"{where}: {field} {item[field]!r} is a placeholder (what "
                "--update-expectations writes); fill it in before the manifest is used"
            )
    strict = item.get("strict", False)
    if not isinstance(strict, bool):
        raise ExpectationsError(f"{where}: strict {strict!r} must be true or false")
    now_passes = item.get("now_passes")
    if now_passes is not None and not isinstance(now_passes, str):
        raise ExpectationsError(f"{where}: now_passes {now_passes!r} must be a string")
    return Entry(
        id=item["id"],
        reason=item["reason"],
        link=item["link"],
        strict=strict,
        when=_when(item.get("when", {}), where),
        now_passes=now_passes,
        source=source,
        index=index,
    )


def _text_problem(text: str) -> str | None:
    """Why ``text`` cannot be shown in a report as the manifest wrote it (``None``: it can).

    A reason and a link reach every report format and the terminal: a control
    character (an escape sequence) would act there, and a huge one would bury
    the report.
    """
    if len(text) > TEXT_LIMIT:
        return f"is longer than {TEXT_LIMIT} characters"
    if any(unicodedata.category(c) == "Cc" and c not in "\n\t" for c in text):
        return "holds a control character: write the text plainly"
    return None


def _when(when: Any, where: str) -> dict[str, tuple[str, ...]]:
    from conformance.scenarios.registry import names
    from conformance.upstream import DEFECTS

    if not isinstance(when, dict):
        raise ExpectationsError(f"{where}: when {when!r} must be a table of conditions")
    allowed = {"scenario": set(names()), "upstream": {d.key for d in DEFECTS}}
    out: dict[str, tuple[str, ...]] = {}
    for key, value in when.items():
        if key not in CONDITIONS:
            raise ExpectationsError(
                f"{where}: unknown condition when.{key} (known: {', '.join(CONDITIONS)})"
            )
        values = [value] if isinstance(value, str) else value
        if (
            not isinstance(values, list)
            or not values
            or not all(isinstance(v, str) and v.strip() for v in values)
        ):
            raise ExpectationsError(
                f"{where}: when.{key} {value!r} must be a non-empty string or list of them"
            )
        for v in values:
            if key in allowed and v not in allowed[key]:
                raise ExpectationsError(
                    f"{where}: when.{key} {v!r} is not one of {sorted(allowed[key])}"
                )
        out[key] = tuple(values)
    return out


def xfail_manifest(path: Path) -> Manifest:
    """The manifest an xfail file makes (``--xfail-file``): each of its ids expected to fail.

    An xfail file lists invariant ids, one a line (``#`` starts a comment);
    each becomes an entry with no condition, as an expectations manifest
    would hold it, so one mechanism applies both.

    Raises:
        ExpectationsError: the file cannot be read as text.
    """
    from conformance.ci.expectations.xfail import XfailFileError, read_xfail_file

    try:
        ids = read_xfail_file(path)
    except XfailFileError as exc:
        raise ExpectationsError(str(exc)) from None
    source = str(path)
    reason = f"listed in the xfail file {source}"
    entries = tuple(
        Entry(id=id_, reason=reason, link=source, source=source, index=index)
        for index, id_ in enumerate(ids, 1)
    )
    return Manifest(source=source, entries=entries)
