"""The threat model of docs/trust.md, attacked on every front end.

Each attacker (tests/forgers/escapes.py, tests/forgers/models.py) carries the
planted bug, a device backing one block too small, and tries to turn the
run green by crossing the process boundary: writing the judge's memory,
leaving a daemon that forges the report after the judge exits, leaving
processes behind, stealing the certification key, or running a models
module in the judge.  The run must still fail on ``KV-PLACE-BACKING-SIZE``,
its report must stay as written, and nothing the builder started may be
left.  Each attack forges a pass on a kit without these defences (the
commit before the containment work, on this machine as root: exit 0 for the memory
and models attacks, a report rewritten to ``ok: true`` by the daemon, 20
processes left by ``ForksMany``, the key in the worker's environment).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from forged_runs import left_running
from subprocesses import TESTS, kit_command, kit_env, run_captured

from conformance import check_builder
from conformance.ci import certify
from conformance.cli import main

# Whole kit runs: too costly for every CI submission (tox -e slow, pytest -m slow).
pytestmark = pytest.mark.slow

FAST = ["--max-examples", "4", "--seed", "1", "--no-database", "--no-reach"]
SELECT = "KV-PLACE-BACKING-SIZE,KV-PLACE-NUM-BLOCKS,KV-CALL"
KEY = "kvref-test-key-8c1f"


def _attack(
    tmp_path: Path, builder: str, *args: str, select: str = SELECT, **env: str
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """The CLI on the attacker ``builder`` with ``env`` set: it fails on the bug; its report.

    The report is ``tmp_path / "report.json"``; ``args`` are more of the CLI's options.
    """
    report = tmp_path / "report.json"
    argv = [builder, *FAST, "--select", select, "--json", str(report), *args]
    proc = run_captured(kit_command() + argv, cwd=tmp_path, env=kit_env(**env), timeout=600)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc, _failed_on_the_bug(report)


def _left_alive(pids_file: Path, wait: float = 10.0) -> list[int]:
    pids = [int(p) for p in pids_file.read_text().split()] if pids_file.exists() else []
    return left_running(pids, wait)


def _failed_on_the_bug(report: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(report.read_text())
    assert data["ok"] is False and data["complete"] is True
    assert "KV-PLACE-BACKING-SIZE" in {r["id"] for r in data["results"] if r["status"] == "fail"}
    assert data["containment"]["judge_memory"] == ["refused"], data["containment"]
    return data


def _marks(marker: Path) -> list[str]:
    """The attackers' notes, without their pids."""
    lines = marker.read_text().splitlines() if marker.exists() else []
    return [line.rpartition(" pid=")[0] for line in lines]


def test_cli_memory_write_is_refused(tmp_path: Path) -> None:
    """The worker finds the judge among its ancestors; every write to its memory is refused."""
    marker = tmp_path / "marker.txt"
    _attack(tmp_path, "forgers.escapes:WritesKitMemory", KVREF_FORGE_MARKER=str(marker))
    marks = _marks(marker)
    assert marks and all(m.startswith("memory: refused") for m in marks), marks


def test_cli_daemon_cannot_forge_after_the_judge_exits(tmp_path: Path) -> None:
    """The setsid() + double-fork daemon ends with the run: the report stays as written."""
    marker, report, pids = tmp_path / "marker.txt", tmp_path / "report.json", tmp_path / "pids"
    proc, _ = _attack(
        tmp_path,
        "forgers.escapes:Daemonizes",
        KVREF_FORGE_MARKER=str(marker),
        KVREF_CHILD_PIDS=str(pids),
        KVREF_REPORT_PATH=str(report),
    )
    written = report.read_text()
    assert pids.read_text().split(), "the daemon did not start"
    assert not _left_alive(pids)
    time.sleep(1.0)  # what the daemon would have done right after the judge exited
    assert report.read_text() == written
    _failed_on_the_bug(report)
    assert proc.stdout.rstrip().splitlines()[-1].startswith("FAILED:")
    assert "daemon: forged after the judge exited" not in _marks(marker)


def test_cli_leaves_no_process_of_the_builder(tmp_path: Path) -> None:
    """24 children, a third of them in sessions of their own: none outlives the run."""
    pids = tmp_path / "pids"
    _attack(tmp_path, "forgers.escapes:ForksMany", KVREF_CHILD_PIDS=str(pids))
    assert len(pids.read_text().split()) == 24
    assert not _left_alive(pids)


