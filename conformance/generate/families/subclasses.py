"""Models whose full-attention layers are one of vLLM's subclasses of ``FullAttentionSpec``.

A platform gate written as ``isinstance(spec, FullAttentionSpec)`` opens on
every subclass vLLM defines, and each plans differently where it counts:
``SinkFullAttentionSpec`` (static attention sinks, ``sink_len`` tokens a
request keeps) and ``RSWASpec`` (a restricted sliding window whose gap
blocks are evicted while decoding).  This family draws a model of the
generic families that draw full attention (``uniform``, ``hybrid``) and
makes every full-attention layer of it one such subclass, with the same
geometry (``full_sink``, ``full_rswa``: a family, and so a stratum of
every default run, each); the MLA subclass of full attention and its
hidden-state subclass are drawn by ``mla``, the sparse-MLA families and
``hidden_state_mla``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import attrs
from hypothesis import strategies as st

from conformance.generate.families.classic import hybrid_models, uniform_models
from conformance.generate.records import Model
from conformance.generate.sampled_from_cache import pick
from kvref.specs import FullAttentionSpec, KVCacheSpec, RSWASpec, SinkFullAttentionSpec

__all__ = ["full_rswa_models", "full_sink_models"]

#: Sink lengths (static sinks of a few tokens, or a block's worth) and R-SWA windows.
_SINK_LENS = (4, 128)
_RSWA_WINDOWS = (1024, 4096, 128)


@functools.lru_cache(maxsize=8)
def _bases(max_layers: int) -> st.SearchStrategy[Model]:
    # Built once per size: a strategy made per draw is validated and labelled afresh.
    return st.one_of(uniform_models(max_layers=max_layers), hybrid_models(max_layers=max_layers))


def _geometry(spec: FullAttentionSpec) -> dict[str, Any]:
    """The constructor fields of ``spec`` that full attention defines."""
    return {f.name: getattr(spec, f.name) for f in attrs.fields(FullAttentionSpec) if f.init}


@st.composite
def _full_subclass_models(draw: st.DrawFn, max_layers: int, kind: str) -> Model:
    base = draw(_bases(max_layers).filter(_has_full_attention))
    extra: dict[str, Any]
    if kind == "sink":
        cls: type[FullAttentionSpec] = SinkFullAttentionSpec
        extra = {"sink_len": pick(draw, list(_SINK_LENS))}
    else:
        cls, extra = RSWASpec, {"rswa_window": pick(draw, list(_RSWA_WINDOWS))}
    specs: dict[str, KVCacheSpec] = {
        name: cls(**_geometry(spec), **extra) if type(spec) is FullAttentionSpec else spec
        for name, spec in base.specs.items()
    }
    note = ", ".join(f"{k}={v}" for k, v in extra.items())
    return attrs.evolve(
        base,
        specs=specs,
        description=f"{base.description}; full attention as {cls.__name__}({note})",
    )


def _has_full_attention(model: Model) -> bool:
    return any(type(s) is FullAttentionSpec for s in model.specs.values())


def full_sink_models(*, max_layers: int = 64) -> st.SearchStrategy[Model]:
    """A uniform or hybrid model whose full-attention layers are ``SinkFullAttentionSpec``.

    Sinks of 4 or 128 tokens; every other field as the layer drew it.
    """
    return _full_subclass_models(max_layers, "sink")


def full_rswa_models(*, max_layers: int = 64) -> st.SearchStrategy[Model]:
    """A uniform or hybrid model whose full-attention layers are ``RSWASpec``.

    Windows of 1024, 4096 or 128 tokens; every other field as the layer drew it.
    """
    return _full_subclass_models(max_layers, "rswa")


#: One family per subclass, so that the deal (a stratum each) draws both at every seed.
FAMILIES: dict[str, Callable[..., st.SearchStrategy[Model]]] = {
    "full_sink": full_sink_models,
    "full_rswa": full_rswa_models,
}
