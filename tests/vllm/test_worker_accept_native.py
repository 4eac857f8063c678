"""The KV-WORKER-* invariants on vLLM-native builders (subclasses of vLLM's default builder).

Under the installed vLLM (a vLLM-native builder runs vLLM's own code, so
only that release can judge it): vLLM's own default placement is accepted
by its worker in every layout; each builder of
tests/vllm/native_builders/worker_rules.py fails the invariant meant for it
where the installed release has the rule and is not judged by it where it
has not; the legal native builders fail nothing but what their release's
worker refuses.  The kvref-native forms are tests/kit/check/test_worker_accept.py's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
import pytest
from drawn import drawn_examples
from specs import MIXED_LAYERS as _MIXED
from specs import UNIFORM_LAYERS as _UNIFORM
from specs import WIDE as _WIDE

# tests/ is on sys.path during a full run, and tests/vllm then looks like a
# namespace package called "vllm": ask for a real vLLM module.
pytest.importorskip("vllm.v1.core.kv_cache_planning")


from conformance.check.catalog import Unjudged, by_id
from conformance.harness.adapters import load_builder
from conformance.run.runner import check_builder
from conformance.scenarios.examples import Example
from conformance.scenarios.placement import observe_placement
from conformance.scenarios.registry import observe_in
from kvref import PlanningConfig, SlidingWindowSpec
from kvref.specs import KVCacheSpec
from kvref.versions import installed_vllm_version
from tests.vllm._native import native_context
from tests.vllm.native_builders import worker_rules

pytestmark = pytest.mark.vllm

#: The catalog's KV-WORKER-* invariants, in catalog order.
WORKER = tuple(i for i in by_id() if i.startswith("KV-WORKER-"))
LAYOUTS = ("LBNHC", "LBHNC", "BLHNC", "BLNHC", "BHLNC", "LHBNC")
DEFAULT = "vllm.v1.core.kv_cache_planning:DefaultKVCacheConfigBuilder"
PKG = "tests.vllm.native_builders"


def release() -> str:
    """The installed vLLM, the only release a vLLM-native builder is judged under."""
    found = installed_vllm_version()
    assert found is not None, "a supported vLLM is installed"
    return str(found)


def judge(invariant: str, obs: Any) -> Any:
    """The catalog's verdict of ``invariant`` on ``obs``."""
    return by_id()[invariant].check(obs)


def observe(qualname: str, layout: str, specs: Mapping[str, KVCacheSpec]) -> Any:
    """The placement scenario's observation of a native builder on one model."""
    config = PlanningConfig(kv_cache_layout=layout, max_model_len=256, vllm_version=release())
    return observe_placement(native_context(qualname), config, dict(specs), 8)


#: Each broken twin, a model and layouts where its change shows.
_CASES = (
    (worker_rules.SeparateSizesBuilder, _UNIFORM, ("LBNHC", "LBHNC")),
    (worker_rules.LeadingScratchBuilder, _UNIFORM, ("LBNHC", "LBHNC")),
    (worker_rules.ScratchGapBuilder, _UNIFORM, ("LBNHC",)),
    (worker_rules.PerLayerPoolsBuilder, _MIXED, ("BLHNC", "BLNHC")),
    (worker_rules.TrailingScratchBuilder, _UNIFORM, ("BLHNC", "BHLNC")),
    (worker_rules.ShiftedHeadsBuilder, _UNIFORM, ("LHBNC",)),
)


@pytest.mark.parametrize(
    ("builder", "specs", "layouts"), _CASES, ids=[c[0].__name__ for c in _CASES]
)
def test_broken_twin_caught_where_its_release_has_the_rule(
    builder: Any, specs: Mapping[str, KVCacheSpec], layouts: tuple[str, ...]
) -> None:
    """The meant invariant fails under a release with the rule, naming vLLM; else N/A."""
    qualname = f"{PKG}.worker_rules:{builder.__name__}"
    for layout in layouts:
        obs = observe(qualname, layout, specs)
        outcome = judge(builder.CAUGHT_BY, obs)
        if release() in builder.RELEASES:
            assert isinstance(outcome, list) and outcome, (layout, outcome)
            assert f"vLLM {release()}" in str(outcome[0])
        else:
            assert isinstance(outcome, Unjudged) and not outcome.applicable, outcome
            assert release() in outcome.reason
        # Nothing else of the worker's rules sees it (its plan is the default's otherwise).
        others = [i for i in WORKER if i != builder.CAUGHT_BY]
        assert not [i for i in others if isinstance(judge(i, obs), list) and judge(i, obs)], layout


@pytest.fixture(scope="module")
def drawn() -> list[Example]:
    """Placement examples of the default generation, planned as the installed release."""
    return [
        attrs.evolve(ex, config=attrs.evolve(ex.config, vllm_version=release()))
        for ex in drawn_examples(12)
    ]


