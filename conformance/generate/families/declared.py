"""Models that own their KV cache grouping (vLLM's ``SupportsKVCacheGrouping``).

vLLM 0.33.0 lets a model replace the default grouping by implementing the
experimental ``SupportsKVCacheGrouping`` protocol; its default builder
honours the declaration before grouping itself, and Core still owns
placement and admission.  No in-tree model implements it yet; the family
stands for out-of-tree ports of local/full hybrids (Gemma-3, gpt-oss,
Llama-4) and uniform models (Llama-3, DeepSeek-V3) that keep each kind of
layer in block tables of a bounded size
(:class:`~conformance.generate.families.extras.RunsOfKindGrouping`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from hypothesis import strategies as st

from conformance.generate.families.classic import hybrid_models, uniform_models
from conformance.generate.families.extras import ExtendedModel, ModelExtras, RunsOfKindGrouping
from conformance.generate.records import Model
from kvref.specs import MambaSpec

__all__ = ["declared_grouping_models"]


@functools.lru_cache(maxsize=8)
def _bases(max_layers: int) -> tuple[st.SearchStrategy[Model], st.SearchStrategy[Model]]:
    # Built once per size: a strategy made per draw is validated and labelled afresh.
    hybrid = hybrid_models(max_layers=max_layers)
    return st.one_of(hybrid, uniform_models(max_layers=12)), hybrid


@st.composite
def _declared(draw: st.DrawFn, max_layers: int) -> Model:
    either, hybrid = _bases(max_layers)
    base = draw(either)
    if any(isinstance(s, MambaSpec) for s in base.specs.values()):
        # Mamba states are one per request: their grouping is not the model's to bound.
        base = draw(hybrid)
    size = draw(st.integers(1, 8))
    return ExtendedModel(
        base.specs,
        f"{base.description}; the model declares its grouping (runs of at most {size})",
        num_hidden_layers=base.num_hidden_layers,
        extras=ModelExtras(kv_cache_grouping=RunsOfKindGrouping(max_layers=size)),
    )


def declared_grouping_models(*, max_layers: int = 64) -> st.SearchStrategy[Model]:
    """Local/full hybrids or small uniform models declaring runs-of-kind grouping (1-8 layers)."""
    return _declared(max_layers)


FAMILIES: dict[str, Callable[..., st.SearchStrategy[Model]]] = {
    "declared_grouping": declared_grouping_models
}
