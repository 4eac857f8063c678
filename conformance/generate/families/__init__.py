"""Model families: :func:`models` draws from all of them (the default run's models).

Each family lives in a module of this package with a docstring naming the
real models it stands for: the generic shapes (:mod:`.classic`), fixed
real-size presets (:mod:`.presets`), sparse-MLA layouts with several caches
per decoder layer (:mod:`.sparse_mla`), linear-attention and state-space
hybrids (:mod:`.linear`), draft layers (:mod:`.drafts`) and the models that
show vLLM's block-ID alias (:mod:`.alias`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs
from hypothesis import strategies as st

from conformance.generate.families import (
    classic,
    declared,
    drafts,
    hidden_state,
    hisparse,
    linear,
    sparse_mla,
    subclasses,
)
from conformance.generate.families.alias import vllm_p3_alias_models
from conformance.generate.families.presets import realistic_models
from conformance.generate.hf import draw_hf_description
from conformance.generate.records import Model

__all__ = [
    "DEFAULT_FAMILIES",
    "FAMILIES",
    "HISPARSE_FAMILIES",
    "SPECIALISED",
    "family_strategy",
    "models",
]

#: Every family by name: ``name -> factory(max_layers=...)``.
FAMILIES: dict[str, Callable[..., st.SearchStrategy[Model]]] = {
    **classic.FAMILIES,
    "aligned_hybrid": lambda max_layers=64: vllm_p3_alias_models(),
    **sparse_mla.FAMILIES,
    **linear.FAMILIES,
    **drafts.FAMILIES,
    **hidden_state.FAMILIES,
    **hisparse.FAMILIES,
    **declared.FAMILIES,
    **subclasses.FAMILIES,
    "realistic": realistic_models,
}
#: The families of the default run: all but the fixed presets, which are
#: opt-in because a sampled preset is a shorter choice sequence than any
#: generated model, so Hypothesis would shrink towards a 62-layer preset.
DEFAULT_FAMILIES: tuple[str, ...] = tuple(f for f in FAMILIES if f != "realistic")


#: Families whose models turn HiSparse on (host residency as vLLM keeps it).
HISPARSE_FAMILIES: frozenset[str] = frozenset(hisparse.FAMILIES)

#: Families whose models are long and specialised; see :func:`family_strategy`.
SPECIALISED: frozenset[str] = frozenset(
    {
        *sparse_mla.FAMILIES,
        *linear.FAMILIES,
        *drafts.FAMILIES,
        *hidden_state.FAMILIES,
        *hisparse.FAMILIES,
        *declared.FAMILIES,
        *subclasses.FAMILIES,
        "realistic",
    }
)
# Hypothesis shrinks by the length of the choice sequence first.  A 1-layer
# DeepSeek-V4 model (five caches) takes fewer choices than a 2-layer uniform
# one, so without a floor counterexamples would shrink into the specialised
# families; this many extra (ignored) choices keep them longer than the
# generic minimum.
_CHOICE_FLOOR = 16


def _tag(family: str, model: Model) -> Model:
    description = model.description
    if not description.startswith(f"{family}:"):
        description = f"{family}: {description}"
    return attrs.evolve(model, description=description, family=family)


def family_strategy(name: str, *, max_layers: int = 64) -> st.SearchStrategy[Model]:
    """The models of family ``name``, tagged with it (``family`` and a ``name:`` description).

    The :data:`SPECIALISED` families draw a fixed number of extra choices
    first, so that shrinking prefers a generic model that shows the same
    failure.

    Raises:
        ValueError: ``name`` is not a family.
    """
    factory = FAMILIES.get(name)
    if factory is None:
        known = ", ".join(FAMILIES)
        raise ValueError(f"models(families=...): unknown family {name!r} (known: {known})")
    strategy = factory(max_layers=max_layers)
    if name in SPECIALISED:
        floor = st.lists(st.integers(0, 1), min_size=_CHOICE_FLOOR, max_size=_CHOICE_FLOOR)
        strategy = st.tuples(floor, strategy).map(lambda pair: pair[1])
    return _described(strategy, name)


@st.composite
def _described(draw: st.DrawFn, strategy: st.SearchStrategy[Model], family: str) -> Model:
    """A model of ``strategy`` tagged with ``family``, with the Hugging Face fields vLLM would show.

    Drawn in place rather than through a strategy made for each model
    (a flatmap), which Hypothesis would validate and label afresh.
    """
    model = _tag(family, draw(strategy))
    hf = draw_hf_description(draw, family, model.specs)
    return attrs.evolve(model, hf_config=hf) if hf else model


def models(
    *, max_layers: int = 64, families: Sequence[str] | None = None
) -> st.SearchStrategy[Model]:
    """Generate whole models from the families named in ``families``, uniform first.

    The default is :data:`DEFAULT_FAMILIES`: the generic shapes
    (``uniform``, ``hybrid``, ``mla``, ``mamba_hybrid``, ``cross_attention``,
    ``attention_free``, ``mixed_pages``, ``circular_buffer``,
    ``aligned_hybrid``), the shapes real vendor builders specialise on
    (``deepseek_v4``, ``deepseek_v32``, ``glm5``, ``qwen3_next``,
    ``nemotron_h``, ``jamba``) and ``drafts``, hidden-state extraction
    (``hidden_state``, ``hidden_state_mla``: MLA targets), HiSparse, a
    model-declared grouping, and vLLM's subclasses of full attention
    (``full_sink``, ``full_rswa``); ``realistic`` (fixed presets) is
    opt-in.  Each example picks a family with equal chance.  Layer names
    look like vLLM's (``model.layers.{i}.self_attn.attn``).  Never two specs
    of one state kind with different pages within a generic family;
    hidden-state layers only in ``hidden_state`` and ``hidden_state_mla``,
    HiSparse only in
    ``hisparse`` and model-declared grouping only in ``declared_grouping``.

    Raises:
        ValueError: ``families`` names an unknown family.

    """
    names = list(DEFAULT_FAMILIES if families is None else families)
    return st.one_of([family_strategy(name, max_layers=max_layers) for name in names])
