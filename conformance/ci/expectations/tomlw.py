"""A small TOML writer for expectations manifests: no dependency for what little they hold.

Manifests hold strings, booleans, lists of strings and one ``when`` table per
entry, which is all this writes; :func:`dump_manifest`'s output reads back
with ``tomllib`` to the same data (tests/ci/test_expectations.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["dump_manifest"]

_HEADER = """\
# kvref-conformance expectations manifest (docs/vendors.md#expectations-manifest).
# One [[expected]] table per invariant expected to fail: id, reason, link,
# strict (an XPASS fails the run) and optional [expected.when] conditions
# (device, vllm, family, scenario, upstream). Entries with a TODO reason or
# link were written by --update-expectations: fill them in, or the manifest
# is refused.
"""


def _string(text: str) -> str:
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    raise TypeError(f"a manifest holds no {type(value).__name__}: {value!r}")


def dump_manifest(format_name: str, entries: Sequence[dict[str, Any]]) -> str:
    """The TOML text of a manifest with ``entries`` (dicts of the manifest's fields)."""
    lines = [_HEADER, f"format = {_string(format_name)}"]
    for entry in entries:
        lines += ["", "[[expected]]"]
        lines += [f"{k} = {_value(v)}" for k, v in entry.items() if k != "when"]
        when = entry.get("when")
        if when:
            lines.append("[expected.when]")
            lines += [f"{k} = {_value(v)}" for k, v in when.items()]
    return "\n".join(lines) + "\n"
