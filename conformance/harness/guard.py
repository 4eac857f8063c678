"""Calls into untrusted builders: exceptions, wrong types and hangs become data.

The kit runs code it does not trust.  Every call into a builder goes through
:class:`Guard`, which runs it on a daemon thread with a deadline, catches
every exception and checks the type of what comes back.  A builder that hangs
once is not called again (its thread cannot be killed), so the kit never hangs.

One thread runs all of a guard's calls, one after the other, as vLLM calls
every hook from one thread; a run makes thousands of calls, and a thread
started for each cost about 0.4 s of the default run.
"""

from __future__ import annotations

import copy
import faulthandler
import pickle
import queue
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from conformance.check.observations import CallResult
from conformance.errors import BuilderKitError, KitError
from conformance.harness import native_input_changes

__all__ = [
    "Guard",
    "clear_interrupt",
    "deep_copies",
    "deep_copy",
    "fresh_lists",
    "groups_key",
    "note_interrupt",
    "raise_if_interrupted",
    "snapshot_differs",
]

# Python drops an exception raised in a gc callback or a __del__ (it only prints
# "Exception ignored in ..."), and Hypothesis keeps a gc callback: a Ctrl-C whose
# handler ran there was lost and the run went on.  The CLI's handler also sets
# this flag, and the kit raises the interrupt again at its next call into the
# builder.
_INTERRUPTED = threading.Event()


def note_interrupt() -> None:
    """Remember a Ctrl-C (the CLI's SIGINT handler calls it before raising)."""
    _INTERRUPTED.set()


def clear_interrupt() -> None:
    """Forget a Ctrl-C that was handled (the run stopped and keeps what it found)."""
    _INTERRUPTED.clear()


def raise_if_interrupted() -> None:
    """Raise ``KeyboardInterrupt`` once for a Ctrl-C that no handler has seen yet.

    Raises:
        KeyboardInterrupt: :func:`note_interrupt` ran since the last
            :func:`clear_interrupt`.
    """
    if _INTERRUPTED.is_set():
        _INTERRUPTED.clear()
        raise KeyboardInterrupt


_Job = tuple[Callable[[], None], threading.Event] | None


