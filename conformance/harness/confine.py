"""Containment of every process that runs a builder's or a vendor's code (docs/trust.md).

The judge is the kit's own process: it draws the examples, judges, and
writes the verdict, the exit status and every report file.  The builder's
code, and a vendor's models module, run only in processes started through
this module (the worker, the twin of ``KV-GROUP-HASH-STABLE``, the models
child, the child that lists a certified builder's files).  Each such process
is run as a chain of three:

- the *sentinel* (the process the judge started; kit code only): it moves
  its children into a new PID namespace, drops the capabilities that reach
  another process's memory, checks that it can no longer open the judge's
  memory, tells the judge what held, and waits;
- the namespace's *init* (PID 1 there; kit code only): it reaps, and when
  the server ends, or the sentinel dies, it ends, and the kernel ends every
  process left in the namespace with it: a ``setsid()`` + double-fork daemon
  of the builder included;
- the *server*, where :func:`enter` returns: it runs the builder's code.

The judge itself is made non-dumpable (:func:`protect_judge`): a process of
the same user can then read or write its memory (``/proc/<pid>/mem``,
``ptrace``) only with ``CAP_SYS_PTRACE``, which the chain drops (as root) or
never had (another user, or root inside a user namespace).

Where the platform allows no PID namespace (neither ``CAP_SYS_ADMIN`` nor
unprivileged user namespaces), the init is a child subreaper instead: it ends
what its subtree left when the server ends or the sentinel dies, which holds
against double-fork daemons but not against a builder that kills the
sentinel and the init first; the facts say so and the report warns.

Nothing here imports the kit's heavy modules: ``python -m
conformance.harness.confine module[:function] args...`` enters containment
before anything else is imported (a user namespace needs a process with one
thread), then runs ``function(args)`` (default ``main``) in the server.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import json
import os
import select
import signal
import struct
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import IO, Any

__all__ = [
    "KEY_ENV",
    "builder_code_since",
    "announce_frame",
    "child_environment",
    "end_chain",
    "enter",
    "forget_builder_code_since",
    "held_key",
    "key_in_memory",
    "protect_judge",
    "read_frame",
    "record",
    "run_contained",
    "judge_dumpable",
    "seen",
    "split_frame",
    "without_key",
]

#: The environment variable of the certification key (conformance.ci.certify); never in a
#: process that runs a builder's or vendor's code.
KEY_ENV = "KVREF_CERTIFY_KEY"

_PR_SET_PDEATHSIG = 1
_PR_GET_DUMPABLE = 3
_PR_SET_DUMPABLE = 4
_PR_CAPBSET_DROP = 24
_PR_SET_CHILD_SUBREAPER = 36
_PR_SET_NO_NEW_PRIVS = 38
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWPID = 0x20000000
_CAP_VERSION_3 = 0x20080522

#: Capabilities that reach another process's memory or the kernel's: a builder
#: process keeps none (the judge's memory is guarded by CAP_SYS_PTRACE alone
#: once it is not dumpable; the others reach it through the kernel).
DROPPED_CAPABILITIES = {
    "CAP_SYS_MODULE": 16,
    "CAP_SYS_RAWIO": 17,
    "CAP_SYS_PTRACE": 19,
    "CAP_SYS_ADMIN": 21,
    "CAP_PERFMON": 38,
    "CAP_BPF": 39,
}

#: How the builder's processes end with the run, strongest first.
PID_NAMESPACE = "pid-namespace"
USER_PID_NAMESPACE = "user-and-pid-namespace"
SUBREAPER = "subreaper"
PROCESS_GROUP = "process-group"

#: Seconds between the sentinel's looks at whether the judge is still there.
_WATCH_SECONDS = 0.5

_FRAME = struct.Struct("!Q")

_STATE: dict[str, Any] = {"dumpable": None}

#: Test hook: the mechanisms the sentinel may use, strongest first (a test
#: forces the fallback by leaving the namespaces out).
MECHANISMS = (PID_NAMESPACE, USER_PID_NAMESPACE, SUBREAPER)


def _libc() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def _prctl(option: int, arg: int = 0) -> bool:
    libc = _libc()
    return libc is not None and libc.prctl(option, arg, 0, 0, 0) == 0


# -- the certification key -----------------------------------------------------------

_ENV_LOCK = threading.Lock()


def held_key() -> bytes | None:
    """The certification key this process was given (``None``: none)."""
    value = os.environ.get(KEY_ENV)
    return value.encode() if value else None


def key_in_memory() -> bool:
    """Whether this process holds a key in its memory: a process forked from it would too.

    The environment now, or the one it started with (``/proc/self/environ``:
    removing a variable later leaves its bytes there).
    """
    if os.environ.get(KEY_ENV):
        return True
    try:
        with open("/proc/self/environ", "rb") as f:
            return f"{KEY_ENV}=".encode() in f.read()
    except OSError:
        return False


@contextlib.contextmanager
def without_key() -> Iterator[None]:
    """Leave the key out of this process's environment while a fresh interpreter starts.

    ``multiprocessing``'s spawn hands the child this process's environment.
    """
    with _ENV_LOCK:
        value = os.environ.pop(KEY_ENV, None)
        try:
            yield
        finally:
            if value is not None:
                os.environ[KEY_ENV] = value


def child_environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment for a child that runs a builder's code: without the key."""
    env = {k: v for k, v in os.environ.items() if k != KEY_ENV}
    env.update(extra or {})
    return env


