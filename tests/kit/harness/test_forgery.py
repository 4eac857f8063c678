"""A verdict nobody can forge: each attack of tests/forgers fails, on every front end.

Every forger carries the same simple bug, a device backing one block too
small, which ``KV-PLACE-BACKING-SIZE`` reports, and tries to make the kit say
PASS anyway by running code in the judging process.  With the defaults of
the CLI, ``check_builder`` and the pytest plugin the run must fail on the
planted bug, write its report, and the attacker's code must never have run
in the kit's own process (it may run in the builder's worker: that is where
the builder's code belongs).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from forged_runs import left_running
from subprocesses import TESTS, kit_command, kit_env

from conformance import check_builder

# Whole kit runs: too costly for every CI submission (tox -e slow, pytest -m slow).
pytestmark = pytest.mark.slow

FORGERS = [
    "forgers.attacks:ReduceForges",
    "forgers.attacks:MetaclassForges",
    "forgers.attacks:CoreForges",
    "forgers.on_import:ImportForges",
]
FAST = ["--max-examples", "6", "--seed", "1", "--no-database", "--no-reach"]
SELECT = "KV-PLACE-BACKING-SIZE,KV-PLACE-NUM-BLOCKS,KV-CALL,KV-CORE-MEMORY"


def _kit_pids(marker: Path, kit_pid: int) -> list[str]:
    """The marker lines the attacker's code wrote from the kit's own process."""
    if not marker.exists():
        return []
    return [line for line in marker.read_text().splitlines() if line.endswith(f"pid={kit_pid}")]


def _cli(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    command = kit_command()
    return subprocess.Popen(
        command + args, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


@pytest.mark.parametrize("builder", FORGERS)
def test_cli_defaults_are_not_forged(builder: str, tmp_path: Path) -> None:
    """The CLI's default run: exit 1, the planted bug reported, none of the builder's code here."""
    marker = tmp_path / "forged.txt"
    report = tmp_path / "report.json"
    proc = _cli(
        [builder, *FAST, "--select", SELECT, "--json", str(report)],
        tmp_path,
        kit_env(KVREF_FORGE_MARKER=str(marker)),
    )
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 1, out[-2000:] + err[-2000:]
    data = json.loads(report.read_text())
    assert data["ok"] is False and data["complete"] is True
    assert "KV-PLACE-BACKING-SIZE" in {r["id"] for r in data["results"] if r["status"] == "fail"}
    assert not _kit_pids(marker, proc.pid), marker.read_text()


@pytest.mark.parametrize("builder", FORGERS)
def test_check_builder_defaults_are_not_forged(
    builder: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``check_builder`` given the builder's name isolates it and imports it only in the worker."""
    marker = tmp_path / "forged.txt"
    monkeypatch.setenv("KVREF_FORGE_MARKER", str(marker))
    monkeypatch.syspath_prepend(str(TESTS))
    module = builder.partition(":")[0]
    for name in [m for m in sys.modules if m == "forgers" or m.startswith("forgers.")]:
        sys.modules.pop(name)
    report = check_builder(builder, select=SELECT.split(","), max_examples=6, seed=1)
    assert "KV-PLACE-BACKING-SIZE" in report.failed_ids
    assert not _kit_pids(marker, os.getpid()), marker.read_text()
    assert module not in sys.modules  # the builder's module never came into this process


def test_check_builder_given_the_class_is_not_forged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A class the caller already holds: its metaclass and its kvref_core never run here."""
    sys.path.insert(0, str(TESTS))
    try:
        from forgers.attacks import CoreForges, MetaclassForges, ReduceForges
    finally:
        sys.path.remove(str(TESTS))
    marker = tmp_path / "forged.txt"
    monkeypatch.setenv("KVREF_FORGE_MARKER", str(marker))
    for builder in (ReduceForges, MetaclassForges, CoreForges):
        report = check_builder(builder, select=SELECT.split(","), max_examples=6, seed=1)
        assert "KV-PLACE-BACKING-SIZE" in report.failed_ids, builder
    assert not _kit_pids(marker, os.getpid()), marker.read_text()


def test_plugin_defaults_are_not_forged(
    plugin_attack: Callable[..., tuple[pytest.RunResult, Path]],
) -> None:
    """The plugin isolates by default: the forger's item fails, pytest's process is untouched."""
    result, marker = plugin_attack(
        "--kv-builder", "forgers.on_import:ImportForges", "--kv-max-examples", "6"
    )
    # The import patched every check of the process it ran in: had that been
    # pytest's, the item would pass.  It ran, in the worker.
    result.assert_outcomes(failed=1)
    assert marker.exists() and "import" in marker.read_text()


def test_fake_report_lines_are_marked(tmp_path: Path) -> None:
    """What the builder prints comes after the report, every line marked; never a bare OK."""
    proc = _cli(
        ["forgers.attacks:PrintsFakeReports", *FAST, "--select", SELECT], tmp_path, kit_env()
    )
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 1
    lines = out.splitlines()
    assert "  | 55 pass, 0 fail in 1.0s" in lines
    assert not any(line.startswith("55 pass") for line in lines)
    assert lines[-1].startswith("FAILED:")
    assert "55 pass" not in err


def test_a_forked_child_ends_with_the_run(tmp_path: Path) -> None:
    """A child the builder forks is ended with its worker's process group."""
    pids = tmp_path / "pids.txt"
    proc = _cli(
        ["forgers.attacks:ForksChild", *FAST, "--select", SELECT],
        tmp_path,
        kit_env(KVREF_CHILD_PIDS=str(pids)),
    )
    proc.communicate(timeout=600)
    children = [int(p) for p in pids.read_text().split()]
    assert children
    assert not left_running(children, 30, pause=0.2)


def test_a_worker_that_dies_every_call_is_not_restarted_forever(tmp_path: Path) -> None:
    """Two deaths in a row, then each hook call fails at once: a bounded number of starts."""
    starts = tmp_path / "starts.txt"
    proc = _cli(
        ["forgers.attacks:DiesOnEveryCall", *FAST, "--select", "KV-CALL-RAISES"],
        tmp_path,
        kit_env(KVREF_STARTS=str(starts)),
    )
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 1
    assert "it died on 2 calls in a row" in out
    assert len(starts.read_text().split()) <= 4
