"""The builder's side of isolation: what runs in the worker process.

:mod:`conformance.harness.isolate` starts the worker with :func:`serve` as its
target and talks to it over a pipe.  Everything here runs in the worker,
never in the kit's judging process: loading the builder, constructing it,
running its hooks, snapshotting their arguments (so the kit can mirror
in-place changes), tracing reach, bounding memory, and encoding each answer
as wire data (:mod:`conformance.harness.wire`).
"""

from __future__ import annotations

import contextlib
import json
import operator
import os
import pickle
import signal
import threading
import time
import traceback
import types
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import attrs

from conformance.generate.limits import declared_unsupported
from conformance.harness import integrity, native_input_changes, wire
from conformance.harness.allocator_settings import keep_freed_memory
from kvref.builder import KVCacheConfigBuilder
from kvref.config import PlanningConfig
from kvref.interop.vllm_convert import keep_vllm_quiet

Ref = tuple[str, Any]


#: Per attrs class, a function giving its field values (``None``: not an attrs class).
_FIELD_VALUES: dict[type, Callable[[Any], list[Any]] | None] = {}


def _field_values(cls: type) -> Callable[[Any], list[Any]] | None:
    # Every builder call walks its arguments twice: reading fields through one
    # attrgetter per class is several times faster than attrs.fields and getattr.
    try:
        return _FIELD_VALUES[cls]
    except KeyError:
        pass
    getter: Callable[[Any], list[Any]] | None = None
    if attrs.has(cls):
        names = [f.name for f in attrs.fields(cls)]
        many = operator.attrgetter(*names) if names else None

        def getter(obj: Any) -> list[Any]:
            if many is None:
                return []
            try:
                got = many(obj)
            except AttributeError:
                # A field left unset (a hostile object): read what is there.
                return [getattr(obj, n, None) for n in names]
            return list(got) if len(names) > 1 else [got]

    _FIELD_VALUES[cls] = getter
    return getter


#: Types whose objects are never walked, skipped without a lookup.
_LEAVES = frozenset({int, str, float, bool, bytes, type(None)})


def _children(obj: Any) -> list[Any] | None:
    """The contents of a walked object (``None``: a leaf, not walked)."""
    if isinstance(obj, dict):
        return [v for kv in obj.items() for v in kv]
    if isinstance(obj, (list, tuple)):
        return list(obj)
    if isinstance(obj, types.MappingProxyType):
        return [v for kv in obj.items() for v in kv]
    values = _field_values(type(obj))
    return None if values is None else values(obj)


def walk(root: Any) -> list[Any]:
    """Every walked object reachable from ``root``, each once, in a fixed order."""
    return _walk_with_children(root)[0]


def _walk_with_children(root: Any) -> tuple[list[Any], list[list[Any]]]:
    """:func:`walk`, and the contents of each walked object as found."""
    seen: set[int] = set()
    order: list[Any] = []
    contents: list[list[Any]] = []
    stack = [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        children = _children(obj)
        if children is None:
            continue
        seen.add(id(obj))
        order.append(obj)
        contents.append(children)
        stack.extend(c for c in reversed(children) if type(c) not in _LEAVES)
    return order, contents


def _is_mutable(obj: Any) -> bool:
    """Whether a builder can change ``obj`` in place: a list, a dict, an attrs object."""
    return isinstance(obj, (dict, list)) or _field_values(type(obj)) is not None


def _mutable_state(obj: Any) -> list[Any] | None:
    """What a builder can change in place: list items, dict items, attrs fields."""
    return _children(obj) if _is_mutable(obj) else None


class _Snapshot:
    """The arguments' walked objects and their contents before a call (worker side)."""

    def __init__(self, args: Any) -> None:
        self.objects, contents = _walk_with_children(args)
        self.index = {id(o): i for i, o in enumerate(self.objects)}
        self.before = [
            c if _is_mutable(o) else None for o, c in zip(self.objects, contents, strict=True)
        ]

    def _encode(self, value: Any) -> Ref:
        i = self.index.get(id(value))
        return ("ref", i) if i is not None else ("val", wire.encode(value))

    def changes(self) -> list[tuple[int, list[Ref]]]:
        """``(index, new contents)`` of every object whose contents changed."""
        out = []
        for i, (obj, before) in enumerate(zip(self.objects, self.before, strict=True)):
            if before is None:
                continue
            after = _mutable_state(obj) or []
            same = len(after) == len(before) and all(map(operator.is_, after, before))
            if not same:
                out.append((i, [self._encode(v) for v in after]))
        return out


def _own_output(output: str | None) -> None:
    """Send the worker's stdout and stderr to ``output``.

    The builder's prints never mix into the kit's own report on the terminal.
    (The worker's process group and namespace are :mod:`.confine`'s.)
    """
    if output is None:
        return
    with contextlib.suppress(OSError):
        fd = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)


#: GiB the worker may take over its start, unless the run says otherwise
#: (the ``worker_memory`` option).
DEFAULT_WORKER_MEMORY_GIB = 16.0
#: How much more private memory (heap and anonymous maps) a worker may take
#: than it held when it started, in bytes.
WORKER_MEMORY_HEADROOM = int(DEFAULT_WORKER_MEMORY_GIB * (1 << 30))


