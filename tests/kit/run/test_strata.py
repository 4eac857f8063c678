"""How each scenario's examples are dealt over the model families (conformance/run/strata.py)."""

from __future__ import annotations

import attrs
import pytest
from hypothesis import strategies as st

from conformance.generate.coverage import family_of
from conformance.generate.families import DEFAULT_FAMILIES
from conformance.run.runner import check_builder
from conformance.run.strata import VENDOR_SHARE, Stratum, deal, draw, draw_examples, run_strata
from kvref import ReferenceKVCacheConfigBuilder

BUILTIN = run_strata(None, only=False)


def _counts(dealt: list[tuple[Stratum, int]]) -> dict[str, int]:
    return {s.name: n for s, n in dealt}


class TestDeal:
    """The deal: every family once when the count allows, the rest mixed."""

    @pytest.mark.parametrize("total", [1, 5, len(DEFAULT_FAMILIES), 50, 500])
    def test_sums_to_the_example_count(self, total: int) -> None:
        """Every example is dealt exactly once, none twice."""
        counts = _counts(deal(BUILTIN, total, seed=3, scenario="placement"))
        assert sum(counts.values()) == total
        assert all(n > 0 for n in counts.values())

    def test_equal_shares(self) -> None:
        """Fifty examples over the families: each gets the same count, give or take one."""
        counts = _counts(deal(BUILTIN, 50, seed=1, scenario="grouping"))
        assert set(counts) == set(DEFAULT_FAMILIES)
        base = 50 // len(DEFAULT_FAMILIES)
        assert set(counts.values()) <= {base, base + 1}

    def test_fewer_examples_than_families_rotate_with_the_seed(self) -> None:
        """Five examples go to five families; over seeds every family gets its turn."""
        seen: set[str] = set()
        for seed in range(40):
            counts = _counts(deal(BUILTIN, 5, seed=seed, scenario="core"))
            assert sum(counts.values()) == 5 and set(counts.values()) == {1}
            seen |= set(counts)
        assert seen == set(DEFAULT_FAMILIES)

    def test_the_deal_is_a_function_of_seed_and_scenario(self) -> None:
        """A reproduce line (same seed, same count) gets the same deal."""
        first = _counts(deal(BUILTIN, 7, seed=12, scenario="host"))
        assert first == _counts(deal(BUILTIN, 7, seed=12, scenario="host"))

    def test_vendor_models_get_their_share_first(self) -> None:
        """Mixed in, the vendor's models get half the examples before the families."""
        vendor = st.just(None)  # the deal never draws: any strategy stands in
        strata = run_strata(vendor, only=False)  # type: ignore[arg-type]
        counts = _counts(deal(strata, 40, seed=1, scenario="placement"))
        assert counts["vendor"] == int(40 * VENDOR_SHARE)
        assert sum(counts.values()) == 40
        counts = _counts(deal(strata, 1, seed=1, scenario="placement"))
        assert counts == {"vendor": 1}

    def test_vendor_models_alone(self) -> None:
        """``--models-only`` draws every example from the vendor's models."""
        vendor = st.just(None)
        strata = run_strata(vendor, only=True)  # type: ignore[arg-type]
        assert [s.name for s in strata] == ["vendor"]
        assert _counts(deal(strata, 9, seed=1, scenario="core")) == {"vendor": 9}


class TestDrawn:
    """What the strata draw."""

    def test_every_family_at_every_seed(self) -> None:
        """One family count's worth of examples meets every default family, whatever the seed."""
        for seed in (1, 2):
            drawn = draw_examples("grouping", seed, len(DEFAULT_FAMILIES))
            families = {family_of(ex.description) for ex in drawn}
            assert families == set(DEFAULT_FAMILIES), seed

    def test_a_family_with_no_valid_example_is_named(self) -> None:
        """A stratum that can draw no valid example is named, not counted as examples."""
        attention_free = [attrs.evolve(s, not_in=frozenset()) for s in BUILTIN]
        attention_free = [s for s in attention_free if s.name == "attention_free"]
        drawn: list[object] = []
        empty = draw("host", attention_free, 1, 1, "ci", lambda _s, ex, _f: drawn.append(ex))
        assert empty == ["attention_free"] and not drawn

    def test_families_that_cannot_serve_a_scenario_get_no_examples(self) -> None:
        """An attention-free model has nothing to keep on the host: its share goes elsewhere."""
        counts = _counts(deal(BUILTIN, 50, seed=1, scenario="host"))
        assert "attention_free" not in counts and sum(counts.values()) == 50

    def test_run_reports_every_family(self) -> None:
        """The report's coverage shows every family the scenario can use."""
        report = check_builder(
            ReferenceKVCacheConfigBuilder,
            select=["KV-HOST-DEVICE-SAFE"],
            max_examples=len(DEFAULT_FAMILIES),
            seed=5,
        )
        host = report.coverage["host"]
        assert "no_valid_examples" not in host
        assert set(host["families"]) == set(DEFAULT_FAMILIES) - {"attention_free"}
        assert report.ok, report.failures