class _Caller:
    """The threads a guard's calls run on: started as needed, reused once idle.

    A call made from inside a call (Core's flow calls the hooks) finds the
    first thread busy and gets another; a thread whose call hung is never
    handed a call again.  The threads end with the guard (:meth:`close`).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: list[queue.SimpleQueue[_Job]] = []
        self._every: list[queue.SimpleQueue[_Job]] = []

    def submit(self, run: Callable[[], None]) -> threading.Event:
        done = threading.Event()
        with self._lock:
            jobs = self._idle.pop() if self._idle else None
            if jobs is None:
                jobs = queue.SimpleQueue()
                self._every.append(jobs)
                threading.Thread(
                    target=self._serve, args=(jobs,), name="kvref-guard", daemon=True
                ).start()
        jobs.put((run, done))
        return done

    def _serve(self, jobs: queue.SimpleQueue[_Job]) -> None:
        # ``run`` catches everything the call raises itself.
        while (job := jobs.get()) is not None:
            run, done = job
            try:
                run()
            finally:
                with self._lock:
                    self._idle.append(jobs)
                done.set()

    def retire_idle(self) -> None:
        """End the idle threads: the next calls run on threads started from now on."""
        with self._lock:
            for jobs in self._idle:
                jobs.put(None)
                self._every.remove(jobs)
            self._idle.clear()

    def close(self) -> None:
        with self._lock:
            for jobs in self._every:
                jobs.put(None)


#: How long past a call's deadline the in-process watchdog waits before it ends the process.
WATCHDOG_GRACE = 30.0


class Guard:
    """Runs builder hooks with a per-call deadline and captures every failure.

    Args:
        timeout: the per-call deadline in seconds.
        watchdog: the hooks run in this process (no isolation).  A hook that
            holds the GIL (a C call that never releases it) keeps the
            deadline's own thread from running, so a watchdog outside the
            interpreter (:func:`faulthandler.dump_traceback_later`) prints every
            thread's stack and ends the process with exit 1 once the deadline
            plus :data:`WATCHDOG_GRACE` (or the deadline again, if longer) has
            passed.  The report files were marked incomplete at the start, so
            nothing reads as a verdict.  Isolated runs need no watchdog: the
            kit waits on its worker's pipe, which holds no GIL of the builder's.
    """

    def __init__(self, timeout: float = 10.0, *, watchdog: bool = False) -> None:
        self.timeout = timeout
        self.watchdog = watchdog
        self.hung: str | None = None
        self.calls = 0
        self._caller = _Caller()
        # The threads hold the caller, not the guard: a guard nobody keeps ends them.
        weakref.finalize(self, self._caller.close)

    def renew_threads(self) -> None:
        """Run later calls on threads started after this (an idle one is not reused).

        Tracing that begins now (reach, in process) covers threads started
        after it only: a thread that ran the preflight would go untraced.
        """
        self._caller.retire_idle()

    def call(
        self,
        hook: str,
        fn: Callable[..., Any],
        *args: Any,
        expect: type | tuple[type, ...] | None = None,
        validate: Callable[[Any], str | None] | None = None,
        timeout: float | None = None,
    ) -> CallResult:
        """Call ``fn(*args)`` and describe what happened.

        Args:
            hook: the hook's name, for messages.
            fn: the bound hook.
            args: its arguments (the caller passes copies it can compare later).
            expect: the type the result must have.
            validate: a further check of the result; returns what is wrong, or ``None``.
            timeout: this call's deadline, when it is not the guard's per-call one.
        """
        raise_if_interrupted()
        if self.hung is not None:
            return CallResult(hook=hook, timed_out=True, not_called=True)
        self.calls += 1
        box: dict[str, Any] = {}
        native_input_changes.drain()  # what an earlier, abandoned call recorded is not this call's

        def run() -> None:
            try:
                box["value"] = fn(*args)
            except BaseException as exc:
                box["error"] = exc
                box["tb"] = "".join(traceback.format_exception(exc)[-3:])

        start = time.perf_counter()
        deadline = self.timeout if timeout is None else timeout
        if self.watchdog:
            faulthandler.dump_traceback_later(deadline + max(WATCHDOG_GRACE, deadline), exit=True)
        try:
            finished = self._caller.submit(run).wait(deadline)
        finally:
            if self.watchdog:
                faulthandler.cancel_dump_traceback_later()
        seconds = time.perf_counter() - start
        raise_if_interrupted()
        if not finished:
            self.hung = hook
            return CallResult(hook=hook, timed_out=True, seconds=seconds)
        changed = native_input_changes.drain()
        if "error" in box:
            exc = box["error"]
            if isinstance(exc, KitError):
                if _through_kit_code(fn):
                    # The kit's own code failed inside the call (the vLLM adapter
                    # converting the kit's input): no verdict on the builder.
                    raise exc
                # Only the builder's code ran inside: the kit's error class is its own.
                exc = BuilderKitError.of(exc)
            return CallResult(
                hook=hook,
                error=f"{type(exc).__name__}: {exc}",
                error_type=type(exc),
                traceback=box.get("tb"),
                seconds=seconds,
                input_changes=changed,
            )
        value = box.get("value")
        problem = None
        if expect is not None and not isinstance(value, expect):
            problem = f"{type(value).__name__} ({value!r:.80})"
        elif validate is not None:
            problem = validate(value)
        if problem is not None:
            return CallResult(hook=hook, wrong_type=problem, seconds=seconds, input_changes=changed)
        return CallResult(hook=hook, value=value, seconds=seconds, input_changes=changed)


#: The kit's own code around a builder's hooks, by module and class: the isolated
#: proxy (its worker reports kit errors) and the vLLM adapter (its conversions).
_KIT_WRAPPERS = (
    ("conformance.harness.isolate", "IsolatedBuilder"),
    ("conformance.harness.vllm_adapter", "VLLMBuilderAdapter"),
)


def _through_kit_code(fn: Callable[..., Any]) -> bool:
    """Whether calling ``fn`` (a bound hook, or a class to construct) runs kit code around it."""
    owner = fn if isinstance(fn, type) else getattr(fn, "__self__", None)
    cls = owner if isinstance(owner, type) else type(owner)
    # A class of a module not imported has no instance to be called through.
    wrappers = tuple(
        getattr(sys.modules[module], name)
        for module, name in _KIT_WRAPPERS
        if module in sys.modules
    )
    return issubclass(cls, wrappers)


def snapshot_differs(before: Any, after: Any) -> bool:
    """Whether ``after`` differs from the deep copy ``before`` taken before a call."""
    try:
        return bool(before != after)
    except Exception:
        return True


def deep_copies(value: Any, count: int) -> list[Any]:
    """``count`` independent deep copies of ``value`` (see :func:`deep_copy`), pickled once."""
    try:
        blob = pickle.dumps(value, pickle.HIGHEST_PROTOCOL)
        return [pickle.loads(blob) for _ in range(count)]
    except Exception:
        return [copy.deepcopy(value) for _ in range(count)]


def fresh_lists(items: Sequence[Any], count: int) -> list[list[Any]]:
    """``count`` lists, each holding its own deep copy of every item (no object shared).

    Each item is pickled once for all its copies; the copies of two items
    share nothing, even where the items did.
    """
    copies = [deep_copies(item, count) for item in items]
    return [[c[k] for c in copies] for k in range(count)]


def groups_key(groups: Sequence[Any]) -> tuple[tuple[str, ...], ...]:
    """Groups as their layer names, in order: what a hook was asked about, as a dict key.

    Works for kvref's and vLLM's group records alike.
    """
    return tuple(tuple(g.layer_names) for g in groups)


def deep_copy(value: Any) -> Any:
    """A deep copy of the kit's inputs to a builder, sharing preserved as ``copy.deepcopy`` does.

    A pickle round trip copies the spec and group records about twice as fast
    as ``copy.deepcopy``; what does not pickle (a class defined in a function)
    is deep-copied.
    """
    try:
        return pickle.loads(pickle.dumps(value, pickle.HIGHEST_PROTOCOL))
    except Exception:
        return copy.deepcopy(value)