def _sliding(window: int) -> SlidingWindowSpec:
    return SlidingWindowSpec(
        block_size=16, num_kv_heads=2, head_size=64, dtype="bfloat16", sliding_window=window
    )


#: Hand-made models and the layouts vLLM resolves for them: one page in every
#: layout; two pages only block-compact; two groups of one page.
_MODELS: tuple[tuple[Mapping[str, KVCacheSpec], tuple[str, ...]], ...] = (
    (_UNIFORM, LAYOUTS),
    (_MIXED, ("LBNHC", "LBHNC", "BLHNC", "BLNHC")),
    (
        {f"model.layers.{i}.self_attn.attn": _WIDE if i % 2 else _sliding(64) for i in range(4)},
        LAYOUTS,
    ),
)


def test_vllm_default_is_accepted_in_every_layout(drawn: list[Example]) -> None:
    """vLLM's own placement fails no KV-WORKER-* invariant, in each of the six layouts.

    On the drawn examples (each in the layout the kit resolved for it) and on
    hand-made models in every layout vLLM resolves for them; every layout is
    judged by the worker's rules of the installed release.
    """
    ctx = native_context(DEFAULT)
    judged: dict[str, set[str]] = {layout: set() for layout in LAYOUTS}
    observations = [observe_in(ctx, "placement", ex) for ex in drawn]
    observations += [
        observe(DEFAULT, layout, specs) for specs, layouts in _MODELS for layout in layouts
    ]
    for obs in observations:
        for inv in WORKER:
            outcome = judge(inv, obs)
            assert not (isinstance(outcome, list) and outcome), (obs.layout, outcome)
            if isinstance(outcome, list):
                judged[obs.layout.name].add(inv)
    for layout in LAYOUTS:
        expected = {"KV-WORKER-ONE-BACKING"}
        if release() != "0.33.0":
            outer = layout in ("LBNHC", "LBHNC")
            expected |= {
                "KV-WORKER-LAYER-REGIONS" if outer else "KV-WORKER-BLOCK-SEGMENTS",
                "KV-WORKER-COMMITTED",
                "KV-WORKER-POOL-BYTES",
            }
        assert expected <= judged[layout], (layout, judged)


#: Legal native builders that differ from vLLM's default where the worker's rules look.
_LEGAL = (
    "padded:Padded4KiBBuilder",
    "descriptors:DescriptorChunksBuilder",
    "alignment:DmaAlignedGroupsBuilder",
    "kernel_views:OneLayerTensorsBuilder",
    "drafts:ScattersTargetsBuilder",
)


@pytest.mark.parametrize("name", _LEGAL)
def test_legal_native_builders_fail_only_what_their_release_refuses(
    name: str, drawn: list[Example]
) -> None:
    """A legal native builder fails no KV-WORKER-* invariant but its release's expected ones."""
    qualname = f"{PKG}.{name}"
    native: Any = load_builder(qualname)
    expected: Mapping[str, frozenset[str]] = getattr(native.native_cls, "WORKER_REFUSED", {})
    ctx = native_context(qualname)
    failed: set[str] = set()
    for ex in drawn:
        obs = observe_in(ctx, "placement", ex)
        failed |= {i for i in WORKER if isinstance(judge(i, obs), list) and judge(i, obs)}
    assert failed <= expected.get(release(), frozenset()), failed


def test_padded_builder_expected_failure_is_real() -> None:
    """Padded4KiBBuilder's padding after LBNHC's regions: the probe and the segments differ."""
    obs = observe(f"{PKG}.padded:Padded4KiBBuilder", "LBNHC", _MIXED)
    outcome = judge("KV-WORKER-POOL-BYTES", obs)
    if release() == "0.33.0":
        assert isinstance(outcome, Unjudged) and not outcome.applicable
    else:
        assert isinstance(outcome, list) and outcome and "one-block probe" in str(outcome[0])


def test_whole_kit_judges_the_installed_release() -> None:
    """One lean run: LeadingScratchBuilder fails KV-WORKER-LAYER-REGIONS under 0.34.0 only."""
    report = check_builder(
        load_builder(f"{PKG}.worker_rules:LeadingScratchBuilder"),
        select=["KV-WORKER"],
        max_examples=8,
        seed=3,
        shrink=False,
        reach=False,
    )
    status = {r.id: r.status for r in report.results}
    assert report.contract == f"vLLM {release()}"
    if release() == "0.33.0":
        assert status["KV-WORKER-LAYER-REGIONS"] == "not-applicable", status
        assert not report.failed_ids, status
    else:
        assert status["KV-WORKER-LAYER-REGIONS"] == "fail", status
        assert set(report.failed_ids) == {"KV-WORKER-LAYER-REGIONS"}, status
