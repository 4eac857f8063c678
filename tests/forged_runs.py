"""Running the kit on the attackers of ``tests/forgers`` from another process, and watching it.

Shared by the tests that prove a hostile builder cannot forge a verdict
(``test_forgery``, ``test_trust_attacks``) or outlive its run (``test_trust``).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from subprocesses import TESTS


def running(pid: int) -> bool:
    """Whether process ``pid`` runs; a zombie of an ended process counts as gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def left_running(pids: list[int], wait: float, pause: float = 0.1) -> list[int]:
    """Those of ``pids`` still running after up to ``wait`` seconds (checked every ``pause``)."""
    deadline = time.monotonic() + wait
    left = pids
    while left and time.monotonic() < deadline:
        left = [p for p in pids if running(p)]
        time.sleep(pause)
    return left


def plugin_run(
    pytester: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    marker: Path,
    *options: str,
) -> pytest.RunResult:
    """The pytest plugin on KV-PLACE-BACKING-SIZE at seed 1, in a pytest of its own.

    ``options`` name the builder and the rest (``--kv-builder``, ...); the
    attackers write their notes to ``marker``.
    """
    monkeypatch.setenv("PYTHONPATH", str(TESTS))
    monkeypatch.setenv("KVREF_FORGE_MARKER", str(marker))
    return pytester.runpytest_subprocess(
        "--pyargs",
        "conformance",
        *options,
        "--kv-seed",
        "1",
        "-p",
        "no:cacheprovider",
        "-k",
        "KV-PLACE-BACKING-SIZE",
    )
