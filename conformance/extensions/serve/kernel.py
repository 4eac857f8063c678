"""The attention kernel's view of a layer in the serving simulation.

A :class:`LayerSlot` is one layer as its kernel sees it: its ``(N, H, S, C)``
byte view from :func:`conformance.check.worker.allocate_kv_cache` and the
salt of its tags.  Every state a kernel stores gets a 64-bit *tag*: the hash
of the content it was computed from (the tokens up to it) mixed with the
layer's salt.  Two requests only share tags where they share a prefix,
which is exactly where vLLM lets them share blocks.  Tags are made, written
and read back by the kit's one tag engine, :mod:`conformance.extensions.tags`.
"""

from __future__ import annotations

from fractions import Fraction

import attrs
import torch

from conformance.extensions.serve.pool import Retention

__all__ = ["LayerSlot"]


@attrs.define(kw_only=True, eq=False)
class LayerSlot:
    """One layer as its kernel sees it.

    Attributes:
        name: the layer.
        worker: the worker whose allocation holds it.
        group_id: its group in the config.
        view: its ``(N, H, S, C)`` byte view.
        salt: the layer's tag salt.
        tokens_per_state: tokens per kernel state (a ``Fraction`` below 1: states per token).
        declared: the layer's own retention (what it reads), from the model's spec.
        wide: the int64 form of ``view`` (:func:`conformance.extensions.tags.wide_view`), if any.
    """

    name: str
    worker: int
    group_id: int
    view: torch.Tensor
    salt: int
    tokens_per_state: Fraction
    declared: Retention
    wide: torch.Tensor | None = None

    @property
    def num_blocks(self) -> int:
        """Pages in the view."""
        return int(self.view.shape[0])

    @property
    def states_per_page(self) -> int:
        """States one page of the view holds (``S``)."""
        return int(self.view.shape[2])

    @property
    def state_bytes(self) -> int:
        """Bytes of one state across heads (``H * C``)."""
        return int(self.view.shape[1] * self.view.shape[3])
