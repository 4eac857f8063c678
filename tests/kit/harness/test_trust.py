"""The containment's mechanisms, each measured on this machine (conformance/harness/confine.py).

Every process that runs a builder's or a vendor's code is a contained chain:
it cannot open the judge's memory, what it starts ends with it (a
``setsid()`` + double-fork daemon included), and it never holds the
certification key.  Each test shows the attack works on an uncontained child
first, where the platform allows it, so a pass means the defence held, not
that the attack was impossible anyway.  Whole-kit runs of the same attacks:
tests/kit/harness/test_trust_attacks.py.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from forged_runs import running

from conformance.harness import confine
from conformance.report.trust import summary as _summary

pytestmark = pytest.mark.skipif(
    not hasattr(os, "fork") or not Path("/proc/self/mem").exists(), reason="needs fork and /proc"
)

_FORK = multiprocessing.get_context("fork")


def _held(roles: dict[str, Any]) -> dict[str, Any]:
    return _summary(roles, judge_dumpable=False, key_env=confine.KEY_ENV)


def _write_judge_memory(conn: Any, judge: int, address: int) -> None:
    """An entry of the server: try to overwrite 8 bytes of the judge's memory, say what happened."""
    try:
        with open(f"/proc/{judge}/mem", "r+b", buffering=0) as mem:
            mem.seek(address)
            mem.write(b"FORGED!!")
        outcome = "written"
    except OSError as exc:
        outcome = type(exc).__name__
    conn.send_bytes(outcome.encode())


def _plain(target: Callable[..., None], *args: Any) -> Any:
    """Run ``target(conn, *args)`` in a plain forked child of this process; its message."""
    here, there = _FORK.Pipe()
    process = _FORK.Process(target=target, args=(there, *args), daemon=True)
    process.start()
    there.close()
    try:
        return here.recv_bytes().decode() if here.poll(60) else None
    finally:
        process.join(10)


def _contained(entry: str, *args: Any) -> tuple[dict[str, Any], Any, Any]:
    """Run ``entry(conn, *args)`` in a contained chain: its facts, its message, the sentinel."""
    here, there = _FORK.Pipe()
    process = _FORK.Process(
        target=confine.run_contained, args=(there, os.getpid(), entry, *args), daemon=True
    )
    process.start()
    there.close()
    facts = json.loads(here.recv_bytes()) if here.poll(60) else {}
    try:
        message = here.recv_bytes().decode() if here.poll(60) else None
    except EOFError:
        message = None  # the server ended without a word
    return facts, message, process


def _end(process: Any, facts: dict[str, Any]) -> None:
    confine.end_chain(process.pid, process.is_alive, facts)
    process.join(10)
    if process.is_alive():
        process.kill()
        process.join(10)


@pytest.fixture
def canary() -> Iterator[Any]:
    """Eight bytes of this process's memory that only a write through /proc can change."""
    import ctypes

    buffer = ctypes.create_string_buffer(b"ORIGINAL", 8)
    yield buffer