def test_cli_key_reaches_no_builder_process(tmp_path: Path) -> None:
    """With the key set, the worker, the twin and the models child find it nowhere."""
    from forgers.escapes import masked

    marker = tmp_path / "marker.txt"
    _, data = _attack(
        tmp_path,
        "forgers.escapes:StealsKey",
        *("--models", "forgers.models:MODELS"),
        select=f"{SELECT},KV-GROUP-HASH-STABLE",
        KVREF_FORGE_MARKER=str(marker),
        KVREF_CERTIFY_KEY=KEY,
        KVREF_KEY_TO_FIND=masked(KEY),
    )
    marks = _marks(marker)
    assert "key in models: nowhere" in marks
    assert marks.count("key in builder: nowhere") == 2, marks  # the worker and the twin
    assert not [m for m in marks if m.startswith("key in") and not m.endswith("nowhere")]
    assert {f["certify_key"] for f in data["containment"]["roles"].values()} == {"absent"}


def test_cli_models_module_runs_outside_the_judge(tmp_path: Path) -> None:
    """A models module that patches the catalog at import: the run still fails on the bug."""
    marker = tmp_path / "marker.txt"
    _, data = _attack(
        tmp_path,
        "forgers:ShortBacking",
        *("--models", "forgers.models:MODELS", "--models-only"),
        KVREF_FORGE_MARKER=str(marker),
    )
    assert _marks(marker) == ["models import"]
    assert "models" in data["containment"]["roles"]


def test_check_builder_attacks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """This test's process is the judge: its memory, its children, its catalog stay its own."""
    marker, pids = tmp_path / "marker.txt", tmp_path / "pids"
    monkeypatch.setenv("KVREF_FORGE_MARKER", str(marker))
    monkeypatch.setenv("KVREF_CHILD_PIDS", str(pids))
    monkeypatch.syspath_prepend(str(TESTS))
    for name in [m for m in sys.modules if m == "forgers" or m.startswith("forgers.")]:
        monkeypatch.delitem(sys.modules, name)  # an earlier test may have imported them
    fast: dict[str, Any] = {"select": SELECT.split(","), "max_examples": 4, "seed": 1}
    for builder in ("forgers.escapes:WritesKitMemory", "forgers.escapes:ForksMany"):
        report = check_builder(builder, reach=False, **fast)
        assert "KV-PLACE-BACKING-SIZE" in report.failed_ids, builder
    report = check_builder(
        "forgers:ShortBacking", reach=False, models="forgers.models:MODELS", **fast
    )
    assert "KV-PLACE-BACKING-SIZE" in report.failed_ids
    marks = _marks(marker)
    assert "models import" in marks and any(m.startswith("memory: refused") for m in marks)
    assert not [m for m in marks if m.startswith("memory: written")]
    assert not _left_alive(pids)
    assert "forgers.models" not in sys.modules and "forgers.escapes" not in sys.modules


def test_certify_with_a_forging_models_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A certified run given a models module that forges at import: certified NOT conformant."""
    marker = tmp_path / "marker.txt"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(certify, "EXAMPLES", 1)
    monkeypatch.setenv("KVREF_FORGE_MARKER", str(marker))
    monkeypatch.setenv("PYTHONPATH", kit_env()["PYTHONPATH"])  # the files child imports it too
    monkeypatch.syspath_prepend(str(TESTS))
    code = main(
        [
            *("forgers:ShortBacking", "--certify", "--json", "report.json"),
            *("--models", "forgers.models:MODELS", "--no-reach", "--replays", "0"),
        ]
    )
    assert code == 1
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["ok"] is False and data["certificate"]["conformant"] is False
    assert "KV-PLACE-BACKING-SIZE" in {r["id"] for r in data["results"] if r["status"] == "fail"}
    assert _marks(marker) == ["models import"]
    assert not any(line.endswith(f"pid={os.getpid()}") for line in marker.read_text().splitlines())


def test_plugin_models_module_runs_outside_the_judge(
    plugin_attack: Callable[..., tuple[pytest.RunResult, Path]],
) -> None:
    """The plugin: had the module's patch reached pytest's process, the item would pass."""
    result, marker = plugin_attack(
        *("--kv-builder", "forgers:ShortBacking", "--kv-models", "forgers.models:MODELS"),
        *("--kv-max-examples", "4"),
    )
    result.assert_outcomes(failed=1)
    assert "models import" in _marks(marker)
