"""Run an untrusted builder in a worker process (``--isolate``).

In-process, the guard (:mod:`conformance.harness.guard`) contains exceptions and
hangs, but not a hook that ends the process (``os._exit``, a segfault, the
kernel's OOM killer) nor one that patches the kit's own modules to forge a
pass.  :func:`isolated` returns a proxy builder class whose instances live in
a long-lived worker process: each hook call sends its pickled arguments
there, the worker runs the real hook and sends back the answer, the exception
it raised, and how it changed its arguments (so the kit's purity checks still
see in-place mutations).  A worker that dies is reported as a call failure of
the builder (:class:`WorkerDiedError`, judged by ``KV-CALL-RAISES`` or
``KV-CALL-CONSTRUCT``) and replaced by a fresh one on the next call.

What runs inside the worker (loading, constructing, running hooks, the
argument snapshot, reach, the memory limit) is :mod:`conformance.harness.worker_side`;
this module is the kit's side: starting, asking, decoding, ending.

The worker is forked where the platform can fork (cheap, and it inherits the
builder as the caller passed it) and spawned otherwise, or while this
process holds the certification key (the builder is then imported by name,
or unpickled, inside containment).  Either way it is a contained chain
(:mod:`conformance.harness.confine`): its own PID namespace, no capability
over this process, no key; what held is the worker's first message.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import multiprocessing
import os
import pickle
import signal
import threading
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from conformance.errors import KitError
from conformance.harness import confine, integrity, native_input_changes, wire
from conformance.harness.builder_identity import DescribedBuilder
from conformance.harness.changes import IsolationError, apply_changes
from conformance.harness.vllm_import_guess import imports_vllm
from conformance.harness.worker_side import encode_reply
from kvref.builder import KVCacheConfigBuilder
from kvref.config import PlanningConfig
from kvref.interop.vllm_convert import VLLMUnavailableError, vllm_modules
from kvref.records import KVCacheConfig, KVCacheGroupSpec
from kvref.specs import KVCacheSpec

__all__ = ["IsolatedBuilder", "IsolationError", "Resolved", "WorkerDiedError", "isolated"]


class WorkerDiedError(RuntimeError):
    """The builder's worker process died (exit, signal) while it ran a hook."""


class BuilderRaisedError(Exception):
    """Stands for an exception of the builder that cannot be sent back as itself."""


def _signal_name(code: int) -> str:
    with contextlib.suppress(ValueError):
        return f" ({signal.Signals(-code).name})" if code < 0 else ""
    return ""


# -- the worker process ------------------------------------------------------------

#: Seconds an idle worker may take to report the lines it executed.
_REACH_SECONDS = 30.0

#: Seconds a new worker may take to import and describe the builder (vLLM takes 10-20 s).
_START_SECONDS = 180.0


#: Bytes of the builder's own output (stdout and stderr) a report keeps, the last ones.
OUTPUT_LIMIT = 64 * 1024

#: Consecutive calls on which the worker died before the kit stops restarting it.
MAX_DEATHS_IN_A_ROW = 2


def _default_start_method() -> str:
    """``fork`` where the platform has it, else ``spawn``."""
    return "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"


def _import_vllm_here() -> None:
    """Import vLLM in this process before a worker is forked from it (see vllm_import_guess.py)."""
    # Without vLLM the worker says so when it imports the builder.
    with contextlib.suppress(VLLMUnavailableError):
        vllm_modules()