# -- the judge -----------------------------------------------------------------------


def protect_judge() -> bool:
    """Make this process (the judge) non-dumpable; returns whether it is.

    Called before every process that runs a builder's code starts.  A
    non-dumpable process's memory can be opened by another process of the
    same user only with ``CAP_SYS_PTRACE``, which builder processes do not
    keep (:func:`enter`).  The process stays so: debuggers of the same user
    (gdb, py-spy) need root for it; ``kill -USR1`` still prints its stacks.
    The first call after :func:`forget_builder_code_since` also marks the
    moment (:func:`builder_code_since`): files changed after it may hold a
    builder's writes.
    """
    if _STATE.get("since") is None:
        from conformance.harness import integrity

        _STATE["since"] = integrity.mark()
    if _STATE["dumpable"] is None or _STATE["dumpable"]:
        _prctl(_PR_SET_DUMPABLE, 0)
        libc = _libc()
        _STATE["dumpable"] = libc is None or libc.prctl(_PR_GET_DUMPABLE, 0, 0, 0, 0) != 0
    return not _STATE["dumpable"]


def builder_code_since() -> int | None:
    """When the first builder process since the last run started (``integrity.mark``)."""
    since: int | None = _STATE.get("since")
    return since


def forget_builder_code_since() -> None:
    """A run ended: the next one counts from its own first builder process."""
    _STATE["since"] = None


# -- the chain -----------------------------------------------------------------------


def _unshare(flags: int) -> bool:
    libc = _libc()
    return libc is not None and libc.unshare(flags) == 0


def _map_user(uid: int, gid: int) -> None:
    """Map this user to itself in the new user namespace (so files stay its own)."""
    for name, text in (
        ("setgroups", "deny"),
        ("uid_map", f"{uid} {uid} 1"),
        ("gid_map", f"{gid} {gid} 1"),
    ):
        with open(f"/proc/self/{name}", "w", encoding="ascii") as f:
            f.write(text)


def _new_namespace() -> str:
    """Put this process's future children in a new PID namespace; the mechanism that held."""
    if PID_NAMESPACE in MECHANISMS and _unshare(_CLONE_NEWPID):
        return PID_NAMESPACE
    uid, gid = os.getuid(), os.getgid()
    if USER_PID_NAMESPACE in MECHANISMS and _unshare(_CLONE_NEWUSER | _CLONE_NEWPID):
        _map_user(uid, gid)
        return USER_PID_NAMESPACE
    return SUBREAPER if _libc() is not None else PROCESS_GROUP


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def _drop_capabilities() -> list[str]:
    """Drop :data:`DROPPED_CAPABILITIES` for good (bounding set too); the ones it held."""
    libc = _libc()
    if libc is None:
        return []
    header, data = _CapHeader(_CAP_VERSION_3, 0), (_CapData * 2)()
    if libc.capget(ctypes.byref(header), data) != 0:
        return []
    held = []
    for name, cap in DROPPED_CAPABILITIES.items():
        word, bit = divmod(cap, 32)
        if data[word].effective & (1 << bit) or data[word].permitted & (1 << bit):
            held.append(name)
        # Out of the bounding set first: no exec can give it back.
        libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)
        for part in ("effective", "permitted", "inheritable"):
            setattr(data[word], part, getattr(data[word], part) & ~(1 << bit))
    libc.capset(ctypes.byref(header), data)
    libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    _prctl(_PR_SET_NO_NEW_PRIVS, 1)
    return held


def _judge_memory(judge: int) -> str:
    """Whether this process can open the judge's memory for writing: ``refused`` or ``writable``."""
    try:
        fd = os.open(f"/proc/{judge}/mem", os.O_RDWR)
    except PermissionError:
        return "refused"
    except OSError:
        return "unknown"
    os.close(fd)
    return "writable"


