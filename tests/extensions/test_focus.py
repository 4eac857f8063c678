"""Focus (conformance/extensions/focus/): more examples where the builder's answers differ."""

from __future__ import annotations

import functools
from typing import Any

import attrs
import pytest
from drawn import drawn_examples
from hypothesis import given
from hypothesis import strategies as st
from kit_runs import quick_check

from conformance.cli import main
from conformance.extensions.focus.answers import FOCUS_SHARE, answers_differ
from conformance.generate.engine_paths import engine_path, parse, spell
from conformance.generate.limits import HOST_OUTSIDE_HISPARSE, Limits
from conformance.harness.guard import Guard
from conformance.harness.hooks import Context, make_factory
from conformance.run.options import OptionError, RunOptions
from conformance.run.strata import Stratum, draw_pinned, run_strata
from conformance.scenarios.examples import Example
from conformance.scenarios.registry import observe_in
from kvref import ReferenceKVCacheConfigBuilder
from kvref.config import PlanningConfig
from kvref.layout import KVCacheLayout
from kvref.records import KVCacheGroupSpec
from kvref.specs import KVCacheSpec
from tests import legal_builders

FAMILIES = [s.name for s in run_strata(None, only=False)]
#: A kvref-native DeepSeek-V4 builder: it acts on DeepSeek-V4 alone.
DSV4 = "vendor_builders.deepseek_v4:DeepSeekV4Builder"
#: Its twin with the MTP slot bug, failing KV-PLACE-NO-LAYER-OVERLAP on DeepSeek-V4.
MTP_BUG = "vendor_builders.deepseek_v4_mtp_bug:DeepSeekV4MTPSlotBugBuilder"


def _observe(builder: Any, scenario: str, example: Example) -> Any:
    guard = Guard(10.0)
    return observe_in(Context(factory=make_factory(builder, guard), guard=guard), scenario, example)


class OneGroupPerLayer(ReferenceKVCacheConfigBuilder):
    """A legal grouping unlike the reference's wherever a model has two layers of one spec."""

    def get_kv_cache_groups(
        self, config: PlanningConfig, kv_cache_spec: Any
    ) -> list[KVCacheGroupSpec]:
        groups = super().get_kv_cache_groups(config, kv_cache_spec)
        return [
            attrs.evolve(group, layer_names=(name,))
            for group in groups
            for name in group.layer_names
        ]


class TestAnswersDiffer:
    """The signal: the builder's answer against the reference's on one observation."""

    @pytest.mark.parametrize("scenario", ["grouping", "placement", "host", "core", "profiling"])
    def test_the_reference_never_differs_from_itself(self, scenario: str) -> None:
        for ex in drawn_examples(6):
            if scenario == "host" and not ex.config.host_resident_layers:
                continue
            assert answers_differ(_observe(ReferenceKVCacheConfigBuilder, scenario, ex)) is False

    def test_another_legal_placement_differs(self) -> None:
        """SplitTensors gives every layer its own tensor: not the reference's answer."""
        found = [
            answers_differ(_observe(legal_builders.SplitTensors, "placement", ex))
            # Pipeline stages often hold one layer per group, where one tensor
            # per layer is the reference's answer too: enough examples for some
            # with several.
            for ex in drawn_examples(30)
        ]
        assert any(found)

    def test_another_grouping_differs_where_it_groups_otherwise(self) -> None:
        for ex in drawn_examples(6):
            specs: dict[str, KVCacheSpec] = ex.merged
            groups = ReferenceKVCacheConfigBuilder().get_kv_cache_groups(ex.config, specs)
            other = any(len(g.layer_names) > 1 for g in groups)
            assert answers_differ(_observe(OneGroupPerLayer, "grouping", ex)) is other

    def test_the_profiling_path_differs_where_the_builder_acts(self) -> None:
        """Each worker's grouping and placement on the profiling path count, as elsewhere."""
        # The profiling path groups each worker's own layers: the builder acts
        # where a worker's grouping puts two layers together, which the whole
        # model's grouping does not tell (vLLM's hybrid grouping cuts a worker
        # holding one sliding-window layer into one-layer groups).
        acted = 0
        for ex in drawn_examples(12):
            reference = ReferenceKVCacheConfigBuilder()
            other = any(
                len(g.layer_names) > 1
                for worker in ex.workers
                for g in reference.get_kv_cache_groups(ex.config, dict(worker))
            )
            acted += other
            assert answers_differ(_observe(OneGroupPerLayer, "profiling", ex)) is other, ex
        assert acted, "no example's worker groups two layers together"
        found = [
            answers_differ(_observe(legal_builders.SplitTensors, "profiling", ex))
            for ex in drawn_examples(30)
        ]
        assert any(found)

    def test_serving_has_no_signal(self) -> None:
        assert answers_differ(object()) is None


