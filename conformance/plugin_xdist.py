"""The pytest plugin's run split over pytest-xdist workers: one shard each, pooled in a folder.

Under ``pytest -n N`` every worker collects every kit item, and the
controller spreads the items over the workers.  Were each worker to make the
whole run for its items, ``-n 2`` would cost as much as ``-n 0`` on each
worker.  Instead worker ``gwK`` makes shard ``K+1`` of ``N`` of the one run
(:mod:`conformance.run.shard`) and the workers meet twice in a folder the
controller made for the session:

1. after the first deals, each writes what it learned of the focus and
   draws the union of every shard's (``check_builder(focus_exchange=)``), so
   the focus is the one the whole run would learn;
2. at the end, each writes its shard's report and every worker merges all
   of them (:func:`conformance.ci.merge.merge_reports`): each item reports its
   invariant's verdict from the whole run, exactly as without xdist.

A worker that collected items runs its shard in its first item; a worker
the controller gave no item runs it at the end of its session, so no shard
is ever missing.  A worker whose run fails writes why, and the others stop
waiting with that message.  The waits have no deadline: they end when the
other shards end, however busy the machine is.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from conformance.errors import KitError

__all__ = ["ShardExchangeError", "XdistShard", "exchange_folder"]

#: Seconds between two looks at the folder while waiting for the other workers.
_POLL = 0.05


class ShardExchangeError(KitError):
    """Another worker's shard failed, or the workers' shards do not make one run."""

    def __init__(self, message: str) -> None:
        super().__init__("pytest-xdist workers", message)


def exchange_folder() -> str:
    """A new folder for one session's workers to meet in (the controller makes it)."""
    return tempfile.mkdtemp(prefix="kvref-xdist-")


@attrs.frozen
class XdistShard:
    """This worker's place in the session: shard ``index`` of ``count``, meeting in ``folder``."""

    index: int
    count: int
    folder: Path

    @classmethod
    def of(cls, workerinput: Mapping[str, Any] | None) -> XdistShard | None:
        """This xdist worker's shard (``None``: not a worker, or the only one).

        Raises:
            ValueError: the worker's id gives it no share (a replaced worker).
        """
        if workerinput is None or workerinput.get("kvref_exchange") is None:
            return None
        count = int(workerinput.get("workercount", 1))
        worker = str(workerinput.get("workerid", ""))
        if count < 2:
            return None
        if not worker.startswith("gw") or not worker[2:].isdigit() or int(worker[2:]) >= count:
            raise ValueError(
                f"pytest-xdist worker {worker!r} is not one of gw0..gw{count - 1}: the kit's run "
                "is split by worker number, so a replaced worker cannot take a share "
                "(run again, or with -n 0)"
            )
        return cls(int(worker[2:]) + 1, count, Path(workerinput["kvref_exchange"]))

    @property
    def spelled(self) -> str:
        """``"I/N"``, as ``--shard`` takes it."""
        return f"{self.index}/{self.count}"

    def share_focus(self, pins: Mapping[str, frozenset[Any]]) -> dict[str, frozenset[Any]]:
        """Publish this shard's learned pins; the union of every shard's (``FocusExchange``)."""
        from conformance.generate.engine_paths import parse, spell
        from conformance.generate.families import DEFAULT_FAMILIES

        self._write("focus", spell(pins))
        union: dict[str, set[Any]] = {}
        families = ["vendor", *DEFAULT_FAMILIES]
        for path in self._wait("focus"):
            text = path.read_text(encoding="utf-8")
            for stratum, paths in (parse(text, families) if text else {}).items():
                union.setdefault(stratum, set()).update(paths)
        return {stratum: frozenset(paths) for stratum, paths in union.items()}

    def publish(self, report: Any) -> None:
        """Write this shard's report for the others."""
        from conformance.ci.shard_reports import sealed
        from conformance.report.render import report_to_dict

        self._write("report", json.dumps(sealed(report_to_dict(report)), default=str))

    def fail(self, message: str) -> None:
        """Tell the other workers this shard will never report (and why)."""
        self._write("error", message)

    def whole_run(self) -> Any:
        """Every shard's report merged: the report of the whole run."""
        from conformance.ci.merge import MergeError, merge_reports, read_shard_reports

        paths = self._wait("report")
        try:
            return merge_reports(read_shard_reports(paths))
        except MergeError as exc:
            raise ShardExchangeError(f"the workers' shards do not make one run: {exc}") from None

    def _write(self, kind: str, text: str) -> None:
        # Written aside, then renamed: a reader never sees half a file.
        final = self.folder / f"{kind}-{self.index}.txt"
        partial = self.folder / f".{kind}-{self.index}.partial"
        partial.write_text(text, encoding="utf-8")
        os.replace(partial, final)

    def _wait(self, kind: str) -> list[Path]:
        wanted = [self.folder / f"{kind}-{i}.txt" for i in range(1, self.count + 1)]
        while True:
            failed = sorted(self.folder.glob("error-*.txt"))
            if failed:
                raise ShardExchangeError(
                    f"{failed[0].stem.replace('error-', 'shard ')} of the kit's run failed: "
                    f"{failed[0].read_text(encoding='utf-8')}"
                )
            if all(p.is_file() for p in wanted):
                return wanted
            time.sleep(_POLL)