def proc_bytes(path: str, field: str) -> int | None:
    """The bytes of ``field``'s line (``Field:  N kB``) of a /proc file (``None``: not there)."""
    try:
        with open(path, encoding="ascii") as lines:
            for line in lines:
                if line.startswith(f"{field}:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _private_bytes() -> int | None:
    """This process's private data size (Linux ``VmData``; ``None`` elsewhere)."""
    return proc_bytes("/proc/self/status", "VmData")


def _limit_memory(headroom: int | None = None) -> int | None:
    """Cap the worker's private memory at its size now plus ``headroom``; returns the cap.

    ``RLIMIT_DATA`` (not the address space): it counts what a leak grows,
    and not the shared libraries nor the reserved, unbacked ranges a CUDA
    runtime maps.  ``None``: the platform has no such limit, nothing is capped.
    """
    headroom = WORKER_MEMORY_HEADROOM if headroom is None else headroom
    used = _private_bytes()
    if used is None:
        return None
    try:
        import resource

        _, hard = resource.getrlimit(resource.RLIMIT_DATA)
        cap = used + headroom
        if hard != resource.RLIM_INFINITY:
            cap = min(cap, hard)
        resource.setrlimit(resource.RLIMIT_DATA, (cap, hard))
    except (ImportError, ValueError, OSError):
        return None
    return cap


def _watch_parent(parent: int) -> None:
    # A worker stuck in a hook never reads its pipe again: leave with its parent
    # (the chain's init; where there is no chain, the kit itself).
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(0)

    threading.Thread(target=watch, name="kvref-isolate-watch", daemon=True).start()


def _resolve(target: Any) -> Any:
    if isinstance(target, bytes):
        # A spawned worker gets the builder pickled: unpickled here, inside containment.
        target = pickle.loads(target)
    if isinstance(target, tuple) and target[:1] == ("name",):
        from conformance.harness.adapters import load_builder

        return load_builder(target[1])
    return target


def _construct(target: Any) -> Any:
    if isinstance(target, type):
        return target()
    try:
        return type(target)()
    except Exception:
        # Only an instance was given: reuse it, as the in-process factory does.
        return target


def _resolve_named(
    builder: Any, qualname: str, config: PlanningConfig
) -> tuple[Any, tuple[Any, ...]]:
    """Resolve ``qualname`` as vLLM's ``get_kv_cache_config_builder`` does, in this process.

    Returns the object resolution made and what the kit records of it:
    ``(id, type name, is an instance of the named class, is a builder)``.
    """
    from conformance.harness.vllm_adapter import (
        VLLMBuilderAdapter,
        resolution_facts,
        resolve_as_vllm,
    )
    from kvref.resolution import get_kv_cache_config_builder, resolve_builder_class

    if isinstance(builder, type) and issubclass(builder, VLLMBuilderAdapter):
        # A vLLM-native builder is resolved as vLLM resolves its platform's builder.
        return resolve_as_vllm(qualname)
    made = get_kv_cache_config_builder(attrs.evolve(config, platform_builder_cls=qualname))
    named = resolve_builder_class(qualname, "builder")
    return made, resolution_facts(made, named, KVCacheConfigBuilder)


def encode_reply(
    status: str, payload: Any, changes: Any, handed_changes: Sequence[str] = ()
) -> bytes:
    """One answer as JSON wire data (:mod:`conformance.harness.wire`): never a pickle.

    ``raised`` answers carry ``(exception, traceback text)``; every other
    answer a value.  Encoding never fails on an odd object of the builder's:
    it travels as its type name and repr.  ``handed_changes`` are the
    changes to the vLLM adapter's own inputs (:mod:`conformance.harness.native_input_changes`).
    """
    if status == "raised":
        raised, tb = payload
        body: Any = wire.encode_exception(raised, tb)
    else:
        body = wire.encode(payload)
    encoded = [[i, [[kind, v] for kind, v in refs]] for i, refs in changes]
    message = {"status": status, "value": body, "changes": encoded, "handed": list(handed_changes)}
    return json.dumps(message).encode()


def _start_reach(files: Sequence[str] | None) -> Any:
    """Trace the builder's own files in this worker (reach is measured where the builder runs)."""
    if not files:
        return None
    import coverage

    from conformance.harness.reach import line_tracer

    inherited = coverage.Coverage.current()
    if inherited is not None:
        # A forked worker inherits the kit's tracer, whose data would stay here.
        with contextlib.suppress(Exception):
            inherited.stop()
    # Started only around the builder's own code (see _traced): the worker's
    # bookkeeping is neither reach nor worth tracing.
    return line_tracer(files)


@contextlib.contextmanager
def _traced(cov: Any) -> Iterator[None]:
    """Trace what runs inside (the builder's code) when reach is measured."""
    if cov is None:
        yield
        return
    cov.start()
    try:
        yield
    finally:
        cov.stop()


def _reach_lines(cov: Any) -> dict[str, list[int]]:
    if cov is None:
        return {}
    data = cov.get_data()
    return {f: sorted(data.lines(f) or ()) for f in data.measured_files()}


def _describe(builder: Any, name: str | None, reach: Any) -> dict[str, Any]:
    """What the kit needs to know of the builder, read here and sent as data.

    The kit never reads an attribute of the builder's class itself (a
    metaclass ``__getattr__`` would run in the kit's process); it asks this.
    """
    from conformance.harness.builder_identity import parent_builder, resolvable_qualname
    from conformance.harness.reach import ReachMeter
    from conformance.harness.vllm_adapter import VLLMBuilderAdapter

    cls = builder if isinstance(builder, type) else type(builder)
    native = getattr(cls, "native_cls", None) if issubclass(cls, VLLMBuilderAdapter) else None
    parent = parent_builder(builder)
    parent_kind = None
    if parent is not None:
        parent_kind = "vllm-default" if getattr(parent, "native_cls", None) else "reference"
    qualname, note = resolvable_qualname(builder, name)
    files: list[str] = []
    scope: dict[str, Any] = {}
    if reach is not None:
        modules = None if reach is True else [str(m) for m in reach]
        meter = ReachMeter.for_builder(builder, modules)
        files = [str(f) for f in meter.files]
        scope = {
            "own": None if meter.own is None else [str(f) for f in meter.own],
            "platform": None if meter.platform is None else str(meter.platform),
            "counted": None
            if meter.counted is None
            else {path: sorted(names) for path, names in meter.counted.items()},
        }
    return {
        "class": f"{cls.__module__}:{cls.__qualname__}",
        "unsupported": list(declared_unsupported(builder)),
        "native": None if native is None else f"{native.__module__}:{native.__qualname__}",
        "vllm_core": native is not None,
        "parent": parent_kind,
        "qualname": qualname,
        "qualname_note": note,
        "reach_files": files,
        "reach_scope": scope,
    }


def serve(
    conn: Any,
    target: Any,
    reach_files: Sequence[str] | None = None,
    output: str | None = None,
    memory: int | None = None,
) -> None:
    """The worker's loop: make builders, run hooks, send back what happened.

    Runs in the server of a :mod:`.confine` chain (``run_contained``).
    ``memory``: bytes of private memory allowed over the worker's size at
    start (default :data:`WORKER_MEMORY_HEADROOM`).
    """
    with contextlib.suppress(ValueError):
        # Ctrl-C belongs to the kit, which writes the partial report.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    _own_output(output)
    _watch_parent(os.getppid())
    integrity.unguard()
    wire.in_builder_process()
    # This process only plans: vLLM's logger stays quiet for good once set.
    keep_vllm_quiet()
    keep_freed_memory()  # the worker is the kit's process (allocator_settings.py)
    headroom = WORKER_MEMORY_HEADROOM if memory is None else memory
    memory_cap = _limit_memory(headroom)
    from conformance.harness.vllm_adapter import VLLMBuilderAdapter, set_native_scope

    cov = _start_reach(reach_files)
    set_native_scope(lambda: _traced(cov))
    instances: dict[int, Any] = {}
    builder: Any = None
    while True:
        try:
            op, key, hook, args, dropped = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):
            return
        for gone in dropped:
            instances.pop(gone, None)
        snapshot: _Snapshot | None = None
        if op == "reach":
            conn.send_bytes(encode_reply("ok", _reach_lines(cov), ()))
            continue
        try:
            if builder is None:
                with _traced(cov):
                    builder = _resolve(target)
            if op == "describe":
                described = _describe(builder, *args)
                if cov is None and described["reach_files"]:
                    cov = _start_reach(described["reach_files"])
                reply = encode_reply("ok", described, ())
            elif op == "new":
                with _traced(cov):
                    instances[key] = _construct(builder)
                reply = encode_reply("ok", None, ())
            elif op == "resolve":
                # The platform names the class; resolution constructs it here, never in the kit.
                with _traced(cov):
                    instances[key], facts = _resolve_named(builder, *args)
                reply = encode_reply("ok", facts, ())
            else:
                snapshot = _Snapshot(args)
                method = getattr(instances[key], hook)
                native_input_changes.drain()
                # A vLLM-native builder's adapter traces the native calls alone.
                adapted = isinstance(instances[key], VLLMBuilderAdapter)
                with contextlib.nullcontext() if adapted else _traced(cov):
                    value = method(*args)
                reply = encode_reply("ok", value, snapshot.changes(), native_input_changes.drain())
        except BaseException as exc:  # the builder's, even SystemExit: report, keep serving
            add_note = getattr(exc, "add_note", None)  # Python 3.11+
            if isinstance(exc, MemoryError) and memory_cap is not None and add_note is not None:
                add_note(
                    f"the builder's worker process reached its memory limit ({memory_cap >> 20} "
                    f"MiB of private memory: {headroom >> 20} MiB over its size at start; "
                    "the worker_memory option, --worker-memory GIB, sets it)"
                )
            tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)[-3:])
            changes = snapshot.changes() if snapshot is not None else ()
            reply = encode_reply("raised", (exc, tb), changes, native_input_changes.drain())
        conn.send_bytes(reply)
