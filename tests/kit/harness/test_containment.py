"""Containment: hostile builders are reported as failures of the builder, never end the run.

Construction goes through the guard; ``--isolate`` runs hooks in a worker
process so ``os._exit``, segfaults, OOM kills and patched kit modules are
contained; ``SystemExit``/``KeyboardInterrupt`` from a hook is one call
failure; absurd sizes are reported by ``KV-PLACE-SIZE-BOUND`` and never reach
torch.  Whatever could end the test process itself runs in a subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import attrs
import broken_builders
import hostile_builders
import pytest
import torch
from kit_runs import quick_check
from subprocesses import kit_command, kit_env, run_captured

from conformance.check.bounds import MAX_BYTES, byte_count_problem, tensor_problems
from conformance.check.catalog import by_id
from conformance.cli import main
from conformance.extensions.device.checks import check_device
from conformance.harness.isolate import WorkerDiedError, isolated
from conformance.run.options import OptionError
from conformance.run.runner import check_builder
from kvref import PlanningConfig, ReferenceKVCacheConfigBuilder
from kvref.specs import FullAttentionSpec

# Whole kit runs: too costly for every CI submission (tox -e slow, pytest -m slow).
pytestmark = pytest.mark.slow


@pytest.fixture
def work() -> Iterator[Path]:
    """A private working directory (pytest's work may be pruned by concurrent sessions)."""
    with tempfile.TemporaryDirectory(prefix="kvref-containment-") as name:
        yield Path(name)


_PAPER = ["KV-CALL", "KV-GROUP", "KV-PLACE", "KV-HOST", "KV-CORE"]


def _cli(args: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``kvref-conformance`` in a fresh process (a crash there cannot end the tests)."""
    return run_captured(kit_command() + args, cwd=cwd, env=kit_env(), timeout=timeout)


def _specs(layers: int) -> dict[str, FullAttentionSpec]:
    spec = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=64, dtype=torch.bfloat16)
    return {f"model.layers.{i}.attn": spec for i in range(layers)}


# -- construction ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("builder", "says"),
    [
        ("NeedsArguments", "missing 1 required positional argument: 'device_name'"),
        ("ConstructorRaises", "RuntimeError: no licence server"),
        ("ConstructorHangs", "did not return within the deadline"),
    ],
)
def test_unconstructible_builder_is_a_usage_error(
    builder: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A builder that cannot be built with no arguments: exit 2 and one clear line, in time."""
    started = time.perf_counter()
    status = main([f"hostile_builders:{builder}", "--timeout", "0.5", "--no-database"])
    seconds = time.perf_counter() - started
    err = capsys.readouterr().err
    assert status == 2, err
    assert "cannot be constructed with no arguments" in err and says in err, err
    assert "Traceback" not in err
    # The hanging constructor costs about one deadline, not the hang.
    assert seconds < 30, seconds


@pytest.mark.parametrize("isolate", ["--isolate", "--no-isolate"])
def test_thread_left_by_the_builder_does_not_keep_the_cli_alive(isolate: str, work: Path) -> None:
    """A non-daemon thread started in __init__: the CLI reports, exits, and does not wait."""
    started = time.perf_counter()
    done = _cli(
        [
            "hostile_builders:LeavesThread",
            isolate,
            "--select",
            "KV-GROUP-PARTITION",
            "--max-examples",
            "3",
            "--seed",
            "1",
            "--no-database",
        ],
        work,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "KV-GROUP-PARTITION" in done.stdout
    assert time.perf_counter() - started < 240


# -- process-ending and kit-patching hooks, with and without --isolate --------------------


@pytest.mark.parametrize(
    ("builder", "code"),
    [("ExitsProcess", "exit code 3"), ("Segfaults", "exit code -11"), ("KilledByOOM", "-9")],
)
def test_isolate_reports_a_dying_worker_and_writes_the_report(
    builder: str, code: str, work: Path
) -> None:
    """os._exit, SIGSEGV and SIGKILL in a hook: KV-CALL-RAISES fails, the JSON is written."""
    out = work / "report.json"
    done = _cli(
        [
            f"hostile_builders:{builder}",
            "--isolate",
            "--select",
            "KV-CALL-RAISES,KV-GROUP-PARTITION",
            "--max-examples",
            "4",
            "--seed",
            "2",
            "--no-shrink",
            "--no-database",
            "--json",
            str(out),
        ],
        work,
    )
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    data = json.loads(out.read_text())
    statuses = {r["id"]: r for r in data["results"]}
    raises = statuses["KV-CALL-RAISES"]
    assert raises["status"] == "fail"
    message = raises["violations"][0]["message"]
    assert "worker process died" in message and code in message, message
    # The grouping never answered, so the partition could not be judged: never a pass.
    assert statuses["KV-GROUP-PARTITION"]["status"] == "inconclusive"
    assert "--isolate" in raises["reproduce"]


def test_without_isolation_os_exit_ends_the_run(work: Path) -> None:
    """The documented limit: in-process, os._exit cannot be contained (no report, its code)."""
    out = work / "report.json"
    done = _cli(
        [
            "hostile_builders:ExitsProcess",
            "--no-isolate",
            "--select",
            "KV-CALL-RAISES",
            "--max-examples",
            "2",
            "--no-database",
            "--json",
            str(out),
        ],
        work,
    )
    assert done.returncode == 3
    # What is left says so: the marker written at the start, never a verdict.
    left = json.loads(out.read_text())
    assert left["complete"] is False and left["ok"] is False and not left["results"]


@pytest.mark.parametrize("builder", ["PatchesCatalog", "PatchesCheck"])
def test_isolate_keeps_patches_in_the_worker(builder: str) -> None:
    """A hook that patches the kit's checks patches only the worker's copies."""
    before = {inv.id: inv.check for inv in by_id().values()}
    report = check_builder(
        getattr(hostile_builders, builder),
        select=["KV-GROUP-PARTITION"],
        max_examples=8,
        seed=3,
        timeout=5.0,
        shrink=False,
        isolate=True,
    )
    assert report.failed_ids == {"KV-GROUP-PARTITION"}
    assert {inv.id: inv.check for inv in by_id().values()} == before


def test_without_isolation_a_patch_forges_a_pass(work: Path) -> None:
    """The documented limit, in a subprocess: in-process, a patched check can forge a pass."""
    done = _cli(
        [
            "hostile_builders:PatchesCheck",
            "--no-isolate",
            "--select",
            "KV-GROUP-PARTITION",
            "--max-examples",
            "5",
            "--no-shrink",
            "--no-database",
        ],
        work,
    )
    assert done.returncode == 0, done.stdout[-2000:]


def test_isolated_worker_restarts_after_it_dies() -> None:
    """The call that killed the worker fails; the next call gets a fresh worker and works."""
    proxy = isolated(hostile_builders.DiesOnLargeModels)
    try:
        builder = proxy()
        config = PlanningConfig()
        with pytest.raises(WorkerDiedError, match="exit code 7"):
            builder.get_kv_cache_groups(config, _specs(3))
        groups = builder.get_kv_cache_groups(config, _specs(2))
        expected = ReferenceKVCacheConfigBuilder().get_kv_cache_groups(config, _specs(2))
        assert groups == expected
    finally:
        proxy.close()


def test_reach_never_waits_on_an_unanswering_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """Asking for reach at the end of a run (after Ctrl-C too) gives up on a silent worker."""
    import signal
    import threading

    import kvref.builder
    from conformance.harness import isolate

    monkeypatch.setattr(isolate, "_REACH_SECONDS", 0.5)
    proxy = isolated(ReferenceKVCacheConfigBuilder)
    worker = proxy._kvref_worker
    worker.reach_files = [kvref.builder.__file__]
    try:
        proxy()  # starts the worker
        pid = worker.process.pid
        # The worker's whole chain (confine.py: sentinel, init, server): alive,
        # idle, and never answers.
        os.killpg(pid, signal.SIGSTOP)
        done = threading.Event()
        asker = threading.Thread(target=lambda: (worker.reach_lines(), done.set()), daemon=True)
        asker.start()
        assert done.wait(20), "reach_lines waited on a worker that does not answer"
        assert worker.process is None  # let go: its late answer would answer the next request
        # The next builder gets a fresh worker.
        assert proxy().get_kv_cache_groups(PlanningConfig(), _specs(2))
    finally:
        proxy.close()


def test_isolated_spawned_worker_answers_like_the_builder() -> None:
    """Where fork is unavailable the worker is spawned and imports the builder by name."""
    proxy = isolated(
        ReferenceKVCacheConfigBuilder,
        "kvref:ReferenceKVCacheConfigBuilder",
        start_method="spawn",
    )
    try:
        config = PlanningConfig()
        groups = proxy().get_kv_cache_groups(config, _specs(2))
        reference = ReferenceKVCacheConfigBuilder()
        assert groups == reference.get_kv_cache_groups(config, _specs(2))
        placed = proxy().get_kv_cache_config_from_groups(config, groups, 5)
        assert placed == reference.get_kv_cache_config_from_groups(config, groups, 5)
    finally:
        proxy.close()


@pytest.mark.parametrize(
    "builder", [broken_builders.MutatesInput, broken_builders.MutatesGroupList]
)
def test_isolate_still_sees_in_place_mutation(builder: type) -> None:
    """Changes a hook makes to its arguments in the worker are seen by the purity checks."""
    report = check_builder(builder, select=_PAPER, max_examples=15, seed=11, isolate=True)
    assert report.failed_ids == {builder.CAUGHT_BY}


def test_isolated_reference_is_clean() -> None:
    """No false alarm: the reference passes the paper invariants in a worker process."""
    # A generous deadline: a fresh-clone CI run once saw one call pass the default
    # 10 s under load, and the deadline is not what this test is about.
    report = check_builder(
        ReferenceKVCacheConfigBuilder,
        select=_PAPER,
        max_examples=15,
        seed=4,
        isolate=True,
        timeout=60.0,
    )
    assert report.ok, [(r.id, r.status, r.violations, r.reason) for r in report.failures]


# -- SystemExit / KeyboardInterrupt -----------------------------------------------------


@pytest.mark.parametrize("isolate", [False, True], ids=["in-process", "isolated"])
@pytest.mark.parametrize("builder", ["RaisesSystemExit", "RaisesKeyboardInterrupt"])
def test_base_exceptions_are_one_call_failure(builder: str, isolate: bool) -> None:
    """Reported once, by KV-CALL-RAISES, never blamed on Core (KV-CORE-ERROR-TYPED)."""
    report = check_builder(
        getattr(hostile_builders, builder),
        select=_PAPER,
        max_examples=8,
        seed=5,
        shrink=False,
        isolate=isolate,
    )
    assert report.failed_ids == {"KV-CALL-RAISES"}, report.failed_ids
    raised = next(r for r in report.results if r.id == "KV-CALL-RAISES")
    name = "SystemExit" if builder == "RaisesSystemExit" else "KeyboardInterrupt"
    assert name in raised.violations[0].message
    statuses = {r.id: r.status for r in report.results}
    assert statuses["KV-CORE-ERROR-TYPED"] != "fail"
    assert not report.interrupted


# -- absurd sizes ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (0, None),
        (MAX_BYTES, None),
        (2**63, "past the 2**63 - 1 bytes"),
        (-1, "negative"),
        (True, "bool, not an int"),
        (4096.0, "float, not an int"),
        ("4096", "str, not an int"),
        (None, "NoneType, not an int"),
    ],
)
def test_byte_count_problem(value: object, problem: str | None) -> None:
    """Only ints in [0, 2**63) are byte counts an allocator can take."""
    found = byte_count_problem(value)
    assert found == problem if problem is None else (found is not None and problem in found)


@pytest.mark.parametrize("builder", hostile_builders.SIZED, ids=lambda b: b.__name__)
def test_absurd_sizes_are_reported_and_never_allocated(builder: type) -> None:
    """KV-PLACE-SIZE-BOUND names the size; the device checks are not judged, the run ends."""
    report = check_builder(
        builder,
        select=["KV-PLACE-SIZE-BOUND", "KV-PLACE-BACKING-SIZE", "KV-HOST", "KV-CORE", "KV-DEV"],
        max_examples=8,
        seed=6,
        shrink=False,
    )
    statuses = {r.id: r.status for r in report.results}
    assert "KV-PLACE-SIZE-BOUND" in report.failed_ids
    assert report.failed_ids <= {"KV-PLACE-SIZE-BOUND"}, report.failed_ids
    bound = next(r for r in report.results if r.id == "KV-PLACE-SIZE-BOUND")
    assert f"size {builder.SIZE!r}"[:20] in bound.violations[0].message
    assert all(s != "pass" for i, s in statuses.items() if i in ("KV-DEV-TAGS", "KV-DEV-VIEWS"))


@pytest.mark.parametrize("size", [2**63, 2**70, -4096, 4096.5, "4096"])
def test_check_device_refuses_unallocatable_configs(size: object) -> None:
    """check_device hands no such size to torch: every check says why it did not allocate."""
    config = ReferenceKVCacheConfigBuilder().get_kv_cache_config_from_groups(
        PlanningConfig(),
        ReferenceKVCacheConfigBuilder().get_kv_cache_groups(PlanningConfig(), _specs(2)),
        4,
    )
    tensor = attrs.evolve(config.kv_cache_tensors[0])
    object.__setattr__(tensor, "size", size)
    broken = attrs.evolve(config, kv_cache_tensors=[tensor, *config.kv_cache_tensors[1:]])
    assert tensor_problems(broken)
    for result in check_device(broken, "cpu"):
        assert result.violations and "not allocated" in result.violations[0].message
    assert not tensor_problems(config)


def test_a_hook_that_leaks_memory_meets_the_workers_limit() -> None:
    """Memory kept on every call: the worker's limit turns it into a reported MemoryError.

    The limit is made small here (``worker_memory``: 0.25 GiB over the
    worker's start).  The run ends, and the builder is failed by
    KV-CALL-RAISES with the limit named, instead of growing until the machine swaps.
    """
    report = quick_check(
        "hostile_builders:LeaksMemory",
        "KV-CALL-RAISES",
        examples=10,
        seed=1,
        shrink=False,
        isolate=True,  # the limit is the worker's
        worker_memory=0.25,
    )
    raised = report.result("KV-CALL-RAISES")
    assert raised.status == "fail", raised
    messages = [v.message for v in raised.violations]
    assert any("memory limit" in m and "256 MiB over" in m for m in messages), messages
    assert "--worker-memory 0.25" in (raised.reproduce or "")


@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), float("nan"), True, "16"])
def test_worker_memory_is_validated(bad: object) -> None:
    """A limit the worker cannot use is an OptionError naming the option and the value."""
    with pytest.raises(OptionError, match=f"worker_memory={bad!r}"):
        check_builder("hostile_builders:LeaksMemory", worker_memory=bad)  # type: ignore[arg-type]


