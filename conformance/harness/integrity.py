"""The kit's process runs no code that changed after a builder's code started running.

An isolated builder never runs in the kit's process, but its worker runs as
the same user, and can write files: the kit's own modules, vLLM's or the
standard library's, or their cached bytecode.  A module the kit's process
imports for the first time later in the run (a lazy import: the reach
meter's coverage.py, a vLLM module the Core flow reaches on one path, a
report writer) would then run the builder's code in the kit's process, which
could forge any verdict.

:func:`guarded` puts a finder in front of ``sys.meta_path`` for the run: every
module imported while it is there is looked up as usual, and refused when its
source or bytecode file changed at or after the moment the builder's worker
was first started (:func:`mark`), with a :class:`ChangedCodeError` (a
:class:`~conformance.errors.KitError`: the run ends with exit 2, it is no
verdict on anyone).  Bytecode written during the run over an unchanged
source (the worker or the twin compiled it first) is not read: the
module is compiled from its source.  The check reads the files' change time (``st_ctime``),
which a process cannot set back.  A file changed before the run is not
seen: a builder that changed the installation in an earlier run is out of
reach of any check made inside the next one (docs/contract.md#isolation).
"""

from __future__ import annotations

import contextlib
import importlib.abc
import os
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from importlib.machinery import ModuleSpec, SourceFileLoader
from types import CodeType, ModuleType

from conformance.errors import KitError

__all__ = ["ChangedCodeError", "guarded", "keep_guarding", "mark", "unguard"]


class ChangedCodeError(KitError):
    """A module the kit's process was about to import changed while a builder ran."""

    hint = (
        "a file the kit runs changed during the run: the builder's worker may have "
        "written it; reinstall kvref, vLLM and Python's packages before trusting "
        "another run in this environment"
    )

    def __init__(self, module: str, path: str) -> None:
        super().__init__(
            "code integrity",
            f"{module} ({path}) changed after the builder's code started running; the kit "
            "imports no code changed while a builder runs (its worker can write files), "
            "so this run gives no verdict",
        )


def mark() -> int:
    """A moment, as the file system stamps changes, after every change made before the call.

    Files stamp changes (``st_ctime_ns``) with the kernel's coarse clock, which
    moves in ticks of a few milliseconds: a file changed just before the call
    and one changed just after may share a stamp.  So the mark is the first
    stamp past the one a new file gets now: every earlier change is stamped
    before it, every later one at it or after.  It waits at most one tick
    (:data:`_MOST_WAIT` where the clock is coarser still: then a change made
    within that wait before the call counts as made after it).
    """
    first = _stamp()
    deadline = time.monotonic() + _MOST_WAIT
    while True:
        now = _stamp()
        if now > first or time.monotonic() > deadline:
            return now
        time.sleep(0.0005)


#: Seconds :func:`mark` waits at most for the file system's clock to move.
_MOST_WAIT = 0.05


def _stamp() -> int:
    fd, path = tempfile.mkstemp(prefix="kvref-mark-")
    try:
        return os.fstat(fd).st_ctime_ns
    finally:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(path)


def _changed_at_or_after(path: str | None, since: int) -> bool:
    if not path:
        return False
    try:
        return os.stat(path).st_ctime_ns >= since
    except OSError:  # no such file (bytecode never written, a built-in): nothing to run
        return False


class _Unchanged(importlib.abc.MetaPathFinder):
    """Finds a module as the finders behind it do, and refuses it when its files changed."""

    def __init__(self, since: int) -> None:
        self.since = since

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        spec: ModuleSpec | None = None
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            if finder is self or isinstance(finder, _Unchanged) or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                break
        if spec is None or not spec.has_location:
            return spec
        if _changed_at_or_after(spec.origin, self.since):
            raise ChangedCodeError(fullname, str(spec.origin))
        if isinstance(spec.loader, SourceFileLoader) and _changed_at_or_after(
            spec.cached, self.since
        ):
            # Bytecode written during the run: the kit's worker or twin may have
            # compiled the unchanged source first.  Compile it again here instead.
            # (Another loader, pytest's assertion rewriter say, does not read
            # this file; a file that is only bytecode is its origin, checked above.)
            spec.loader = _FromSource(fullname, str(spec.origin))
            spec.cached = None
        return spec


class _FromSource(SourceFileLoader):
    """Loads a module from its source, never from cached bytecode."""

    def get_code(self, fullname: str) -> CodeType:
        path = self.get_filename(fullname)
        return self.source_to_code(self.get_data(path), path)


_LOCK = threading.Lock()
_KEEP = {"on": False}


def keep_guarding() -> None:
    """Leave the finder in place after the run: the process is the kit's own (the CLI).

    The CLI writes its reports after the run, and may import their writers then.
    """
    _KEEP["on"] = True


@contextlib.contextmanager
def guarded(since: int | None) -> Iterator[None]:
    """Refuse, while inside, imports of files changed at or after ``since`` (``None``: no check).

    Nested or repeated uses keep one finder, with the earliest moment.
    """
    if since is None:
        yield
        return
    with _LOCK:
        present = next((f for f in sys.meta_path if isinstance(f, _Unchanged)), None)
        if present is not None:
            present.since = min(present.since, since)
            finder, added = present, False
        else:
            finder, added = _Unchanged(since), True
            sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        if added and not _KEEP["on"]:
            with _LOCK, contextlib.suppress(ValueError):
                sys.meta_path.remove(finder)


def unguard() -> None:
    """Remove the check from this process: the builder's worker, forked while a run was guarded.

    The builder's own code may write modules and import them (kernels it
    compiles); what runs in its worker is its own business.
    """
    with _LOCK:
        sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _Unchanged)]
