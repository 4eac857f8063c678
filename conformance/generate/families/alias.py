"""Models and problems that show vLLM 0.33.0's layer-outer block-ID alias.

See contract.md#memory-safety.
"""

from __future__ import annotations

from hypothesis import strategies as st

from conformance.check.geometry import cdiv, round_up
from conformance.generate.estimate import worker_estimate
from conformance.generate.records import Model, PlanningProblem
from conformance.generate.sampled_from_cache import pick
from conformance.generate.specs import ATTENTION, attention_kwargs
from kvref.config import PlanningConfig
from kvref.layout import KVCacheLayout
from kvref.specs import FullAttentionSpec, KVCacheSpec, SlidingWindowSpec

__all__ = ["vllm_p3_alias_models", "vllm_p3_alias_problems"]


@st.composite
def _vllm_p3_alias_models(draw: st.DrawFn) -> Model:
    kw = draw(attention_kwargs(block_size=None, max_page_bytes=2**16, edge=False))
    page = FullAttentionSpec(**kw).page_size_bytes
    choices = [64, 128, 256, 512, 576, 4096]
    full_alignment = pick(draw, choices)
    stride = round_up(page, full_alignment)
    others = [a for a in choices if round_up(page, a) != stride]
    # A multiple of 8 just above the full layers' stride always differs from it.
    local_alignment = pick(draw, others) if others else stride + 8
    full = FullAttentionSpec(**kw, block_stride_alignment=full_alignment)
    local = SlidingWindowSpec(**kw, block_stride_alignment=local_alignment, sliding_window=1024)
    repeats = draw(st.integers(1, 4))
    specs: dict[str, KVCacheSpec] = {
        ATTENTION.format(i): full if i % 3 == 0 else local for i in range(3 * repeats)
    }
    return Model(
        specs,
        f"aligned hybrid (contract.md#memory-safety): (F, S, S) x {repeats}, page {page}, "
        f"block strides "
        f"{stride} vs {round_up(page, local_alignment)} in layer-outer layouts",
    )


def vllm_p3_alias_models() -> st.SearchStrategy[Model]:
    """Models on which vLLM 0.33.0's layer-outer placement lets block IDs alias.

    See contract.md#memory-safety.

    Full and sliding-window layers with one page but different
    ``block_stride_alignment``, so ``round_up(page, alignment)`` differs
    across groups.  Only for demonstrating the defect: pair them with LBNHC or
    LBHNC (:func:`vllm_p3_alias_problems`); :func:`models` mixes them in as the
    ``aligned_hybrid`` family.
    """
    return _vllm_p3_alias_models()


@st.composite
def _vllm_p3_alias_problems(draw: st.DrawFn) -> PlanningProblem:
    model = draw(vllm_p3_alias_models())
    layout = pick(draw, [KVCacheLayout.LBNHC, KVCacheLayout.LBHNC])
    config = PlanningConfig(max_model_len=2048, kv_cache_layout=layout)
    page_sum, need = worker_estimate(model.specs, config)
    budget = (cdiv(need, page_sum) + 1) * page_sum * 4  # the estimate is a lower bound
    return PlanningProblem(config, [model.specs], [budget], model.description)


def vllm_p3_alias_problems() -> st.SearchStrategy[PlanningProblem]:
    """Single-worker problems of :func:`vllm_p3_alias_models` in LBNHC/LBHNC, with room to spare."""
    return _vllm_p3_alias_problems()
