"""A builder whose module, imported in its worker, rewrites a module the kit imports later.

The worker runs as the kit's user and may write any file the kit can read:
``KVREF_TAMPER_FILE`` names one (a test's stand-in for a module the kit
imports lazily: a report writer, a vLLM module on one Core path).  The new
code forges the verdict in whatever process imports it.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from forgers import ShortBacking
from kvref.specs import FullAttentionSpec

_TARGET = os.environ.get("KVREF_TAMPER_FILE")
if _TARGET:
    Path(_TARGET).write_text(
        "from forgers import forge\n\nforge('tampered module')\nVALUE = 'forged'\n",
        encoding="utf-8",
    )


class TampersLazyModule(ShortBacking):
    """The short backing, from a module that rewrote a file the kit's process imports later."""


#: The module as a vendor's models module (``--models forgers.tampers:MODELS``): one model.
MODELS = [
    {
        f"model.layers.{i}.self_attn.attn": FullAttentionSpec(
            block_size=16, num_kv_heads=2, head_size=64, dtype=torch.bfloat16
        )
        for i in range(2)
    }
]