def test_a_contained_process_cannot_write_the_judges_memory(
    canary: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``/proc/<judge>/mem``: an uncontained child writes it; a contained one is refused."""
    import ctypes

    judge = os.getpid()
    address = ctypes.addressof(canary)
    # As an unprotected judge is (an earlier test may have protected this process).
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE
    monkeypatch.setitem(confine._STATE, "dumpable", True)
    if _plain(_write_judge_memory, judge, address) != "written":
        pytest.skip("this platform refuses even an uncontained child (Yama, no CAP_SYS_PTRACE)")
    assert canary.raw == b"FORGED!!"  # the attack is real here
    canary.raw = b"ORIGINAL"
    assert confine.protect_judge()
    facts, outcome, process = _contained(f"{__name__}:_write_judge_memory", judge, address)
    _end(process, facts)
    assert outcome == "PermissionError"
    assert canary.raw == b"ORIGINAL"
    assert facts["judge_memory"] == "refused"
    if os.geteuid() == 0:
        # Root keeps CAP_SYS_PTRACE unless the chain drops it (or a user namespace has it).
        assert "CAP_SYS_PTRACE" in facts["capabilities_dropped"] or (
            facts["processes"] == confine.USER_PID_NAMESPACE
        )


def _daemonize(conn: Any, path: str) -> None:
    """An entry of the server: leave a setsid() + double-fork daemon; send its host pid."""
    read, write = os.pipe()
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.write(write, os.readlink("/proc/self").encode())
            time.sleep(60)
            Path(path).write_text("survived")
            os._exit(0)
        os._exit(0)
    conn.send_bytes(os.read(read, 32))
    time.sleep(60)


@pytest.mark.parametrize(
    "mechanisms",
    [confine.MECHANISMS, (confine.SUBREAPER,)],
    ids=["strongest", "subreaper-fallback"],
)
def test_what_a_contained_process_starts_ends_with_it(
    mechanisms: tuple[str, ...], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A daemon in its own session, reparented away from the server, ends with the chain."""
    monkeypatch.setattr(confine, "MECHANISMS", mechanisms)
    survived = tmp_path / "survived"
    facts, daemon, process = _contained(f"{__name__}:_daemonize", str(survived))
    assert daemon is not None and running(int(daemon))
    if mechanisms == (confine.SUBREAPER,):
        assert facts["processes"] == confine.SUBREAPER
    else:
        assert facts["processes"] in (confine.PID_NAMESPACE, confine.USER_PID_NAMESPACE), facts
    _end(process, facts)
    deadline = time.monotonic() + 10
    while running(int(daemon)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not running(int(daemon))
    assert not survived.exists()


def test_the_fallback_is_reported_with_a_warning() -> None:
    """Where no PID namespace held, the report says which mechanism did, and warns."""
    facts = {"processes": confine.SUBREAPER, "judge_memory": "refused", "certify_key": "absent"}
    summary = _held({"worker": facts})
    assert summary["processes"] == [confine.SUBREAPER]
    assert any("no PID namespace" in w for w in summary["warnings"])
    assert not _held({"worker": {**facts, "processes": confine.PID_NAMESPACE}})["warnings"]


def _report_key(conn: Any) -> None:
    """An entry of the server: whether the key is in its environment, now or at its start."""
    conn.send_bytes(json.dumps([os.environ.get(confine.KEY_ENV), confine.key_in_memory()]).encode())


def test_the_key_never_reaches_a_contained_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forked from a judge that holds the key, the chain says so; spawned, it holds none."""
    monkeypatch.setenv(confine.KEY_ENV, "a-ci-secret")
    assert confine.key_in_memory()
    facts, message, process = _contained(f"{__name__}:_report_key")
    _end(process, facts)
    # Forked: out of the environment, but a copy of the judge's memory holds it, and says so.
    assert json.loads(message)[0] is None
    assert facts["certify_key"] == "in memory"
    assert any(confine.KEY_ENV in w for w in _held({"worker": facts})["warnings"])
    assert confine.KEY_ENV not in confine.child_environment()


def _spawned_key_report() -> tuple[dict[str, Any], Any]:
    spawn = multiprocessing.get_context("spawn")
    here, there = spawn.Pipe()
    process = spawn.Process(
        target=confine.run_contained,
        args=(there, os.getpid(), f"{__name__}:_report_key"),
        daemon=True,
    )
    with confine.without_key():
        process.start()
    there.close()
    facts = json.loads(here.recv_bytes()) if here.poll(120) else {}
    message = json.loads(here.recv_bytes()) if here.poll(120) else None
    _end(process, facts)
    return facts, message


def test_a_spawned_contained_process_never_held_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(confine.KEY_ENV, "a-ci-secret")
    facts, message = _spawned_key_report()
    assert facts["certify_key"] == "absent"
    assert message == [None, False]
    assert os.environ[confine.KEY_ENV] == "a-ci-secret"  # the judge keeps it


def test_a_contained_process_dies_as_its_server_died() -> None:
    """The sentinel leaves as the server left: the kit reports the builder's own exit."""
    _, _, process = _contained(f"{__name__}:_exits_seven")
    process.join(20)
    assert process.exitcode == 7
    _, _, process = _contained(f"{__name__}:_segfaults")
    process.join(20)
    assert process.exitcode == -signal.SIGSEGV


def _exits_seven(conn: Any) -> None:
    os._exit(7)


def _segfaults(conn: Any) -> None:
    import ctypes
    import faulthandler

    faulthandler.disable()  # pytest's handler would print this process's stacks
    ctypes.string_at(0)
