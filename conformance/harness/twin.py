"""A twin process with another string-hash seed, to catch plans that follow set or dict order.

vLLM plans in the engine-core process and again, for profiling, in every
worker; each process has its own ``PYTHONHASHSEED``.  A builder that orders
groups or layers by iterating a set of strings is deterministic inside one
process and still disagrees across processes.  The kit starts one twin per run
(lazily, at the first example of the ``processes`` scenario), with a hash seed
that differs from its own, asks it the same questions and compares
(contract.md#hook-purity).

The twin loads the builder by its ``module:Class`` name exactly as the kit
does (:func:`conformance.harness.adapters.load_builder`: a vLLM-native builder
comes wrapped in the vLLM adapter, so it gets a real ``VllmConfig`` there as
here).  Builders that cannot be imported by name (classes defined inside
functions) cannot be checked: their observation says so, and the invariant
does not apply.  A failure of the kit's own code in the twin (the adapter,
the protocol) is a :class:`~conformance.errors.KitError`, never a verdict.

Protocol: length-prefixed pickles on the twin's stdin and stdout; each request
is ``(op, args)`` with ``op`` in ``group``/``place`` and each answer
``("ok", value)``, ``("error", text)`` (the builder's failure) or
``("kit-error", text)`` (the kit's own).
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import attrs

from conformance.harness import confine
from conformance.harness.allocator_settings import ENVIRONMENT
from conformance.harness.hooks import Context
from kvref.config import PlanningConfig
from kvref.interop.vllm_convert import keep_vllm_quiet
from kvref.records import KVCacheGroupSpec
from kvref.specs import KVCacheSpec

__all__ = [
    "TWIN_EXAMPLES",
    "Twin",
    "TwinAnswers",
    "ask_twin",
    "budget_spent",
    "close_twin",
    "prestart",
]

#: Seconds the twin may take to start (interpreter, kvref, torch, the builder's module).
_START_SECONDS = 120.0

#: Seconds the twin may take for one answer (at least; the run's hook deadline if longer).
_CALL_SECONDS = 30.0

#: Examples of a run the twin answers (every example of a default run); the rest of a
#: longer run's examples are not judged, which bounds the twin's share of a thorough run.
TWIN_EXAMPLES = 64

_HEADER = struct.Struct("!Q")


class TwinError(Exception):
    """The twin could not answer (it failed to start, died, hung, or cannot pickle the input)."""


def _send(stream: IO[bytes], value: Any) -> None:
    data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def _answer(stream: IO[bytes], status: str, value: Any) -> None:
    """The twin's answer, as wire data (conformance.harness.wire): the kit never unpickles it."""
    from conformance.harness import wire

    data = json.dumps([status, wire.encode(value)]).encode()
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def _read_answer(stream: IO[bytes]) -> tuple[str, Any]:
    from conformance.harness import wire

    (size,) = _HEADER.unpack(_read_exact(stream, _HEADER.size))
    try:
        status, body = json.loads(_read_exact(stream, size))
        return str(status), wire.decode(body, "the twin's answer")
    except (ValueError, TypeError) as exc:
        raise TwinError(f"the twin's answer is not wire data: {exc}") from None


def _read_exact(stream: IO[bytes], size: int) -> bytes:
    chunks = []
    while size:
        chunk = stream.read(size)
        if not chunk:
            raise EOFError("the other side closed the pipe")
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def _receive(stream: IO[bytes]) -> Any:
    (size,) = _HEADER.unpack(_read_exact(stream, _HEADER.size))
    return pickle.loads(_read_exact(stream, size))


def _other_hash_seed() -> str:
    # PYTHONHASHSEED=0 turns randomisation off; a parent with randomisation
    # (the default) then hashes strings differently for all but a 2**-64 chance.
    mine = os.environ.get("PYTHONHASHSEED", "random")
    return "1" if mine == "0" else "0"