def _close(fds: tuple[int, ...]) -> None:
    """Close ``fds`` here: the chain's copies of the server's channel to the judge.

    Only those: the judge learns that the server ended from that channel's
    end of file, so no other process may hold it; every other descriptor
    stays (``multiprocessing`` learns that the sentinel ended from one).
    """
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def enter(
    judge: int | None = None,
    announce: Callable[[dict[str, Any]], None] | None = None,
    channel: tuple[int, ...] = (),
) -> dict[str, Any]:
    """Contain this process's builder code; returns, in the server, what held.

    Call it in a fresh child of the judge (``judge``: its pid, default the
    parent), before any builder or vendor code is imported there.  The
    process becomes the sentinel and never returns; the server it starts
    returns.  ``announce`` gets the facts (what held, and the init's pid) in
    the sentinel, before the server runs: the judge reads them first.
    ``channel``: the descriptors of the server's channel to the judge, which
    only the server keeps open.
    """
    judge = os.getppid() if judge is None else judge
    # Out of the environment the server and its children see; a copy left in this
    # process's memory (forked from a judge that holds the key) is reported.
    key = "in memory" if key_in_memory() else "absent"
    os.environ.pop(KEY_ENV, None)
    with contextlib.suppress(OSError):
        # Its own group: the judge also ends the group (belt and braces).
        os.setpgid(0, 0)
    facts: dict[str, Any]
    if not hasattr(os, "fork") or _libc() is None:
        facts = {
            "processes": PROCESS_GROUP,
            "judge_memory": "unknown",
            "capabilities_dropped": [],
            "certify_key": key,
        }
        if announce is not None:
            announce(facts)
        return facts
    mechanism = _new_namespace()
    facts = {
        "processes": mechanism,
        "capabilities_dropped": _drop_capabilities(),
        "judge_memory": _judge_memory(judge),
        "certify_key": key,
    }
    status_r, status_w = os.pipe()
    # The server waits for this before it returns: the facts reach the judge first.
    go_r, go_w = os.pipe()
    init = os.fork()
    if init == 0:
        os.close(status_r)
        os.close(go_w)
        _init(status_w, go_r, mechanism, channel)  # returns only in the server
        return facts
    os.close(status_w)
    os.close(go_r)
    facts["init"] = init
    if announce is not None:
        announce(facts)
    os.write(go_w, b"g")
    os.close(go_w)
    _close(channel)
    _sentinel(init, status_r, judge, mechanism)
    raise AssertionError("unreachable")  # pragma: no cover - _sentinel never returns


def _init(status_w: int, go_r: int, mechanism: str, channel: tuple[int, ...]) -> None:
    """The namespace's init: start the server, reap, end with it (returns in the server)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if mechanism in (PID_NAMESPACE, USER_PID_NAMESPACE):
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    else:
        # No namespace to end the rest: orphans come here, and go with it.
        _prctl(_PR_SET_CHILD_SUBREAPER, 1)
        signal.signal(signal.SIGTERM, lambda *_: _end_subtree_and_exit(0))
        _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    server = os.fork()
    if server == 0:
        os.close(status_w)
        with contextlib.suppress(ValueError):
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.read(go_r, 1) != b"g":
            os._exit(1)  # the sentinel died before the judge heard from it
        os.close(go_r)
        return
    gc.disable()  # no finaliser of the judge's objects runs here on a closed descriptor
    _close((go_r, *channel))
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            os._exit(0)
        if pid == server:
            with contextlib.suppress(OSError):
                os.write(status_w, str(status).encode())
            if mechanism not in (PID_NAMESPACE, USER_PID_NAMESPACE):
                _end_subtree_and_exit(0)
            os._exit(0)  # the kernel ends every process left in the namespace


def _processes() -> Iterator[tuple[int, int]]:
    """Every process and its parent, as ``(pid, ppid)``, from /proc.

    Its stat files are world-readable; a process that ends while /proc is
    read is left out.
    """
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        yield int(entry), int(stat.rpartition(b")")[2].split()[1])


def _descendants(root: int) -> list[int]:
    """Every process below ``root`` (read from /proc)."""
    children: dict[int, list[int]] = {}
    for pid, ppid in _processes():
        children.setdefault(ppid, []).append(pid)
    found, stack = [], [root]
    while stack:
        for child in children.get(stack.pop(), ()):
            found.append(child)
            stack.append(child)
    return found


def _end_subtree_and_exit(code: int) -> None:
    for _ in range(5):
        left = _descendants(os.getpid())
        if not left:
            break
        for pid in left:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
    os._exit(code)


def _sentinel(init: int, status_r: int, judge: int, mechanism: str) -> None:
    """Wait for the init; end it when the judge goes; leave as the server left."""
    gc.disable()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    status: int | None = None
    while True:
        ready, _, _ = select.select([status_r], [], [], _WATCH_SECONDS)
        if ready:
            data = os.read(status_r, 64)
            status = int(data) if data.strip().isdigit() else None
            break
        if os.getppid() != judge:
            # The judge is gone: nothing of the builder outlives it.
            os.kill(init, signal.SIGTERM if mechanism == SUBREAPER else signal.SIGKILL)
            break
    _, init_status = os.waitpid(init, 0)
    _mirror(init_status if status is None else status)


def _mirror(status: int) -> None:
    """End this process as the server ended (an exit code, or the signal that killed it)."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        with contextlib.suppress(ValueError, OSError):
            import faulthandler

            faulthandler.disable()
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


