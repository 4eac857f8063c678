"""The focus of a vLLM-native builder follows the vendor's own code, not vLLM's.

A vLLM-native subclass of vLLM's ``DefaultKVCacheConfigBuilder`` answers as
vLLM does wherever it calls ``super()``, and vLLM's answers differ from
kvref's reference on some families (its documented defects, docs/vllm.md).
Learned against the reference, the focus spread over those families for
every vLLM-native builder, and a vendor whose code acts on one family got
three extra examples there instead of twenty: ``ScattersDraftsBuilder``'s
bug (it needs a drafter of two layers of one spec) went unseen at seed 2.
Its baseline is now its parent, vLLM's default (conformance/extensions/focus/answers.py).
"""

from __future__ import annotations

import pytest

pytest.importorskip("vllm.v1.core.kv_cache_planning")

from conformance import check_builder
from conformance.extensions.focus.answers import REFERENCE, Baseline
from conformance.harness.adapters import load_builder
from conformance.harness.builder_identity import parent_builder, vllm_default_builder
from kvref import ReferenceKVCacheConfigBuilder

pytestmark = pytest.mark.vllm

PKG = "tests.vllm.native_builders"
#: Three scenarios the focus learns from (grouping, placement, Core), cheaply.
SELECT = ["KV-GROUP-DRAFTS-TOGETHER", "KV-PLACE-NUM-BLOCKS", "KV-CORE-MEMORY"]


class TestBaseline:
    def test_kvref_builders_are_compared_with_the_reference(self) -> None:
        assert Baseline.of(None) is REFERENCE
        assert Baseline.of(ReferenceKVCacheConfigBuilder) is REFERENCE

    def test_a_vllm_native_builder_is_compared_with_vllms_default(self) -> None:
        parent = parent_builder(load_builder(f"{PKG}.drafts:ScattersDraftsBuilder"))
        assert parent is not None
        baseline = Baseline.of(parent)
        assert baseline is not REFERENCE
        default = vllm_default_builder()
        assert default is not None
        assert type(baseline.builder).native_cls is default.native_cls  # type: ignore[attr-defined]
        # vLLM refuses with its own errors; a refusal of both is the same answer.
        assert baseline.refusals == (Exception,)


#: The default families whose models may carry EAGLE draft layers.
DRAFT_CARRIERS = {"drafts", "hybrid", "full_sink", "full_rswa"}


# Where the focus goes is the focus extension's own logic (the builder's answers
# against its parent's, whatever vLLM runs both); ScattersDraftsBuilder's catch
# is proven under each release by tests/vllm/test_native_builders.py.
@pytest.mark.release_independent
class TestFocusOfNativeBuilders:
    def test_a_pass_through_builder_draws_no_focus(self) -> None:
        """``super()`` everywhere the kit goes: it never answers otherwise than vLLM's default.

        Against the reference it differed wherever vLLM does (pipeline
        projection, layer-outer strides) and drew a focus there.
        """
        report = check_builder(
            load_builder(f"{PKG}.hydra:HydraPassThroughBuilder"),
            select=SELECT,
            seed=2,
            reach=False,
        )
        assert not any("focus" in c for c in report.coverage.values()), report.coverage

    def test_the_focus_goes_where_the_vendor_code_acts(self) -> None:
        """Only families with draft layers get the extras, and the scattered drafter is found.

        The drafts family always has draft layers; the local/full hybrids
        rarely carry one or two EAGLE draft layers, where the builder acts too,
        and so do the families that redraw a hybrid's full-attention layers as
        vLLM's subclasses (``full_sink``, ``full_rswa``).
        """
        report = check_builder(
            load_builder(f"{PKG}.drafts:ScattersDraftsBuilder"),
            select=SELECT,
            # A seed whose first deals draw a two-layer drafter (the focus
            # learns only from answers that differ).
            seed=1,
            reach=False,
            shrink=False,
        )
        for scenario in ("grouping", "placement", "core"):
            focused = set(report.coverage[scenario].get("focus", {}))
            assert "drafts" in focused and focused <= DRAFT_CARRIERS, report.coverage
        (clause,) = [r for r in report.results if r.id == "KV-GROUP-DRAFTS-TOGETHER"]
        assert clause.status == "fail" and not clause.inherited, clause
