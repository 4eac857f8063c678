"""The guard's call threads: reused, nested calls served, a hung call never waited on again."""

from __future__ import annotations

import gc
import threading

from conformance.harness.guard import Guard


def test_successive_calls_share_one_thread() -> None:
    """vLLM calls every hook from one thread; so does the guard, one call after another."""
    guard = Guard(timeout=60)
    seen = [guard.call("h", threading.get_ident).value for _ in range(5)]
    assert len(set(seen)) == 1
    assert seen[0] != threading.get_ident()


def test_a_call_made_inside_a_call_is_served() -> None:
    """Core's flow calls hooks from inside a guarded call: that must not wait on itself."""
    guard = Guard(timeout=60)

    def depth(n: int) -> int:
        if n == 0:
            return 0
        inner = guard.call("inner", depth, n - 1)
        assert inner.value is not None, inner
        return 1 + int(inner.value)

    result = guard.call("outer", depth, 3)
    assert result.value == 3
    assert not result.timed_out


def test_a_hung_call_stops_the_guard() -> None:
    """A call that never returns times out, and nothing is called after it."""
    guard = Guard(timeout=0.2)
    never = threading.Event()
    calls: list[int] = []
    first = guard.call("stuck", never.wait)
    assert first.timed_out and not first.not_called
    later = guard.call("later", lambda: calls.append(1))
    assert later.timed_out and later.not_called
    assert calls == []
    never.set()


def test_the_threads_end_with_their_guard() -> None:
    """A guard nobody keeps leaves no idle thread behind."""
    # Thread objects, not idents: an ident is reused once its thread has
    # ended, so a thread that ends meanwhile could hide the guard's new one.
    before = set(threading.enumerate())
    guard = Guard(timeout=60)
    guard.call("h", int)
    started = [t for t in threading.enumerate() if t not in before]
    assert [t.name for t in started] == ["kvref-guard"]
    del guard
    gc.collect()
    started[0].join(60)
    assert not started[0].is_alive()


def test_calls_after_renew_run_on_threads_started_after_it() -> None:
    """Tracing started mid-run (reach, in process) covers only threads started after it."""
    import sys

    guard = Guard(timeout=60)
    guard.call("preflight", int)  # starts the guard's first thread, untraced

    def tracer(*_args: object) -> None:
        return None

    threading.settrace(tracer)  # what coverage.py does for the threads to come
    try:
        reused = guard.call("before renew", sys.gettrace).value
        guard.renew_threads()
        renewed = guard.call("after renew", sys.gettrace).value
    finally:
        threading.settrace(None)  # type: ignore[arg-type]
    assert reused is None
    assert renewed is tracer
