"""The extension protocol: a run calls every extension's hooks, in phase order."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import attrs
import pytest
from kit_runs import quick_check

import conformance.run.runner as runner
from conformance.extensions.base import (
    Extension,
    Judged,
    RunView,
    after_deals,
    after_example,
    end,
    start_all,
)
from conformance.extensions.registry import extensions
from conformance.run.options import RunOptions
from conformance.run.runner import check_builder
from kvref import ReferenceKVCacheConfigBuilder

#: Hooks that read nothing of the run are called with this.
_NO_RUN = cast(RunView, object())


@attrs.frozen
class _Options:
    seed: int
    replays: int


def test_start_gives_each_extension_its_options_read_by_name() -> None:
    opts = RunOptions.create("b", seed=7, replays=3)
    with_options = Extension(name="a", options=_Options)
    without = Extension(name="b")
    left_out = Extension(name="c", start=lambda _run, _own: None)
    active = start_all([with_options, without, left_out], opts)
    assert [(a.extension.name, a.state) for a in active] == [
        ("a", _Options(seed=7, replays=3)),
        ("b", True),
    ]


def test_end_hooks_fill_the_report_in_phase_order() -> None:
    def appending(mark: str) -> Extension:
        return Extension(name=mark, end=lambda _state, _run, report: [*report, mark])

    active = start_all([appending("first"), appending("second"), Extension(name="none")], None)
    assert end(active, _NO_RUN, []) == ["first", "second"]


def test_hooks_are_optional() -> None:
    active = start_all([Extension(name="quiet")], None)
    judged = Judged(scenario="s", stratum=None, example=None, observation=None, first_deal=True)
    after_example(active, _NO_RUN, judged)
    after_deals(active, _NO_RUN)


def test_every_extension_option_is_a_run_option_with_its_default_and_flag() -> None:
    run_fields = attrs.fields_dict(RunOptions)
    declared = [(e, f) for e in extensions() if e.options for f in attrs.fields(e.options)]
    assert declared, "no extension declares an option"
    for ext, field in declared:
        assert field.name in run_fields, (ext.name, field.name)
        assert field.default == run_fields[field.name].default, (ext.name, field.name)
        assert field.metadata == run_fields[field.name].metadata, (ext.name, field.name)


def test_a_run_calls_the_hooks_at_their_phases(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, Any]] = []

    def record_example(state: list[str], run: RunView, judged: Judged) -> None:
        calls.append(("example", (judged.scenario, judged.first_deal, judged.example)))

    def record_end(state: list[str], run: RunView, report: Any) -> Any:
        calls.append(("end", report.builder))
        return attrs.evolve(report, builder="renamed by the extension")

    def record_start(run_options: RunOptions, _own: None) -> list[str]:
        calls.append(("start", run_options.seed))
        return ["state"]

    recorder = Extension(
        name="recorder",
        start=record_start,
        before_deals=lambda state, run: calls.append(("before deals", len(run.drawn))),
        before_example=lambda state, run, judged: calls.append(("before", judged.observation)),
        after_example=record_example,
        after_deals=lambda state, run: calls.append(("deals", sum(map(len, run.drawn.values())))),
        end=record_end,
    )
    monkeypatch.setattr(runner, "extensions", lambda: (*extensions(), recorder))
    report = quick_check(
        ReferenceKVCacheConfigBuilder, "KV-GROUP-NONEMPTY", examples=3, seed=5, focus="off"
    )
    kinds = [kind for kind, _ in calls]
    assert kinds[:2] == ["start", "before deals"] and calls[0][1] == 5 and calls[1][1] == 0
    assert kinds[-2:] == ["deals", "end"]
    # Each example: told before it is observed (no observation yet), then after.
    assert kinds[2:-2] == ["before", "example"] * ((len(kinds) - 4) // 2)
    assert all(what is None for kind, what in calls if kind == "before")
    examples = [what for kind, what in calls if kind == "example"]
    # Every judged example is told, in the first deal, and the deals' hook counts them all.
    assert examples and all(first for _, first, _ in examples)
    assert calls[-2][1] == len(examples)
    assert report.builder == "renamed by the extension"


def test_a_run_draws_its_own_models_from_the_extension_that_reads_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from hypothesis import strategies as st

    from conformance.extensions.vendor import VENDOR
    from conformance.run.options import OptionError

    spec = str(Path(__file__).resolve().parents[1] / "data" / "models" / "acme_hydra.json")
    asked: list[object] = []

    def read(given: object) -> st.SearchStrategy[Any]:
        asked.append(given)
        assert VENDOR.models is not None
        return cast(st.SearchStrategy[Any], VENDOR.models(given))

    reader = Extension(name="reader", start=lambda _run, _own: None, models=read)
    monkeypatch.setattr(runner, "extensions", lambda: (reader,))
    options = {"select": ["KV-GROUP-NONEMPTY"], "max_examples": 3, "seed": 5, "isolate": False}
    options |= {"reach": False, "database": None, "focus": "off", "models_only": True}
    report = check_builder(ReferenceKVCacheConfigBuilder, models=spec, **options)
    assert asked == [spec]
    assert set(report.coverage["grouping"]["families"]) == {"vendor"}
    # Models that no extension reads are refused before the run, never ignored.
    monkeypatch.setattr(runner, "extensions", lambda: ())
    with pytest.raises(OptionError, match="no extension of this kit reads models"):
        check_builder(ReferenceKVCacheConfigBuilder, models=spec, **options)