def end_chain(pid: int, alive: Callable[[], bool], facts: Mapping[str, Any]) -> None:
    """From the judge: end the chain whose sentinel is ``pid`` (still ``alive``).

    The init's children (the server, and what reparented to it) are killed:
    the init reaps them (so their CPU time is counted where the judge's is)
    and leaves once the server has, ending what is left in its namespace;
    then the sentinel leaves.  The caller waits for the sentinel.
    """
    init = facts.get("init")
    if type(init) is not int or init <= 1 or not alive():
        return
    if facts.get("processes") == SUBREAPER:
        with contextlib.suppress(OSError):
            os.kill(init, signal.SIGTERM)  # its handler ends its whole subtree
        return
    children = _children(init)
    for child in children or [init]:
        with contextlib.suppress(OSError):
            os.kill(child, signal.SIGKILL)


def _children(parent: int) -> list[int]:
    """The processes whose parent is ``parent`` (from /proc)."""
    return [pid for pid, ppid in _processes() if ppid == parent]


# -- what held ---------------------------------------------------------------------

_SEEN: dict[str, dict[str, Any]] = {}


def record(role: str, facts: Mapping[str, Any]) -> None:
    """Remember what the chain of ``role`` (worker, twin, models, files) said held."""
    _SEEN[role] = {k: v for k, v in facts.items() if k != "init"}


def seen() -> dict[str, dict[str, Any]]:
    """What each role's latest chain in this process said held (``{}``: none started)."""
    return {role: dict(facts) for role, facts in _SEEN.items()}


def judge_dumpable() -> bool:
    """Whether the judge is still dumpable (:func:`protect_judge` failed, or never ran)."""
    return bool(_STATE["dumpable"])


# -- the protocols -----------------------------------------------------------------


def run_contained(conn: Any, judge: int, entry: str, *args: Any) -> None:
    """A ``multiprocessing`` target: :func:`enter`, then ``entry(conn, *args)`` in the server.

    The facts are the first message on ``conn`` (JSON); ``entry`` is
    ``module:function``, imported in the server only.
    """
    enter(judge, lambda facts: conn.send_bytes(json.dumps(facts).encode()), (conn.fileno(),))
    _call(entry, conn, *args)


def _call(entry: str, *args: Any) -> Any:
    import importlib

    module, _, function = entry.partition(":")
    return getattr(importlib.import_module(module), function or "main")(*args)


def announce_frame(stream: IO[bytes], value: Any) -> None:
    """Write ``value`` as one length-prefixed JSON frame."""
    data = json.dumps(value).encode()
    stream.write(_FRAME.pack(len(data)) + data)
    stream.flush()


def read_frame(stream: IO[bytes], limit: int = 1 << 26) -> Any:
    """Read one :func:`announce_frame` frame (JSON data; ``ValueError`` when it is not)."""
    head = stream.read(_FRAME.size)
    if len(head) != _FRAME.size:
        raise EOFError("the other side closed the pipe")
    (size,) = _FRAME.unpack(head)
    if size > limit:
        raise ValueError(f"a frame of {size} bytes (at most {limit})")
    data = stream.read(size)
    if len(data) != size:
        raise EOFError("the other side closed the pipe")
    return json.loads(data)


def split_frame(data: bytes) -> tuple[Any, bytes]:
    """The first frame of ``data`` (``None`` when there is none) and the bytes after it."""
    if len(data) < _FRAME.size:
        return None, data
    (size,) = _FRAME.unpack(data[: _FRAME.size])
    end = _FRAME.size + size
    try:
        return json.loads(data[_FRAME.size : end]), data[end:]
    except ValueError:
        return None, data


def main(argv: list[str] | None = None) -> None:
    """``python -m conformance.harness.confine module[:function] args...``.

    The facts go to stdout as the first frame; then ``function(args)`` runs
    in the server (default ``main``), and the server ends with it.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    out = sys.stdout.buffer
    enter(None, lambda facts: announce_frame(out, facts))
    _call(args[0], args[1:])
    sys.stdout.flush()
    sys.exit(0)


if __name__ == "__main__":
    main()
