"""What vLLM would show a builder of a generated model: its Hugging Face config and cache dtype.

A vendor's builder gates its specialised code on the model as vLLM describes
it (``hf_config.model_type``, ``architectures``, ``model_config.use_mla``,
the MLA and indexer dimensions, ``cache_config.cache_dtype``), not only on
the specs.  A kit that shows every model as a Llama never opens such a gate.

Each family whose models *are* a published model's structure is described
as that model: its ``model_type`` and architecture as vLLM 0.33.0's model
registry names them, and the published dimensions the family's specs were
made from.  A family that two models share (DeepSeek-V3.2's sparse MLA is
also GLM-5's ``glm_moe_dsa``) is drawn as either.  Generic families keep the
kit's plain description, except the MLA one, which is DeepSeek-V3 where its
latents are DeepSeek-V3's own (576 values, or 656 bytes of ``fp8_ds_mla``,
uncompressed): vLLM never shows MLA specs of a model it does not treat as
MLA, and never a DeepSeek-V3 with compressed latents.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from hypothesis import strategies as st

from conformance.generate.sampled_from_cache import pick
from kvref.hf import HFValue
from kvref.specs import KVCacheSpec, MLAAttentionSpec

__all__ = ["cache_dtype_of", "described_again", "hf_descriptions"]

_MLA_DIMS: dict[str, HFValue] = {"kv_lora_rank": 512, "qk_rope_head_dim": 64}
#: DeepSeek Sparse Attention's lightning indexer (DeepSeek-V3.2's published config).
_DSA: dict[str, HFValue] = {"index_topk": 2048, "index_head_dim": 128}

_DEEPSEEK_V3: dict[str, HFValue] = {
    "model_type": "deepseek_v3",
    "architectures": ("DeepseekV3ForCausalLM",),
}
_DEEPSEEK_V32: dict[str, HFValue] = {
    "model_type": "deepseek_v32",
    "architectures": ("DeepseekV32ForCausalLM",),
    **_MLA_DIMS,
    **_DSA,
    "index_n_heads": 64,
}
_GLM_MOE_DSA: dict[str, HFValue] = {
    "model_type": "glm_moe_dsa",
    "architectures": ("GlmMoeDsaForCausalLM",),
}
_GLM_MOE_DSA.update(_MLA_DIMS)
_GLM_MOE_DSA.update(_DSA)

#: family -> the published models whose structure it draws (the first is the simplest).
_FAMILIES: dict[str, tuple[dict[str, HFValue], ...]] = {
    "deepseek_v32": (_DEEPSEEK_V32, _GLM_MOE_DSA),
    "hisparse": (_DEEPSEEK_V32, _GLM_MOE_DSA),
    "deepseek_v4": (
        {
            "model_type": "deepseek_v4",
            "architectures": ("DeepseekV4ForCausalLM",),
            "head_dim": 512,
            "qk_rope_head_dim": 64,
            "sliding_window": 128,
        },
    ),
    "glm5": ({"model_type": "glm5_next", "architectures": ("Glm5NextForCausalLM",)},),
    "qwen3_next": ({"model_type": "qwen3_next", "architectures": ("Qwen3NextForCausalLM",)},),
    "nemotron_h": ({"model_type": "nemotron_h", "architectures": ("NemotronHForCausalLM",)},),
    "jamba": ({"model_type": "jamba", "architectures": ("JambaForCausalLM",)},),
}

#: DeepSeek-V3's latent: 512 + 64 values, or fp8_ds_mla's 656 bytes.
_DEEPSEEK_LATENTS = frozenset({576, 656})


def _deepseek_v3_latents(specs: Mapping[str, KVCacheSpec]) -> bool:
    """Whether every layer is an uncompressed DeepSeek-V3 latent (an MTP draft included)."""
    return bool(specs) and all(
        type(s) is MLAAttentionSpec
        and s.head_size in _DEEPSEEK_LATENTS
        and s.tokens_per_state == 1
        and s.model_version is None
        for s in specs.values()
    )


_LAYER_INDEX = re.compile(r"^model\.layers\.(\d+)\.")


def _compress_ratios(specs: Mapping[str, KVCacheSpec]) -> tuple[int, ...]:
    """DeepSeek-V4.1's ``compress_ratios``: per decoder layer, MTP included, 0 for SWA only.

    A layer's ratio is the tokens per state of its compressed caches (the
    latent's, which a CSA layer's indexer shares); a layer with none is a
    sliding-window layer.
    """
    ratios: dict[int, int] = {}
    for name, spec in specs.items():
        match = _LAYER_INDEX.match(name)
        if match is None:
            continue
        per_state = getattr(spec, "tokens_per_state", 1)
        ratio = int(per_state) if per_state > 1 else 0
        index = int(match[1])
        ratios[index] = max(ratios.get(index, 0), ratio)
    return tuple(ratios[i] for i in sorted(ratios))


def _choices(family: str, specs: Mapping[str, KVCacheSpec]) -> tuple[dict[str, HFValue], ...]:
    if family == "mla":
        return ({**_DEEPSEEK_V3, **_MLA_DIMS},) if _deepseek_v3_latents(specs) else ()
    if family == "deepseek_v4":
        # vLLM tells DeepSeek-V4 from V3 by its per-layer compress ratios.
        return tuple({**c, "compress_ratios": _compress_ratios(specs)} for c in _FAMILIES[family])
    return _FAMILIES.get(family, ())


def hf_descriptions(
    family: str, specs: Mapping[str, KVCacheSpec]
) -> st.SearchStrategy[tuple[tuple[str, HFValue], ...]]:
    """The Hugging Face fields vLLM would show for a model of ``family`` with ``specs``.

    Never a description whose structure the specs do not have; ``()`` (the
    kit's plain Llama description) for the generic families.  Shrinks to the
    first published model of the family.
    """
    described = _described(family, specs)
    return st.sampled_from(described) if described else st.just(())


def draw_hf_description(
    draw: st.DrawFn, family: str, specs: Mapping[str, KVCacheSpec]
) -> tuple[tuple[str, HFValue], ...]:
    """One draw of :func:`hf_descriptions` (the same choices), made with the caller's ``draw``."""
    described = _described(family, specs)
    return pick(draw, described) if described else ()


def _described(
    family: str, specs: Mapping[str, KVCacheSpec]
) -> list[tuple[tuple[str, HFValue], ...]]:
    return [tuple(sorted(c.items())) for c in _choices(family, specs)]


def described_again(
    hf_config: tuple[tuple[str, HFValue], ...], specs: Mapping[str, KVCacheSpec]
) -> tuple[tuple[str, HFValue], ...]:
    """``hf_config`` of a model whose layers changed: its per-layer fields derived again.

    A mutated model (a layer added or dropped) keeps its published
    description, but a field that lists every decoder layer
    (``compress_ratios``) must list the new ones, as vLLM would read it.
    """
    if not any(name == "compress_ratios" for name, _ in hf_config):
        return hf_config
    ratios = _compress_ratios(specs)
    return tuple((n, ratios if n == "compress_ratios" else v) for n, v in hf_config)


def cache_dtype_of(specs: Mapping[str, KVCacheSpec]) -> str:
    """VLLM's ``cache_config.cache_dtype`` for ``specs``: their one explicit cache dtype, or auto.

    vLLM sets the cache dtype once for the engine and the attention layers
    report it (``cache_dtype_str``); layers whose own kernels fix their
    dtype (an indexer's fp8 keys beside a bf16 latent) may differ, so a
    model with more than one explicit dtype keeps ``"auto"``.
    """
    explicit = (getattr(s, "cache_dtype_str", None) for s in specs.values())
    found = {d for d in explicit if isinstance(d, str) and d != "auto"}
    return found.pop() if len(found) == 1 else "auto"
