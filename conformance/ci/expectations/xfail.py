"""Read an xfail file (``--xfail-file``): invariant ids, one a line, ``#`` starts a comment.

:func:`conformance.ci.expectations.manifest.xfail_manifest` makes the
manifest such a file stands for (each id expected to fail).
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["XFAIL_FILE_MAX_BYTES", "XfailFileError", "read_xfail_file"]


class XfailFileError(ValueError):
    """An xfail file cannot be read as text."""


#: The largest xfail file the kit reads (one invariant id a line).
XFAIL_FILE_MAX_BYTES = 1 << 20


def read_xfail_file(path: Path) -> list[str]:
    """Invariant ids of an xfail file: one per line, ``#`` starts a comment.

    Raises:
        XfailFileError: the file cannot be read or is not UTF-8 text.
    """
    try:
        with path.open("rb") as stream:
            # One id a line: a file past this is not an xfail file (a log, /dev/zero).
            raw = stream.read(XFAIL_FILE_MAX_BYTES + 1)
        if len(raw) > XFAIL_FILE_MAX_BYTES:
            raise XfailFileError(
                f"xfail file {str(path)!r} is over the {XFAIL_FILE_MAX_BYTES} bytes the kit reads"
            )
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise XfailFileError(f"cannot read xfail file {str(path)!r}: {exc}") from None
    if "\x00" in text:
        # Valid UTF-8 can still be a binary file; its "ids" would only produce noise.
        raise XfailFileError(f"xfail file {str(path)!r} is binary (it contains NUL bytes)")
    ids = []
    for line in text.splitlines():
        entry = line.split("#", 1)[0].strip()
        if entry:
            ids.append(entry.upper())
    return ids