class TestHoldsTheGIL:
    """A hook that never releases the GIL ends in a verdict or an exit, never a hang."""

    def test_isolated_it_is_a_timeout(self) -> None:
        """Isolated (the default): the kit waits on its worker's pipe, and the deadline fires."""
        report = check_builder(
            "hostile_builders:HoldsTheGIL",
            select=["KV-CALL-TIMEOUT"],
            max_examples=3,
            seed=1,
            timeout=1,
            shrink=False,
        )
        assert report.result("KV-CALL-TIMEOUT").status == "fail"

    def test_in_process_the_watchdog_ends_the_run(self, work: Path) -> None:
        """Not isolated: the watchdog prints the stacks and exits 1; the report stays incomplete."""
        report = work / "report.json"
        script = (
            "from conformance.harness import guard\n"
            "guard.WATCHDOG_GRACE = 2.0\n"
            "from conformance.cli import main\n"
            f"main(['hostile_builders:HoldsTheGIL', '--no-isolate', '--timeout', '1', "
            f"'--seed', '1', '--select', 'KV-CALL-TIMEOUT', '--no-database', "
            f"'--json', {str(report)!r}])\n"
        )
        done = run_captured([sys.executable, "-c", script], cwd=work, env=kit_env(), timeout=300)
        assert done.returncode == 1, (done.returncode, done.stderr[-2000:])
        assert "Timeout" in done.stderr and "attack" in done.stderr, done.stderr[-2000:]
        assert json.loads(report.read_text())["complete"] is False
