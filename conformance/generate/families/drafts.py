"""Speculative-decoding draft layers: EAGLE, EAGLE-3 and MTP heads on common targets.

vLLM plans a draft model's KV cache layers with the target's (the draft's
specs carry ``is_draft``); its layers continue the target's numbering
(EAGLE's ``start_layer_id``, DeepSeek's MTP at ``num_hidden_layers``).

:func:`speculation` says which speculative config serves a model: the one a
:class:`SpeculativeModel` declares, else one inferred from its layers.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import torch
from hypothesis import strategies as st

from conformance.generate.records import Model
from conformance.generate.sampled_from_cache import pick
from conformance.generate.specs import ATTENTION
from kvref.config import SPECULATIVE_METHODS
from kvref.extra_specs import HiddenStateCacheSpec
from kvref.specs import (
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
)

__all__ = ["Speculation", "SpeculativeModel", "draft_models", "speculation"]

# The first integer component of a layer name is its decoder-layer index.
_INDEX = re.compile(r"^(.*?)(\d+)(?=\.|$)")


def _method(inst: object, attribute: attrs.Attribute[str], value: object) -> None:
    if value not in SPECULATIVE_METHODS:
        raise ValueError(
            f"SpeculativeModel.speculative_method={value!r} must be one of {SPECULATIVE_METHODS}"
        )


def _tokens(inst: object, attribute: attrs.Attribute[int], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"SpeculativeModel.num_speculative_tokens={value!r} must be an int >= 1")


@attrs.frozen(repr=False)
class SpeculativeModel(Model):
    """A :class:`~conformance.generate.records.Model` that says how it is speculated.

    Attributes:
        speculative_method: vLLM's ``SpeculativeConfig.method`` (``mtp``, ``eagle``, ...).
        num_speculative_tokens: vLLM's ``num_speculative_tokens`` (>= 1).
    """

    speculative_method: str = attrs.field(kw_only=True, validator=_method)
    num_speculative_tokens: int = attrs.field(kw_only=True, validator=_tokens)


@attrs.frozen
class Speculation:
    """The speculative config a model is served with (see :func:`speculation`).

    Attributes:
        method: vLLM's method, ``None`` without speculative decoding.
        num_draft_layers: the draft's decoder layers (MTP modules, EAGLE heads).
        num_speculative_tokens: 0 without a method.
    """

    method: str | None
    num_draft_layers: int
    num_speculative_tokens: int


def _draft_layer_count(specs: Mapping[str, KVCacheSpec]) -> int:
    """Draft decoder layers: the distinct ``prefix + index`` of ``is_draft`` layers.

    A draft decoder layer can own several caches (``model.layers.7.attn`` and
    ``model.layers.7.attn.indexer.k_cache``); a name without an index counts alone.
    """
    keys = set()
    for name, spec in specs.items():
        if spec.is_draft:
            match = _INDEX.match(name)
            keys.add(match[0] if match is not None else name)
    return len(keys)


def _declared(model: object) -> tuple[str, int] | None:
    """``(method, tokens)`` a model declares: a :class:`SpeculativeModel`, or any model with both.

    Vendor models that also bring planning settings declare theirs on
    another class (``conformance.extensions.vendor.deployment.DeployedModel``).
    """
    if not isinstance(model, Model):
        return None
    method = getattr(model, "speculative_method", None)
    tokens = getattr(model, "num_speculative_tokens", None)
    if isinstance(method, str) and isinstance(tokens, int):
        return method, tokens
    return None


def speculation(model: Model | Mapping[str, KVCacheSpec]) -> Speculation:
    """How ``model`` is speculated: as a model declares it (:func:`_declared`), else inferred.

    Inferred from the layers: draft (``is_draft``) layers are MTP modules when
    a draft name says ``mtp`` or a draft layer is MLA (an MTP module repeats
    the target's decoder layer, and EAGLE heads are Llama-style attention),
    else an EAGLE head; a ``HiddenStateCacheSpec`` layer is vLLM's
    ``extract_hidden_states``.  Speculative tokens: the Mamba layers'
    ``num_speculative_blocks`` (vLLM sizes them by it), else one per draft
    layer (at least one).
    """
    specs = model.specs if isinstance(model, Model) else model
    drafts = _draft_layer_count(specs)
    declared = _declared(model)
    if declared is not None:
        return Speculation(declared[0], drafts, declared[1])
    blocks = [s.num_speculative_blocks for s in specs.values() if isinstance(s, MambaSpec)]
    tokens = max([*blocks, drafts, 1])
    draft_specs = {n: s for n, s in specs.items() if s.is_draft}
    if draft_specs:
        mtp = any("mtp" in n for n in draft_specs) or any(
            isinstance(s, MLAAttentionSpec) for s in draft_specs.values()
        )
        return Speculation("mtp" if mtp else "eagle", drafts, tokens)
    if any(isinstance(s, HiddenStateCacheSpec) for s in specs.values()):
        return Speculation("extract_hidden_states", 0, 1)
    return Speculation(None, 0, 0)


_TARGETS = ("llama", "gpt_oss", "deepseek_v3")


def _target(kind: str, layers: int, dtype: torch.dtype) -> tuple[dict[str, KVCacheSpec], Any]:
    """The target's layers and the spec a same-geometry draft layer copies."""
    if kind == "deepseek_v3":
        mla = MLAAttentionSpec(
            block_size=64, num_kv_heads=1, max_tp_shards=1, head_size=576, dtype=dtype
        )
        return {ATTENTION.format(i): mla for i in range(layers)}, mla
    heads, head_size = (8, 128) if kind == "llama" else (8, 64)
    full = FullAttentionSpec(block_size=16, num_kv_heads=heads, head_size=head_size, dtype=dtype)
    if kind == "llama":
        return {ATTENTION.format(i): full for i in range(layers)}, full
    window = SlidingWindowSpec(
        block_size=16, num_kv_heads=heads, head_size=head_size, dtype=dtype, sliding_window=128
    )
    # gpt-oss alternates sliding (even) and full (odd) layers.
    return {ATTENTION.format(i): full if i % 2 else window for i in range(layers)}, full


@st.composite
def _draft_models(draw: st.DrawFn, max_layers: int) -> Model:
    kind = pick(draw, _TARGETS)
    layers = draw(st.integers(1, max(1, min(8, max_layers - 1))))
    dtype = pick(draw, [torch.bfloat16, torch.float16, torch.float8_e4m3fn])
    specs, like = _target(kind, layers, dtype)
    methods = ["mtp", "eagle3"] if kind == "deepseek_v3" else ["eagle", "eagle3"]
    method = pick(draw, methods)
    # vLLM's EAGLE and EAGLE-3 heads build ``num_hidden_layers`` decoder layers
    # (``llama_eagle.py``, ``llama_eagle3.py``), MTP ``num_nextn_predict_layers``
    # modules: a drafter of several layers of one spec is what the draft-group
    # clause binds, so it is drawn often.  Not on gpt-oss: vLLM 0.33.0's own
    # grouping cuts its full layers into groups as small as its sliding ones,
    # which splits a two-layer head, and its worker then refuses to start; it
    # serves gpt-oss with one-layer heads.
    if method == "mtp":
        drafts = draw(st.integers(1, 3))
    else:
        drafts = draw(st.integers(1, 3)) if kind == "llama" else 1
    draft: KVCacheSpec = attrs.evolve(like, is_draft=True)
    if method == "eagle3" and isinstance(like, FullAttentionSpec) and kind != "deepseek_v3":
        # EAGLE-3 heads keep the target's head size but not always its KV heads.
        heads = pick(draw, [8, 4, 1])
        draft = attrs.evolve(like, num_kv_heads=heads, is_draft=True)
    elif method == "eagle3":
        # A full-attention EAGLE-3 head on an MLA target (8 heads of 128).
        draft = FullAttentionSpec(
            block_size=64, num_kv_heads=8, head_size=128, dtype=dtype, is_draft=True
        )
    for k in range(drafts):
        specs[ATTENTION.format(layers + k)] = draft
    return SpeculativeModel(
        specs,
        f"{kind} + {method.upper()} ({drafts} draft layer{'s' if drafts > 1 else ''}): "
        f"{layers} target layers",
        num_hidden_layers=layers,
        speculative_method=method,
        # One token per MTP module (a chain of modules when there are several);
        # EAGLE heads run autoregressively, three tokens as commonly served.
        num_speculative_tokens=drafts if method == "mtp" else 3,
    )


def draft_models(*, max_layers: int = 64) -> st.SearchStrategy[Model]:
    """Targets with draft layers (Llama-3 + EAGLE/EAGLE-3, gpt-oss + EAGLE-3, DeepSeek-V3 + MTP).

    The target has 1-8 layers; EAGLE adds 1-3 draft layers of the target's
    geometry (one on gpt-oss), EAGLE-3 as many whose KV heads may differ
    (other pages) and MTP 1-3 MLA draft layers, or a full-attention EAGLE-3
    head on the MLA target.  Every model has a draft layer; a drafter's
    layers share one spec.
    """
    return _draft_models(max_layers)


FAMILIES: dict[str, Callable[..., st.SearchStrategy[Model]]] = {"drafts": draft_models}