class TestLean:
    """A family's first deal covers block-outermost layouts and the others."""

    @pytest.mark.parametrize("seed", [1, 2, 3])
    def test_both_layout_classes_in_every_two_example_family(self, seed: int) -> None:
        """With two or more examples, a family that allows both classes draws both."""
        from conformance.generate.layouts import allowed_layouts

        drawn: dict[str, list[bool]] = {}
        allows: dict[str, set[bool]] = {}

        def note(stratum: Stratum, ex: object, _first: bool) -> None:
            config = ex.config  # type: ignore[attr-defined]
            drawn.setdefault(stratum.name, []).append(config.kv_cache_layout.is_block_outermost)
            classes = {lay.is_block_outermost for lay in allowed_layouts(ex.merged)}  # type: ignore[attr-defined]
            if config.hisparse is not None:
                classes = {True}  # HiSparse needs block-outermost layouts
            allows.setdefault(stratum.name, set()).update(classes)

        draw("placement", BUILTIN, 2 * len(DEFAULT_FAMILIES), seed, "ci", note)
        both = [name for name, classes in allows.items() if classes == {True, False}]
        assert both, allows
        for name in both:
            assert set(drawn[name]) == {True, False}, (name, drawn[name])

    def test_an_interrupt_hypothesis_masks_is_still_an_interrupt(self) -> None:
        """Hypothesis may raise its own error while handling Ctrl-C: the run still stops as one."""
        from conformance.run.interrupts import masked_interrupt as _interrupted

        try:
            try:
                raise KeyboardInterrupt
            except KeyboardInterrupt:
                raise AssertionError("state._runner is not None") from None
        except AssertionError as masked:
            assert _interrupted(masked)
        assert not _interrupted(ValueError("a real error"))


class TestGatedPairs:
    """A default run pairs the families with the engine paths vendors gate on, at every seed."""

    @pytest.mark.parametrize("seed", [1, 2, 3])
    def test_default_placement_draws_every_gated_pair(self, seed: int) -> None:
        """Hidden-state extraction on an MLA target on a block-outermost layout, a uniform-type
        group whose block size is not the engine's, and each subclass of full attention."""
        from kvref.extra_specs import HiddenStateCacheSpec
        from kvref.specs import (
            FullAttentionSpec,
            MLAAttentionSpec,
            RSWASpec,
            SinkFullAttentionSpec,
            UniformTypeKVCacheSpecs,
        )

        seen: set[str] = set()
        for ex in draw_examples("placement", seed, 50):
            specs = list(ex.merged.values())
            outer = ex.config.kv_cache_layout.is_block_outermost
            hidden = [s for s in specs if isinstance(s, HiddenStateCacheSpec)]
            # Several states a token: a page that is not one latent head's.
            several = any(s.num_kv_heads > 1 for s in hidden)
            if outer and several and all(isinstance(s, MLAAttentionSpec) for s in specs):
                seen.add("hidden-state on MLA")
            groups = ReferenceKVCacheConfigBuilder().get_kv_cache_groups(ex.config, ex.merged)
            # The kit's vLLM configs keep vLLM's default cache block size, 16.
            if outer and any(
                isinstance(g.kv_cache_spec, UniformTypeKVCacheSpecs)
                and g.kv_cache_spec.block_size != 16
                for g in groups
            ):
                seen.add("uniform-type group off the engine's block size")
            for cls in (RSWASpec, SinkFullAttentionSpec):
                if any(type(s) is cls for s in specs) and issubclass(cls, FullAttentionSpec):
                    seen.add(cls.__name__)
        assert seen == {
            "hidden-state on MLA",
            "uniform-type group off the engine's block size",
            "RSWASpec",
            "SinkFullAttentionSpec",
        }, seen
