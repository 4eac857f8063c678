"""What the kit calls: run a request stream over a builder's configs and list the violations.

Two invariants, both judged after every step of the stream:

- ``KV-SERVE-ISOLATION``: every live request reads back exactly its own tags
  for every state each of its layers still needs (by the layer's own spec).
- ``KV-SERVE-POOL``: the pool never hands out the null block or a held block,
  reference counts equal holders, a block ID belongs to one group at a time
  (shared between requests only through prefix hits), and every kernel write
  lands in a block its request holds in that group.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from conformance.check.geometry import page_bytes
from conformance.check.violations import Violation
from conformance.check.worker_model import planned_device_bytes, planned_host_bytes
from conformance.extensions.serve.machine import ServeProgram, random_program
from conformance.extensions.serve.sim import ISOLATION, POOL, Simulation
from kvref.errors import KVRefError
from kvref.layout import KVCacheLayout
from kvref.records import KVCacheConfig
from kvref.specs import CrossAttentionSpec, EncoderOnlyAttentionSpec, KVCacheSpec

__all__ = [
    "ISOLATION",
    "POOL",
    "SERVE_INVARIANTS",
    "ServeBounds",
    "bounds_for",
    "run_serving",
    "serve_bounds",
]

#: The invariant ids of the serving scenario.
SERVE_INVARIANTS = (ISOLATION, POOL)

#: Bytes of KV one request may write per step across all layers, to keep a run fast.
BYTE_BUDGET = 1 << 20

#: Backings above this many bytes are not simulated (the run is inconclusive).
MAX_BYTES = 256 << 20


class ServeBounds:
    """Request sizes that cross block boundaries yet keep a run within :data:`BYTE_BUDGET`.

    Attributes:
        max_tokens: tokens after which a request is finished by length.
        max_prompt: the longest prompt a program draws.
        max_encoder: the longest encoder input (0 without encoder layers).
    """

    def __init__(self, max_tokens: int, max_prompt: int, max_encoder: int) -> None:
        self.max_tokens = max_tokens
        self.max_prompt = max_prompt
        self.max_encoder = max_encoder

    def __repr__(self) -> str:
        return (
            f"ServeBounds(max_tokens={self.max_tokens}, max_prompt={self.max_prompt}, "
            f"max_encoder={self.max_encoder})"
        )


def bounds_for(specs: Mapping[str, KVCacheSpec]) -> ServeBounds:
    """Request sizes for a model: past three of its largest blocks and its smallest window.

    Capped by :data:`BYTE_BUDGET` of KV per request and 4096 tokens.
    """
    blocks = [s.block_size for s in specs.values()] or [16]
    # Pages from the kit's own geometry; a spec with a per-block state (Mamba's
    # ``tokens_per_state=-1``) costs nothing per token.
    per_token = sum(
        page_bytes(s) // max(1, s.block_size)
        for s in specs.values()
        if getattr(s, "tokens_per_state", 1) > 0
    )
    # Long enough to cross blocks and, where a window or chunk frees some, to free them.
    windows = [
        w
        for s in specs.values()
        for w in (getattr(s, "sliding_window", None), getattr(s, "attention_chunk_size", None))
        if w
    ]
    reach = 3 * max(blocks) + 1
    if windows:
        reach = max(reach, min(windows) + 2 * max(blocks))
    max_tokens = max(2, min(reach, BYTE_BUDGET // max(1, per_token), 4096))
    encoder = any(
        isinstance(s, (CrossAttentionSpec, EncoderOnlyAttentionSpec)) for s in specs.values()
    )
    return ServeBounds(
        max_tokens=max_tokens,
        max_prompt=max(1, (2 * max_tokens) // 3),
        max_encoder=max(1, min(blocks) * 2) if encoder else 0,
    )


def serve_bounds(config: KVCacheConfig) -> ServeBounds:
    """:func:`bounds_for` the config's per-layer specs."""
    return bounds_for(config.layer_specs())


def run_serving(
    config: KVCacheConfig | Sequence[KVCacheConfig],
    layout: KVCacheLayout | str | None,
    device: str | torch.device,
    *,
    program: ServeProgram | None = None,
    steps: int = 8,
    seed: int = 0,
    layer_specs: Mapping[str, KVCacheSpec] | Sequence[Mapping[str, KVCacheSpec]] | None = None,
    bounds: ServeBounds | None = None,
    max_bytes: int = MAX_BYTES,
) -> list[Violation] | None:
    """Serve a request stream over ``config`` (or one config per PP worker) and check it.

    Args:
        config: a worker's config, or every worker's (the first is the scheduler's).
        layout: the resolved layout of the device views (default: the config's).
        device: torch device of the device backings.
        program: the rule calls to replay (default: :func:`random_program` of
            ``steps`` calls from ``seed``).
        steps: the random program's length.
        seed: the random program's seed.
        layer_specs: the model's own spec per layer (per worker for several
            configs): what each layer reads.  Default: the configs' per-layer specs.
        bounds: request sizes (default: :func:`serve_bounds` of the first config).
        max_bytes: the most bytes of backings (all workers, device and host) to allocate.

    Returns:
        The violations of the first step that broke an invariant (empty when
        the stream ran clean), or ``None`` when the configs cannot be served at
        all (views that cannot be built, groups that differ across workers,
        backings above ``max_bytes``): the static invariants report those.
    """
    configs = [config] if isinstance(config, KVCacheConfig) else list(config)
    if not configs or not configs[0].kv_cache_groups:
        return []
    specs: list[Mapping[str, KVCacheSpec]] | None = None
    if layer_specs is not None:
        specs = [layer_specs] if isinstance(layer_specs, Mapping) else list(layer_specs)
    total = sum(planned_device_bytes(c) + planned_host_bytes(c) for c in configs)
    if total > max_bytes:
        return None
    limits = bounds or serve_bounds(configs[0])
    if program is None:
        program = random_program(
            steps, seed, max_prompt=limits.max_prompt, max_encoder=limits.max_encoder
        )
    try:
        sim = Simulation(configs, layout, device, layer_specs=specs, max_tokens=limits.max_tokens)
    except (KVRefError, ValueError):
        return None
    try:
        return program.run(sim)
    finally:
        for alloc in sim.allocations:
            alloc.close()