class Twin:
    """One twin process for one builder, with a string-hash seed unlike this process's."""

    def __init__(self, reference: str, timeout: float) -> None:
        self.reference = reference
        self.timeout = timeout
        self.hash_seed = _other_hash_seed()
        self.broken: str | None = None
        # The twin is the kit's process: its allocator keeps freed memory (allocator_settings.py).
        # It runs the builder's code: never with the certification key (confine.py).
        env = confine.child_environment({**ENVIRONMENT, "PYTHONHASHSEED": self.hash_seed})
        # The builder's module must import there as here.
        path = [p for p in sys.path if p and Path(p).is_dir()]
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([str(Path.cwd()), *path]))
        confine.protect_judge()
        # Contained as the worker is: whatever the builder starts there ends with the twin.
        self.process = subprocess.Popen(
            [sys.executable, "-m", "conformance.harness.confine", f"{__name__}:main", reference],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            # Its own process group and session.
            start_new_session=True,
        )
        #: What the twin's containment chain said held (confine.enter).
        self.containment: dict[str, Any] = {}
        self.started = False
        self.asked = 0

    def ask(self, op: str, *args: Any) -> Any:
        """The twin's answer to one request.

        Raises:
            TwinError: the twin cannot answer; it answers no later request either.
        """
        if self.broken is not None:
            raise TwinError(self.broken)
        if not self.started:
            # The first answer waits for the interpreter and the imports; the
            # others get the hook deadline.
            self.started = True
            self._contained()
            self._exchange(("ping", ()), _START_SECONDS)
        # The twin is no judge of deadlines (KV-CALL-TIMEOUT is, here): a loaded
        # machine must not make it give up on a builder that answers here.
        return self._exchange((op, args), max(self.timeout, _CALL_SECONDS))

    def _contained(self) -> None:
        """Read what the twin's containment held: its first frame, before any builder code."""
        stdout = self.process.stdout
        assert stdout is not None
        try:
            ready, _, _ = select.select([stdout], [], [], _START_SECONDS)
            facts = confine.read_frame(stdout) if ready else None
        except (OSError, EOFError, ValueError) as exc:
            facts = f"{exc}"
        if type(facts) is not dict:
            self.broken = f"the twin process did not start: {facts or 'no answer'}"
            self.close()
            raise TwinError(self.broken)
        self.containment = facts
        confine.record("twin", facts)

    def _exchange(self, request: tuple[str, tuple[Any, ...]], wait: float) -> Any:
        stdin, stdout = self.process.stdin, self.process.stdout
        assert stdin is not None and stdout is not None
        try:
            payload = pickle.dumps(request, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:  # the input itself cannot travel (a local callable)
            raise TwinError(f"the input cannot be sent to another process: {exc}") from None
        try:
            stdin.write(_HEADER.pack(len(payload)) + payload)
            stdin.flush()
            ready, _, _ = select.select([stdout], [], [], wait)
            if not ready:
                raise TwinError(f"the twin process gave no answer within {wait:.0f} s")
            status, value = _read_answer(stdout)
        except (OSError, EOFError, pickle.PickleError, TwinError) as exc:
            self.broken = f"the twin process failed: {exc}"
            self.close()
            raise TwinError(self.broken) from None
        if status == "unusable":
            self.broken = str(value)
            self.close()
            raise TwinError(self.broken)
        if status == "kit-error":
            from conformance.errors import KitError

            raise KitError("twin process", str(value))
        return status, value

    def close(self) -> None:
        """Stop the twin (it also stops when this process closes its pipe)."""
        if self.process.poll() is None:
            with contextlib.suppress(OSError):
                assert self.process.stdin is not None
                self.process.stdin.close()
            # Its init first: the twin's process leaves once its namespace is empty.
            confine.end_chain(
                self.process.pid, lambda: self.process.poll() is None, self.containment
            )
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        with contextlib.suppress(OSError):
            os.killpg(self.process.pid, signal.SIGKILL)


_TWINS: dict[int, Twin] = {}


def _twin(ctx: Context, reference: str) -> Twin:
    key = id(ctx.guard)
    twin = _TWINS.get(key)
    if twin is not None and twin.reference != reference:
        twin.close()
        twin = None
    if twin is None:
        twin = _TWINS[key] = Twin(reference, ctx.guard.timeout)
        # One twin per run: it goes when the run's guard goes.
        weakref.finalize(ctx.guard, _close, key)
    return twin


def twin_reference(builder: object) -> str | None:
    """The ``module:Class`` a twin process imports to run ``builder`` (``None``: none)."""
    from conformance.harness.builder_identity import builder_name

    cls = builder if isinstance(builder, type) else type(builder)
    # An isolated run's proxy stands for the builder it names; the vLLM
    # adapter for the native class it wraps (the twin wraps it again).
    named = getattr(cls, "kvref_name", None)
    if named:
        return str(named)
    return builder_name(getattr(cls, "native_cls", cls))


def prestart(ctx: Context, builder: object) -> None:
    """Start the run's twin process now, so its interpreter starts while other scenarios run."""
    reference = twin_reference(builder)
    if reference is not None:
        _twin(ctx, reference)


def close_twin(ctx: Context) -> None:
    """Stop the twin process of the run ``ctx`` belongs to, if it has one."""
    _close(id(ctx.guard))


def _close(key: int) -> None:
    twin = _TWINS.pop(key, None)
    if twin is not None:
        twin.close()


@attrs.frozen(kw_only=True)
class TwinAnswers:
    """What the twin process said of one example, or why it said nothing.

    Attributes:
        grouping, placement: the twin's ``(status, value)`` answers (``None``: not asked).
        unavailable: why the twin could not answer (``None``: it did, or it was not asked).
        skipped: why it was not asked although it could have been.
        hash_seed: the twin's ``PYTHONHASHSEED``.
    """

    grouping: tuple[str, Any] | None = None
    placement: tuple[str, Any] | None = None
    unavailable: str | None = None
    skipped: str | None = None
    hash_seed: str = ""


def budget_spent(ctx: Context) -> bool:
    """Whether the run's twin has answered all the examples it answers (:data:`TWIN_EXAMPLES`)."""
    twin = _TWINS.get(id(ctx.guard))
    return twin is not None and twin.asked >= TWIN_EXAMPLES


def ask_twin(
    ctx: Context,
    builder: object,
    config: PlanningConfig,
    specs: Mapping[str, KVCacheSpec],
    groups: Sequence[KVCacheGroupSpec],
    num_blocks: int,
) -> TwinAnswers:
    """Group ``specs`` and place ``groups`` in the twin process, with ``builder``'s class."""
    if not ctx.twin:
        return TwinAnswers(unavailable="no selected invariant reads the twin")
    reference = twin_reference(builder)
    if reference is None:
        return TwinAnswers(
            unavailable="the builder class cannot be imported by name in another process"
        )
    if ctx.guard.hung is not None:
        return TwinAnswers(skipped="the builder hung earlier; it is not called again")
    twin = _twin(ctx, reference)
    twin.asked += 1
    try:
        there = twin.ask("group", config, dict(specs))
        placed = twin.ask("place", config, list(groups), num_blocks)
    except TwinError as exc:
        return TwinAnswers(unavailable=str(exc), hash_seed=twin.hash_seed)
    return TwinAnswers(grouping=there, placement=placed, hash_seed=twin.hash_seed)


def _serve(reference: str, stdin: IO[bytes], stdout: IO[bytes]) -> None:
    from conformance.errors import BuilderKitError, KitError
    from conformance.harness.adapters import load_builder
    from conformance.harness.vllm_adapter import VLLMBuilderAdapter

    try:
        cls = load_builder(reference)
        adapted = isinstance(cls, type) and issubclass(cls, VLLMBuilderAdapter)
    except Exception as exc:  # the builder cannot be imported here: nothing to compare
        with contextlib.suppress(EOFError):
            _receive(stdin)
            _answer(stdout, "unusable", f"the twin cannot import {reference}: {exc!r}")
        return
    while True:
        try:
            op, args = _receive(stdin)
        except EOFError:
            return
        if op == "ping":
            import torch  # noqa: F401

            import kvref.specs  # noqa: F401 - unpickling specs needs torch: load it now

            _answer(stdout, "ok", None)
            continue
        try:
            builder = cls() if isinstance(cls, type) else cls
        except BaseException as exc:  # construction is KV-CALL-CONSTRUCT's, in this process
            _answer(stdout, "construct-error", f"{type(exc).__name__}: {exc}")
            continue
        try:
            if op == "group":
                answer: Sequence[Any] | Any = builder.get_kv_cache_groups(*args)
            else:
                answer = builder.get_kv_cache_config_from_groups(*args)
            reply: tuple[str, Any] = ("ok", answer)
        except KitError as exc:
            # The kit's code runs inside a hook only in the vLLM adapter (whose
            # native calls turn the builder's KitError into its own error).
            reply = (
                ("kit-error", f"{exc}\n{exc.detail}")
                if adapted
                else ("error", f"{BuilderKitError.__name__}: {BuilderKitError.of(exc)}")
            )
        except BaseException as exc:  # the builder's own failure, reported as text
            reply = ("error", f"{type(exc).__name__}: {exc}")
        _answer(stdout, *reply)


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the twin process: ``python -m conformance.harness.twin module:Class``.

    The kit starts it contained (``python -m conformance.harness.confine
    conformance.harness.twin:main module:Class``).  Serves until the kit
    closes the pipe, then ends the process (it never returns).
    """
    from conformance.harness import wire

    args = list(sys.argv[1:] if argv is None else argv)
    keep_vllm_quiet()
    wire.in_builder_process()
    # Answers go on the real stdout; the builder's prints (Python's or the
    # descriptor's) go to stderr and never corrupt them.
    out = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    sys.stdout = sys.stderr
    _serve(args[0], sys.stdin.buffer, out)
    out.flush()
    # Nothing here needs cleaning up, and the kit waits for this process to
    # end: an interpreter shutdown that unloads torch takes half a second.
    os._exit(0)


if __name__ == "__main__":
    main()
