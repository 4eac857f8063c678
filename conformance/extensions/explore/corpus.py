"""The exploration corpus: the examples exploration kept, saved under the example database.

Exploration (:mod:`conformance.extensions.explore`) keeps the examples that reached
new lines of the builder; the next run of the same builder judges them
first.  They are saved as data (``kvref-example/1`` problems, never code),
one file per builder under ``explore/`` in the database.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from conformance.errors import OptionError
from conformance.report.documents import DocumentError, read_json
from conformance.report.records import RecordError, example_data
from conformance.scenarios.examples import Example

__all__ = ["CORPUS_LIMIT", "CORPUS_MAX_BYTES", "Corpus", "CorpusError", "check_corpus"]

#: Examples a corpus file keeps (the newest first).
CORPUS_LIMIT = 200


class CorpusError(OptionError):
    """A saved corpus cannot be used: names the file, the entry and the field (a usage error)."""


#: The largest corpus file read: :data:`CORPUS_LIMIT` entries take about 1.3 MB, and
#: each entry of the largest families under 22 kB (a run reads the whole file first).
CORPUS_MAX_BYTES = 8 << 20
#: The longest description of a corpus entry (the kit's run to a few hundred characters).
_DESCRIPTION_LIMIT = 4096
#: Corpus files read in this process, by path: (size, mtime) and their examples.
_READ: dict[Path, tuple[tuple[int, int], list[Example]]] = {}


class Corpus:
    """The kept examples of one builder, saved as data (never as code) under the database.

    A corpus is a file anyone who can write the database can plant, and each
    entry costs a judged example at the start of every run: it is read as
    data the run must validate (a list of at most :data:`CORPUS_LIMIT`
    entries, each a description and a ``kvref-example/1`` problem), and one
    that is not is a usage error naming it (:class:`CorpusError`), found
    when the run's options are checked, before any example runs.
    """

    def __init__(self, database: str | None, builder: str) -> None:
        digest = hashlib.sha256(builder.encode()).hexdigest()[:16]
        self.path = None if database is None else Path(database) / "explore" / f"{digest}.json"

    def load(self) -> list[Example]:
        """The saved examples (none when there is no file).

        Raises:
            CorpusError: the file is not a corpus this kit wrote (too large,
                not JSON, more than :data:`CORPUS_LIMIT` entries, an entry
                that is no example); the message says how to start afresh.
        """
        if self.path is None or not (self.path.exists() or self.path.is_symlink()):
            return []
        try:
            stat = self.path.stat()
        except OSError as exc:
            raise self._error(f"cannot be read: {exc.strerror or exc}") from None
        stamp = (stat.st_size, stat.st_mtime_ns)
        known = _READ.get(self.path)
        if known is not None and known[0] == stamp:
            return list(known[1])
        examples = self._read()
        _READ[self.path] = (stamp, examples)
        return list(examples)

    def _read(self) -> list[Example]:
        assert self.path is not None
        try:
            entries = read_json(self.path, str(self.path), max_bytes=CORPUS_MAX_BYTES)
        except DocumentError as exc:
            raise self._error(str(exc).removeprefix(str(self.path)).strip()) from None
        if not isinstance(entries, list) or len(entries) > CORPUS_LIMIT:
            shown = f"{len(entries)} entries" if isinstance(entries, list) else repr(entries)[:80]
            raise self._error(f"holds {shown}, not a list of at most {CORPUS_LIMIT} entries")
        examples = []
        for index, entry in enumerate(entries):
            description = entry.get("description") if isinstance(entry, dict) else None
            if not isinstance(entry, dict) or set(entry) != {"description", "data"}:
                raise self._error(f"entry {index} is not an object of description and data")
            if not isinstance(description, str) or len(description) > _DESCRIPTION_LIMIT:
                raise self._error(
                    f"entry {index}: description {description!r:.80} is not a short string"
                )
            try:
                example = Example.from_data(entry["data"], description)
            except RecordError as exc:
                raise self._error(f"entry {index}: {exc}") from None
            problem = _too_large(example) or _outside_the_generator(example)
            if problem:
                raise self._error(f"entry {index}: {problem}")
            examples.append(example)
        return examples

    def _error(self, problem: str) -> CorpusError:
        return CorpusError(
            f"database={str(self.path)!r}: the exploration corpus {problem}: delete the file "
            "(exploration then starts afresh) or run without the database"
        )

    def save(self, examples: Sequence[Example]) -> None:
        """Keep ``examples`` and the file's (newest first, at most :data:`CORPUS_LIMIT`)."""
        if self.path is None:
            return
        entries: list[dict[str, Any]] = []
        seen: set[str] = set()
        try:
            kept = self.load()
        except CorpusError:
            # Changed since the run checked it (a builder process can write the
            # database): the run's own examples replace it.
            kept = []
        for ex in [*examples, *kept]:
            data = example_data(ex)
            key = json.dumps(data, sort_keys=True)
            if data is None or key in seen:
                continue
            seen.add(key)
            entries.append({"description": ex.description, "data": data})
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(entries[:CORPUS_LIMIT]), encoding="utf-8")


def check_corpus(run_options: Any) -> None:
    """Refuse the builder's saved corpus before the run starts (a usage error).

    A sharded run replays no corpus (its examples would be judged by every
    shard), and a builder given as an object has none a later run finds.

    Raises:
        CorpusError: the builder's exploration corpus cannot be used.
    """
    shard = run_options.shard_of()
    if run_options.builder is not None and not (shard is not None and shard.count > 1):
        # Read and kept: the run's own reading of the unchanged file costs nothing more.
        Corpus(run_options.database, run_options.builder).load()


#: Bounds of a corpus entry, far above what the kit draws or mutates (explore.py):
#: a planted entry must not make one example cost the run more than any drawn one.
_MAX_WORKERS = 64
_MAX_LAYERS = 4096
_MAX_BLOCKS = 1 << 32


def _too_large(example: Example) -> str | None:
    layers = sum(len(w) for w in example.workers)
    if len(example.workers) > _MAX_WORKERS:
        return f"{len(example.workers)} workers, over the {_MAX_WORKERS} a corpus entry may have"
    if layers > _MAX_LAYERS:
        return f"{layers} layers, over the {_MAX_LAYERS} a corpus entry may have"
    if example.num_blocks > _MAX_BLOCKS:
        return f"num_blocks {example.num_blocks}, over the {_MAX_BLOCKS} a corpus entry may have"
    return None


def _outside_the_generator(example: Example) -> str | None:
    """Why no run of the kit would judge ``example`` (``None``: one could).

    Exploration keeps only problems the reference can plan and whose Core
    flow it answers (a typed refusal is an answer), as every generated
    example is: judged on any other, a legal builder would be blamed for it.
    """
    from conformance.scenarios.examples import reference_accepts
    from kvref.builder import ReferenceKVCacheConfigBuilder
    from kvref.errors import KVRefError
    from kvref.planning import plan_kv_cache

    if not reference_accepts(example.config, example.workers):
        return "the reference cannot plan it, so no run of the kit made it"
    try:
        plan_kv_cache(
            ReferenceKVCacheConfigBuilder(),
            example.config,
            example.workers,
            example.available_memory,
        )
    except KVRefError:
        pass
    except Exception as exc:
        return f"the reference's Core flow fails on it ({type(exc).__name__}), so no run made it"
    return None