class TestFocusRuns:
    """Where the extra examples go, and that they keep the engine paths."""

    def test_the_reference_draws_no_focus(self) -> None:
        report = quick_check(
            ReferenceKVCacheConfigBuilder,
            "KV-PLACE-NUM-BLOCKS",
            "KV-CORE-MEMORY",
            seed=3,
            examples=20,
            isolate=True,
        )
        assert not any("focus" in c for c in report.coverage.values()), report.coverage

    def test_a_family_builder_draws_its_family(self) -> None:
        """A kvref-native DeepSeek-V4 builder acts on DeepSeek-V4 alone, and gets the extras."""
        report = quick_check(DSV4, "KV-PLACE-NUM-BLOCKS", seed=1, isolate=True)
        extra = report.coverage["placement"]["focus"]
        assert set(extra) == {"deepseek_v4"}, report.coverage["placement"]
        assert sum(extra.values()) == int(50 * FOCUS_SHARE)
        # The first deal gave the family its equal share; the focus adds to it.
        assert report.coverage["placement"]["families"]["deepseek_v4"] > extra["deepseek_v4"]

    def test_the_extras_keep_the_pinned_paths(self) -> None:
        strata = [s for s in run_strata(None, only=False) if s.name in ("glm5", "hybrid")]
        path = engine_path(PlanningConfig(kv_cache_layout=KVCacheLayout.BLHNC))
        pins = {"glm5": frozenset({path})}
        seen: list[tuple[Stratum, Example]] = []
        extra = draw_pinned(
            "placement",
            strata,
            int(20 * FOCUS_SHARE),
            4,
            "ci",
            lambda s, ex, first: seen.append((s, ex)),
            pins,
            label="placement/focus",
        )
        assert extra == [("glm5", int(20 * FOCUS_SHARE))]
        assert seen and all(s.name == "glm5" for s, _ in seen)
        assert all(engine_path(ex.config) in pins["glm5"] for _, ex in seen)

    def test_a_family_that_cannot_serve_the_scenario_gets_no_extras(self) -> None:
        """A vLLM-native run's host focus goes to HiSparse alone, never to a family it excludes.

        The focus once dealt its host examples to every focused family, so a
        family that could draw no valid host example rejected draws by the
        thousand (most of a vLLM-native run's time) and judged nothing.
        """
        limits = Limits(frozenset({HOST_OUTSIDE_HISPARSE}))
        strata = [
            s
            for s in run_strata(None, only=False, limits=limits)
            if s.name in ("hisparse", "hybrid")
        ]
        assert [s.name for s in strata if "host" in s.not_in] == ["hybrid"]
        pins = {s.name: frozenset({("BLNHC", False, s.name == "hisparse")}) for s in strata}
        seen: list[str] = []
        extra = draw_pinned(
            "host",
            strata,
            int(20 * FOCUS_SHARE),
            1,
            "ci",
            lambda s, ex, first: seen.append(s.name),
            pins,
            label="host/focus",
        )
        assert extra == [("hisparse", int(20 * FOCUS_SHARE))]
        assert seen and set(seen) == {"hisparse"}

    def test_the_reproduce_line_names_the_focus_and_replays_it(self) -> None:
        """A run of the failing invariant alone, with the line's --focus, fails it again."""
        run = functools.partial(
            quick_check, MTP_BUG, "KV-PLACE-NO-LAYER-OVERLAP", seed=1, shrink=False, isolate=True
        )
        report = run()
        (result,) = report.results
        assert result.status == "fail", result
        assert "--focus deepseek_v4=" in (result.reproduce or ""), result.reproduce
        focus = result.reproduce.split("--focus ")[1].split(" ")[0].strip("'")
        again = run(focus=focus)
        assert again.results[0].status == "fail"
        assert again.coverage == report.coverage


class TestSpelling:
    """``--focus`` values: what reproduce lines write, and what a user may mistype."""

    @given(
        st.dictionaries(
            st.sampled_from(FAMILIES),
            st.frozensets(
                st.tuples(
                    st.sampled_from([m.name for m in KVCacheLayout]),
                    st.booleans(),
                    st.booleans(),
                ),
                min_size=1,
            ),
            min_size=1,
        )
    )
    def test_spell_and_parse_round_trip(self, pins: dict[str, frozenset[Any]]) -> None:
        assert parse(spell(pins), FAMILIES) == pins

    @pytest.mark.parametrize(
        ("value", "named"),
        [
            ("nosuch=BLNHC", "'nosuch'"),
            ("glm5=XYZ", "'XYZ'"),
            ("glm5=BLNHC/fast", "'fast'"),
            ("glm5", "'glm5'"),
            (";", "names no family"),
        ],
    )
    def test_a_bad_value_is_refused_naming_it(self, value: str, named: str) -> None:
        with pytest.raises(OptionError, match="focus=") as caught:
            RunOptions(builder=None, seed=1, focus=value).validate(capabilities=())
        assert named in str(caught.value)

    def test_off_draws_nothing(self) -> None:
        assert RunOptions(builder=None, seed=1, focus="off").focus_pins() == {}
        assert RunOptions(builder=None, seed=1).focus_pins() is None

    def test_the_cli_refuses_a_bad_focus_before_running(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        assert main(["--focus", "glm5=XYZ", "--seed", "1", "--no-database"]) == 2
        assert "--focus 'glm5=XYZ': focus path 'XYZ' of glm5" in capsys.readouterr().err


def test_off_keeps_the_first_deal_alone() -> None:
    """``focus='off'``: the run draws exactly its examples per scenario."""
    report = quick_check(
        DSV4, "KV-PLACE-NUM-BLOCKS", seed=1, examples=20, focus="off", isolate=True
    )
    placement = report.coverage["placement"]
    assert "focus" not in placement
    assert sum(placement["families"].values()) == 20
    assert attrs.has(type(report))