class _Worker:
    """One long-lived worker process for one builder; restarted when it dies."""

    def __init__(
        self, target: Any, name: str | None, start_method: str | None, memory: int | None = None
    ) -> None:
        #: Bytes of private memory the worker may take over its start (None: worker_side's default).
        self.memory = memory
        method = start_method or _default_start_method()
        if (
            start_method is None
            and method == "fork"
            and name is not None
            and confine.key_in_memory()
        ):
            # This process holds the certification key: a forked worker would hold a
            # copy of it.  A fresh interpreter gets only what it is sent.
            method = "spawn"
        self.context: Any = multiprocessing.get_context(method)
        if method == "fork":
            self.target: Any = target
        elif name is not None:
            self.target = ("name", name)
        else:
            # Pickled here, unpickled in the worker's server: importing the builder's
            # module there happens inside containment.
            self.target = pickle.dumps(target)
        #: How the worker was started (``fork`` or ``spawn``), for the report.
        self.start_method = method
        #: What the worker's containment chain said held (confine.enter), as data.
        self.containment: dict[str, Any] = {}
        self.lock = threading.Lock()
        self.owner = os.getpid()
        #: Where the workers' stdout and stderr go (read back, bounded, for the report).
        self.output: str | None = _output_file()
        #: Deaths on consecutive calls (a call that answered resets it), and the last one's hook.
        self.deaths_in_a_row = 0
        self.last_death = ""
        self.process: Any = None
        self.conn: Any = None
        self.generation = 0
        self.keys = itertools.count()
        self.dropped: list[int] = []
        self.deaths = 0
        #: Files whose executed lines the worker records (reach), set before it starts.
        self.reach_files: list[str] | None = None
        #: Lines recorded by workers that have since been replaced.
        self.reached: dict[str, set[int]] = {}
        #: The ``describe`` request every new worker answers first (loads the
        #: builder there, starts its reach tracer), and its last answer.
        self.describe_args: tuple[Any, ...] | None = None
        self.described: dict[str, Any] = {}
        #: When the first worker started, as the file system stamps changes
        #: (integrity.mark): files changed since may hold the builder's writes.
        self.marked: int | None = None

    def _start(self) -> None:
        if self.marked is None:
            self.marked = integrity.mark()
        confine.protect_judge()
        parent_conn, child_conn = self.context.Pipe()
        process = self.context.Process(
            target=confine.run_contained,
            args=(
                child_conn,
                os.getpid(),
                "conformance.harness.worker_side:serve",
                self.target,
                self.reach_files,
                self.output,
                self.memory,
            ),
            name="kvref-isolate-worker",
            daemon=True,
        )
        with confine.without_key():
            process.start()
        child_conn.close()
        self.process, self.conn = process, parent_conn
        self.containment = self._contained()
        confine.record("worker", self.containment)
        self.generation += 1
        self.dropped.clear()
        if self.describe_args is not None:
            # A replacement worker loads the builder (and traces it) as the first did.
            data = self._exchange("describe", 0, "describe", self.describe_args, _START_SECONDS)
            self.described = self._answer("describe", (), data)

    def _contained(self) -> dict[str, Any]:
        """What the worker's containment held, sent before any of the builder's code ran.

        Raises:
            IsolationError: no such message within the start deadline, or not data.
            WorkerDiedError: the worker died while starting.
        """
        try:
            if not self.conn.poll(_START_SECONDS):
                self.close()
                raise IsolationError(f"the worker did not start within {_START_SECONDS:.0f} s")
            facts = json.loads(self.conn.recv_bytes())
        except (EOFError, OSError):
            raise self._died("start") from None
        except ValueError as exc:
            self.close()
            raise IsolationError(f"the worker's first message is not data: {exc}") from None
        if type(facts) is not dict:
            self.close()
            raise IsolationError(f"the worker's first message is {facts!r:.80}")
        return facts

    def describe(self, name: str | None, reach: Any) -> dict[str, Any]:
        """Start the worker, load the builder there, and return what it says of it (data).

        Raises:
            Exception: what loading or describing the builder raised in the worker.
            IsolationError: no answer within the start deadline.
            WorkerDiedError: the worker died while loading the builder.
        """
        with self.lock:
            self.describe_args = (name, reach)
            if self.process is None:
                self._start()
            else:
                data = self._exchange("describe", 0, "describe", self.describe_args, _START_SECONDS)
                self.described = self._answer("describe", (), data)
        return self.described

    def request(self, op: str, key: int, hook: str, args: tuple[Any, ...]) -> Any:
        """Run ``op`` in the worker; returns the answer or raises what the builder raised."""
        with self.lock:
            data = self._exchange(op, key, hook, args)
        try:
            return self._answer(hook, args, data)
        except KitError as exc:
            # Inside a kvref-native builder's construction or hook the worker runs
            # none of the kit's code (only the vLLM adapter does, for a vLLM-native
            # one): a kit error reported from there was raised by the builder.
            if op in ("new", "call") and self.described and not self.described.get("native"):
                raise wire.as_builders(exc) from None
            raise

    def _exchange(
        self, op: str, key: int, hook: str, args: tuple[Any, ...], wait: float | None = None
    ) -> bytes:
        """Send one request and read its answer; the caller holds :attr:`lock`.

        Raises:
            IsolationError: the arguments do not pickle, or no answer came within ``wait``
                seconds (the worker is then stopped: its late answer would answer the
                next request).
            WorkerDiedError: the worker died.
        """
        if self.process is None:
            if self.deaths_in_a_row >= MAX_DEATHS_IN_A_ROW:
                # A builder that kills its worker on every call would cost a
                # restart (an import of its module) per call: stop here.  The
                # constructor answered on every start, so a construction is
                # not held against it; each hook call fails, named.
                if op == "new":
                    return encode_reply("ok", None, ())
                raise WorkerDiedError(
                    f"{self.last_death}; it died on {self.deaths_in_a_row} calls in a row, so "
                    f"it is not started again and {hook} was not called"
                )
            self._start()
        dropped, self.dropped = self.dropped, []
        try:
            message = pickle.dumps((op, key, hook, args, dropped))
        except Exception as exc:
            raise IsolationError(f"the arguments of {hook} do not pickle: {exc}") from exc
        try:
            self.conn.send_bytes(message)
            if wait is not None and not self.conn.poll(wait):
                self.close()
                raise IsolationError(f"the worker gave no answer to {op!r} within {wait:.0f} s")
            data: bytes = self.conn.recv_bytes()
        except (EOFError, OSError):
            raise self._died(hook) from None
        if op == "call":
            # Only a hook that answered shows the worker survives the builder's calls.
            self.deaths_in_a_row = 0
        return data

    def _answer(self, hook: str, args: tuple[Any, ...], data: bytes) -> Any:
        # Decoded as data, never unpickled: nothing the worker sends runs here.
        try:
            message = json.loads(data)
            status, body, changes = message["status"], message["value"], message["changes"]
            if status not in ("ok", "raised") or type(changes) is not list:
                raise wire.WireError(f"status {status!r:.40}")
            apply_changes(args, changes)
            noted = message.get("handed", [])
            if type(noted) is not list or not all(type(n) is str for n in noted):
                raise wire.WireError(f"handed changes {noted!r:.40}")
            # Bounded: a flood of lines would only bloat the report.
            native_input_changes.record(*(n[:300] for n in noted[:64]))
            if status == "raised":
                raised = wire.decode_exception(body, f"{hook}'s exception")
                tb = body.get("traceback")
                if tb and hasattr(raised, "add_note"):
                    raised.add_note(f"in the builder's worker process:\n{str(tb).rstrip()}")
            else:
                value = wire.decode(body, f"{hook}'s answer")
        except (ValueError, KeyError, TypeError) as exc:
            raise IsolationError(
                f"the answer of {hook} from the builder's worker is not wire data: {exc}"
            ) from None
        if status == "raised":
            raise raised
        return value

    def _died(self, hook: str) -> WorkerDiedError:
        process, self.process = self.process, None
        with contextlib.suppress(OSError):
            self.conn.close()
        # The server ended: its init reports how and ends its namespace, then the
        # sentinel leaves the same way.  One that does not is ended from here.
        process.join(5)
        if process.is_alive():
            confine.end_chain(process.pid, process.is_alive, self.containment)
            process.join(5)
        if process.is_alive():
            process.kill()
            process.join(5)
        code = process.exitcode
        _kill_group(process.pid)
        self.deaths += 1
        self.deaths_in_a_row += 1
        what = "constructing the builder" if hook == "__init__" else hook
        when = "as it started" if hook == "start" else f"while {what} ran"
        self.last_death = (
            f"the builder's worker process died with exit code {code}{_signal_name(code or 0)} "
            f"{when}"
        )
        return WorkerDiedError(self.last_death)

    def reach_lines(self) -> dict[str, set[int]]:
        """The builder's lines the workers executed (a worker that died took its own along)."""
        # A worker still busy is not asked: a hook that hung holds the lock, and so
        # may one that Ctrl-C left running.  The lock stays held while asking, so no
        # hook of such a thread slips in between and makes this wait for it.
        if not self.lock.acquire(blocking=False):
            return self.reached
        try:
            if self.process is not None:
                with contextlib.suppress(Exception):
                    data = self._exchange("reach", 0, "reach", (), wait=_REACH_SECONDS)
                    for path, lines in self._answer("reach", (), data).items():
                        self.reached.setdefault(path, set()).update(lines)
        finally:
            self.lock.release()
        return self.reached

    def close(self) -> None:
        """Stop the worker (a hook may still be running there: it is killed)."""
        process, self.process = self.process, None
        if process is None or self.owner != os.getpid():
            # A process forked from the kit (another worker) inherits this
            # object; only the kit's own process may stop its worker.
            return
        with contextlib.suppress(OSError):
            self.conn.close()
        # The init first: its sentinel leaves once the namespace is empty.
        confine.end_chain(process.pid, process.is_alive, self.containment)
        process.join(5)
        if process.is_alive():
            process.kill()
            process.join(5)
        _kill_group(process.pid)

    def output_tail(self) -> str:
        """The last :data:`OUTPUT_LIMIT` bytes the builder printed in its workers (text)."""
        if self.output is None:
            return ""
        try:
            with open(self.output, "rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(0, size - OUTPUT_LIMIT))
                tail = f.read()
        except OSError:
            return ""
        cut = f"[... {size - len(tail)} earlier bytes left out ...]\n" if size > len(tail) else ""
        return cut + tail.decode("utf-8", errors="replace")


def _output_file() -> str | None:
    import tempfile

    try:
        fd, path = tempfile.mkstemp(prefix="kvref-builder-output-", suffix=".txt")
    except OSError:
        return None
    os.close(fd)
    weakref.finalize(_OUTPUTS, _remove, path)
    return path


class _Outputs:
    """Anchor of the output files' clean-up at interpreter exit."""


_OUTPUTS = _Outputs()


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def _kill_group(pid: int) -> None:
    """End what is left of a worker's process group (children the builder forked)."""
    with contextlib.suppress(OSError):
        os.killpg(pid, signal.SIGKILL)


@attrs.frozen(kw_only=True)
class Resolved:
    """What resolving a qualname inside the worker process gave.

    Attributes:
        identity: identifies the object resolution returned, among the objects
            the worker holds (never 0).
        type_name: the qualified name of that object's class.
        is_named_class: whether it is an instance of the class the qualname names.
        is_builder: whether it is a :class:`~kvref.builder.KVCacheConfigBuilder`.
    """

    identity: int
    type_name: str
    is_named_class: bool
    is_builder: bool


class IsolatedBuilder(DescribedBuilder):
    """A builder whose hooks run in its class's worker process (see :func:`isolated`)."""

    _kvref_worker: _Worker
    #: ``(qualname, config)`` for a builder made by resolution in the worker.
    _resolution: tuple[str, PlanningConfig] | None = None

    def __init__(self) -> None:
        worker = type(self)._kvref_worker
        self._key = next(worker.keys)
        self._generation = -1
        self._made()

    @classmethod
    def resolve_in_worker(
        cls, qualname: str, config: PlanningConfig
    ) -> tuple[IsolatedBuilder, Resolved]:
        """A builder that resolving ``qualname`` made in the worker, as vLLM resolves it.

        The worker runs kvref's ``get_kv_cache_config_builder`` with ``qualname``
        as the platform's choice: class lookup and construction both happen
        there.  The returned proxy's hooks run on the object resolution
        returned, whatever it is.

        Raises:
            Exception: what resolution raised in the worker (a construction failure).
            WorkerDiedError: the worker died while resolving.
        """
        made = cls.__new__(cls)
        made._key = next(cls._kvref_worker.keys)
        made._resolution = (qualname, config)
        return made, made._resolve_here(made._resolution)

    def _resolve_here(self, resolution: tuple[str, PlanningConfig]) -> Resolved:
        worker = type(self)._kvref_worker
        identity, type_name, named, is_builder = worker.request(
            "resolve", self._key, "__init__", resolution
        )
        self._generation = worker.generation
        return Resolved(
            # Ids are unique among a worker's live objects; the generation keeps a
            # restarted worker's ids apart from its predecessor's.
            identity=(worker.generation << 64) | identity,
            type_name=type_name,
            is_named_class=named,
            is_builder=is_builder,
        )

    def _made(self) -> None:
        worker = type(self)._kvref_worker
        if self._generation == worker.generation and worker.process is not None:
            return
        # A worker that died took this builder with it: build it again in the new one.
        if self._resolution is not None:
            self._resolve_here(self._resolution)
            return
        worker.request("new", self._key, "__init__", ())
        self._generation = worker.generation

    def __del__(self) -> None:
        worker = getattr(type(self), "_kvref_worker", None)
        if worker is not None and hasattr(self, "_key"):
            worker.dropped.append(self._key)

    def _call(self, hook: str, *args: Any) -> Any:
        self._made()
        return type(self)._kvref_worker.request("call", self._key, hook, args)

    def get_kv_cache_groups(
        self, config: PlanningConfig, kv_cache_spec: Mapping[str, KVCacheSpec]
    ) -> list[KVCacheGroupSpec]:
        """The builder's grouping, computed in the worker."""
        groups: list[KVCacheGroupSpec] = self._call("get_kv_cache_groups", config, kv_cache_spec)
        return groups

    def get_kv_cache_config_from_groups(
        self, config: PlanningConfig, kv_cache_groups: Sequence[KVCacheGroupSpec], num_blocks: int
    ) -> KVCacheConfig:
        """The builder's placement, computed in the worker."""
        placed: KVCacheConfig = self._call(
            "get_kv_cache_config_from_groups", config, kv_cache_groups, num_blocks
        )
        return placed

    def _get_pool_bytes_per_block(
        self, config: PlanningConfig, kv_cache_groups: Sequence[KVCacheGroupSpec]
    ) -> int | None:
        answer: int | None = self._call("_get_pool_bytes_per_block", config, kv_cache_groups)
        return answer

    @classmethod
    def close(cls) -> None:
        """Stop this class's worker process."""
        cls._kvref_worker.close()


def isolated(
    builder: KVCacheConfigBuilder | type[KVCacheConfigBuilder] | str,
    name: str | None = None,
    *,
    start_method: str | None = None,
    reach: bool | Sequence[str] | None = None,
    memory: int | None = None,
) -> type[IsolatedBuilder]:
    """A proxy class for ``builder`` whose hooks run in a worker process.

    Args:
        builder: the builder's importable name (``module:Class``, as the CLI
            and the plugin pass it: its module is then imported only in the
            worker, never in this process), or a class (constructed in the
            worker with no arguments) or instance (its class is constructed,
            else it is reused) that the caller already holds.
        name: the builder's importable name (default: ``builder`` when it is one).
        start_method: ``fork`` or ``spawn`` (default: fork where available).
        reach: measure reach in the worker: ``True`` for the builder's own
            modules, or module names (``None``: do not).
        memory: bytes of private memory the worker may take over its size at
            start (``RLIMIT_DATA``; default: the ``worker_memory`` option's
            default, 16 GiB).

    The worker starts now and describes the builder as data (its declared
    capabilities, whether it is vLLM-native, its parent builder, its reach
    files): nothing of the builder's class is read here.  Call ``close()`` on
    the class when done (the worker also leaves when the kit's process ends).

    Raises:
        BuilderLoadError: the builder cannot be loaded in the worker.
    """
    from conformance.harness.adapters import BuilderLoadError

    if isinstance(builder, str):
        name = name or builder
        target: Any = ("name", builder)
        label = builder.rpartition(":")[2].rpartition(".")[2] or "Builder"
        if (start_method or _default_start_method()) == "fork" and imports_vllm(builder):
            _import_vllm_here()
    else:
        target = builder
        label = (builder if isinstance(builder, type) else type(builder)).__name__
    worker = _Worker(target, name, start_method, memory)
    try:
        facts = worker.describe(name, reach)
    except BaseException as exc:
        worker.close()
        if isinstance(exc, (KeyboardInterrupt, SystemExit, KitError)):
            raise  # the kit's own failure while loading (the vLLM adapter): exit 2, reported
        raise BuilderLoadError(f"{name or label}: {exc}") from None
    namespace: dict[str, Any] = {
        "_kvref_worker": worker,
        "kvref_unsupported": tuple(str(c) for c in facts.get("unsupported", ())),
        # The importable name of the builder the proxy runs (the twin process imports it).
        "kvref_name": name,
        # What the worker said of the builder, as data (see _describe).
        "kvref_class": str(facts.get("class", "")),
        "kvref_native": facts.get("native"),
        "kvref_parent": facts.get("parent"),
        "kvref_qualname": (facts.get("qualname"), str(facts.get("qualname_note", ""))),
        "kvref_reach_files": tuple(str(f) for f in facts.get("reach_files", ())),
        "kvref_reach_scope": dict(facts.get("reach_scope") or {}),
        "__doc__": f"{facts.get('class', label)}, run in a worker process.",
    }
    if facts.get("vllm_core"):
        from conformance.harness.vllm_adapter import vllm_core_flow
        from kvref.interop.vllm import vllm_modules

        # vLLM's Core runs here (vLLM's code, not the builder's); every builder
        # call it makes goes through the kit's checks to the worker.
        vllm_modules()
        namespace["kvref_core"] = staticmethod(vllm_core_flow)
    proxy = type(f"Isolated{label}", (IsolatedBuilder,), namespace)
    weakref.finalize(proxy, worker.close)
    return proxy
