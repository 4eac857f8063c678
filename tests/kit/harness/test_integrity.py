"""The kit's process imports no code changed after a builder's code started (integrity.py)."""

from __future__ import annotations

import importlib
import importlib.util
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from kit_runs import quick_check

from conformance.harness import integrity
from conformance.harness.integrity import ChangedCodeError, guarded, mark
from conformance.run import runner

TESTS = Path(__file__).resolve().parents[2]


@pytest.fixture
def module_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def _name() -> str:
    return f"kvref_probe_{uuid.uuid4().hex}"


def _write(directory: Path, name: str, value: str) -> Path:
    path = directory / f"{name}.py"
    path.write_text(f"VALUE = {value!r}\n", encoding="utf-8")
    importlib.invalidate_caches()
    return path


def _pyc(source: str, filename: str, mtime: float, size: int) -> bytes:
    """``source`` compiled as the timestamped bytecode the import system reads."""
    external: Any = importlib._bootstrap_external  # type: ignore[attr-defined]
    pyc: bytes = external._code_to_timestamp_pyc(compile(source, filename, "exec"), mtime, size)
    return pyc


def _small_run(builder: str, *select: str, **options: Any) -> Any:
    """A run of ``builder`` (``module:Class``) on six examples, isolated unless ``options`` say."""
    return quick_check(builder, *select, examples=6, seed=1, **{"isolate": True, **options})


def test_a_module_unchanged_since_the_mark_imports(module_dir: Path) -> None:
    name = _name()
    _write(module_dir, name, "before")
    with guarded(mark()):
        assert importlib.import_module(name).VALUE == "before"


def test_a_module_changed_after_the_mark_is_refused(module_dir: Path) -> None:
    name = _name()
    _write(module_dir, name, "before")
    since = mark()
    path = _write(module_dir, name, "after")
    with guarded(since), pytest.raises(ChangedCodeError) as caught:
        importlib.import_module(name)
    assert name in str(caught.value) and str(path) in str(caught.value)
    assert caught.value.where == "code integrity"
    assert name not in sys.modules


def test_the_check_ends_with_its_block(module_dir: Path) -> None:
    """A caller's process (check_builder, the plugin) is guarded only while a run lasts."""
    name = _name()
    since = mark()
    _write(module_dir, name, "after")
    with guarded(since):
        pass
    assert not any(isinstance(f, integrity._Unchanged) for f in sys.meta_path)
    assert importlib.import_module(name).VALUE == "after"


def test_nested_blocks_keep_one_finder_with_the_earliest_mark(module_dir: Path) -> None:
    name = _name()
    early = mark()
    _write(module_dir, name, "after")
    with guarded(mark()), guarded(early):
        assert sum(isinstance(f, integrity._Unchanged) for f in sys.meta_path) == 1
        with pytest.raises(ChangedCodeError):
            importlib.import_module(name)


def test_bytecode_written_after_the_mark_is_not_read(module_dir: Path) -> None:
    """Forged bytecode that matches the source's stamp loses to the source itself."""
    name = _name()
    source = _write(module_dir, name, "source")
    since = mark()
    cached = Path(importlib.util.cache_from_source(str(source)))
    cached.parent.mkdir(exist_ok=True)
    stat = source.stat()
    cached.write_bytes(
        _pyc("VALUE = 'forged bytecode'\n", str(source), stat.st_mtime, stat.st_size)
    )
    with guarded(since):
        assert importlib.import_module(name).VALUE == "source"


def test_a_bytecode_only_module_written_after_the_mark_is_refused(module_dir: Path) -> None:
    """A module that is only bytecode (no source beside it) is checked as its own origin."""
    name = _name()
    since = mark()
    (module_dir / f"{name}.pyc").write_bytes(_pyc("VALUE = 'forged'\n", f"{name}.py", 0, 0))
    importlib.invalidate_caches()
    with guarded(since), pytest.raises(ChangedCodeError):
        importlib.import_module(name)


def _tampered_module(
    module_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[str, Path, list[BaseException | str]]:
    """A module the builder's side is told to rewrite, and what the kit's report step sees of it.

    The report step imports the module lazily, after the builder's code ran
    (in its worker or its models child): ``seen`` holds its ``VALUE`` or the
    ``ChangedCodeError`` that refused it.
    """
    name = _name()
    target = _write(module_dir, name, "original")
    monkeypatch.setenv("KVREF_TAMPER_FILE", str(target))
    monkeypatch.setenv("KVREF_FORGE_MARKER", str(module_dir / "forged.txt"))
    monkeypatch.syspath_prepend(str(TESTS))
    seen: list[BaseException | str] = []
    report_of = runner.run_report

    def report(run: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            seen.append(importlib.import_module(name).VALUE)
        except ChangedCodeError as exc:
            seen.append(exc)
        return report_of(run, *args, **kwargs)

    # The driver writes the report through this name (conformance.run.judging.run_report).
    monkeypatch.setattr(runner, "run_report", report)
    return name, target, seen


def test_a_builder_that_rewrites_a_module_cannot_run_it_in_the_kit(
    module_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its worker rewrites a module the kit's process imports during the run: refused there."""
    name, target, seen = _tampered_module(module_dir, monkeypatch)
    result = _small_run("forgers.tampers:TampersLazyModule", "KV-PLACE-BACKING-SIZE")
    assert "forge('tampered module')" in target.read_text()  # the worker did rewrite it
    assert len(seen) == 1 and isinstance(seen[0], ChangedCodeError), seen
    assert name not in sys.modules
    assert not (module_dir / "forged.txt").exists()
    assert "KV-PLACE-BACKING-SIZE" in result.failed_ids


def test_a_models_module_that_rewrites_a_module_cannot_run_it_in_the_kit(
    module_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The models child runs vendor code before the worker starts: the check counts from it."""
    _, target, seen = _tampered_module(module_dir, monkeypatch)
    result = _small_run(
        "forgers:ShortBacking", "KV-PLACE-BACKING-SIZE", models="forgers.tampers:MODELS"
    )
    assert "forge('tampered module')" in target.read_text()  # the models child rewrote it
    assert len(seen) == 1 and isinstance(seen[0], ChangedCodeError), seen
    assert not (module_dir / "forged.txt").exists()
    assert "KV-PLACE-BACKING-SIZE" in result.failed_ids


def test_a_builder_may_import_modules_it_writes_in_its_worker() -> None:
    """The check guards the kit's process only; the worker forked from it drops it."""
    report = _small_run(
        "integrity_builders:CompilesAModule", "KV-CALL-RAISES", "KV-GROUP-PARTITION"
    )
    assert report.ok, [(r.id, r.violations) for r in report.failures]


def test_a_kit_error_raised_by_a_kvref_native_builder_is_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No kit code runs inside its hooks: the error is KV-CALL-RAISES, not the kit's failure.

    In its worker and in the twin process that KV-GROUP-HASH-STABLE asks (the
    twin reported it as the kit's error: exit 2, no verdict).
    """
    monkeypatch.syspath_prepend(str(TESTS))
    report = _small_run(
        "forgers.kit_errors:RaisesKitError", "KV-CALL-RAISES", "KV-GROUP-HASH-STABLE"
    )
    raises = report.result("KV-CALL-RAISES")
    assert raises.status == "fail", raises
    assert any("KitError" in str(v) for v in raises.violations), raises.violations
    # Run in this process (no worker), the guard tells its hook from the kit's code too.
    here = _small_run("forgers.kit_errors:RaisesKitError", "KV-CALL-RAISES", isolate=False)
    assert here.result("KV-CALL-RAISES").status == "fail"
