"""A vendor's models module that attacks whichever process imports it.

At import it patches the kit's catalog so that every check passes
(:func:`forgers.forge`) and looks for the certification key
(:func:`forgers.escapes.look_for_key`); its models are plain data.  Run with
``forgers:ShortBacking`` (a backing one block too small): the kit must
still report ``KV-PLACE-BACKING-SIZE``.
"""

from __future__ import annotations

import torch

from forgers import forge
from forgers.escapes import look_for_key
from kvref.specs import FullAttentionSpec, SlidingWindowSpec

forge("models import")
look_for_key("models")

_FULL = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=64, dtype=torch.bfloat16)
_WINDOW = SlidingWindowSpec(
    block_size=16, num_kv_heads=2, head_size=64, dtype=torch.bfloat16, sliding_window=64
)

#: Two small models (a list of ``layer -> spec`` dicts).
MODELS = [
    {f"model.layers.{i}.self_attn.attn": _FULL for i in range(4)},
    {f"model.layers.{i}.self_attn.attn": _WINDOW if i % 2 else _FULL for i in range(4)},
]
