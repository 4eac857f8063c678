"""The model's Hugging Face config as a builder reads it (vLLM's ``model_config.hf_config``).

Planning never reads these fields; builders do.  A platform builder gates its
specialised code on what vLLM shows it of the model: ``hf_config.model_type``
(``"deepseek_v32"``, ``"glm_moe_dsa"``...), ``architectures``, the MLA
dimensions (``kv_lora_rank``, ``qk_rope_head_dim``), the indexer's
(``index_topk``, ``index_head_dim``).  :class:`~kvref.config.PlanningConfig`
carries them as sorted ``(name, value)`` pairs, so the config stays hashable
and travels as data; the vLLM adapter writes them onto the ``VllmConfig``'s
``hf_config`` (:mod:`kvref.interop.vllm_config`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Union

from kvref.errors import ConfigError

__all__ = ["HF_OWNED", "HFValue", "hf_config_fields"]

HFScalar = Union[bool, int, float, str, None]  # noqa: UP007 - a runtime alias
#: A value of one field: a JSON scalar, or a tuple of them (``architectures``).
HFValue = Union[HFScalar, tuple[HFScalar, ...]]  # noqa: UP007 - a runtime alias

#: Fields other config fields own; one source for each figure.
HF_OWNED = {
    "num_hidden_layers": "num_hidden_layers",
    "num_nextn_predict_layers": "num_draft_layers",
}


def _scalar(value: object) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    return value is None or isinstance(value, (bool, int, str))


def hf_config_fields(value: object) -> tuple[tuple[str, HFValue], ...]:
    """``value`` (a mapping or ``(name, value)`` pairs) as sorted pairs of checked fields.

    Lists become tuples.

    Raises:
        ConfigError: a name is not an identifier, is owned by another config
            field, or repeats; a value is not a finite JSON scalar or a list of them.
    """
    where = "PlanningConfig.hf_config"
    if isinstance(value, Mapping):
        items: Iterable[object] = value.items()
    elif isinstance(value, (tuple, list)):
        items = value
    else:
        raise ConfigError(f"{where}={value!r:.120} must be a mapping of field names to values")
    fields: dict[str, HFValue] = {}
    for item in items:
        if not (isinstance(item, (tuple, list)) and len(item) == 2):
            raise ConfigError(f"{where} entry {item!r:.80} is not a (name, value) pair")
        name, raw = item
        if not isinstance(name, str) or not name.isidentifier():
            raise ConfigError(f"{where} has the field name {name!r:.80}, not an identifier")
        if name in HF_OWNED:
            raise ConfigError(
                f"{where}[{name!r}] is described by PlanningConfig.{HF_OWNED[name]}; set that"
            )
        if name in fields:
            raise ConfigError(f"{where}[{name!r}] is given twice")
        if isinstance(raw, (tuple, list)) and all(_scalar(v) for v in raw):
            fields[name] = tuple(raw)
        elif _scalar(raw):
            fields[name] = raw
        else:
            raise ConfigError(
                f"{where}[{name!r}]={raw!r:.80} must be a finite number, a string, a bool, "
                "None or a list of those"
            )
    return tuple(sorted(fields.items()))
