"""Pipeline-parallel splits as vLLM makes them: stages cut between decoder layers.

vLLM gives each pipeline stage a contiguous run of the target model's
decoder layers (``get_pp_indices``: an even share each, the remainder on
the stages before the last, or the ``VLLM_PP_LAYER_PARTITION`` list), and
runs draft/MTP layers with the last stage.  A decoder layer can own several
KV cache layers (``layers.7.attn`` and ``layers.7.indexer``; a self- and a
cross-attention layer); they always stay on one worker.  Indices without a
KV cache layer (MLP layers of Nemotron-H) still count as decoder layers.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping, Sequence

import attrs
from hypothesis import strategies as st

from conformance.generate.layouts import as_specs
from conformance.generate.records import Model
from kvref.specs import KVCacheSpec

__all__ = [
    "DecoderLayers",
    "PipelineSplit",
    "decoder_layers",
    "pipeline_splits",
    "pp_splits",
    "vllm_partition",
]

# The first integer component of a layer name is its decoder-layer index.
_INDEX = re.compile(r"^(.*?)(\d+)(?=\.|$)")


@attrs.frozen
class DecoderLayers:
    """A model's KV cache layers by decoder layer.

    Attributes:
        by_index: target decoder-layer index to its KV cache layer names, in model order.
        tail: names that run with the last stage (draft/MTP layers, names without an index).
        num_hidden_layers: the target's decoder-layer count (layers without KV cache included).
    """

    by_index: Mapping[int, tuple[str, ...]]
    tail: tuple[str, ...]
    num_hidden_layers: int


def decoder_layers(model: Model | Mapping[str, KVCacheSpec]) -> DecoderLayers:
    """Group ``model``'s layers by decoder layer (see the module docstring).

    A layer is a target layer when it is not a draft, its name has an index
    and the same prefix as the first such layer (``model.layers.``), and the
    index is below the model's ``num_hidden_layers`` when it declares one.
    """
    specs = as_specs(model)
    declared = model.num_hidden_layers if isinstance(model, Model) else None
    main: str | None = None
    by_index: dict[int, list[str]] = {}
    tail: list[str] = []
    for name, spec in specs.items():
        match = _INDEX.match(name)
        if match is not None and main is None and not spec.is_draft:
            main = match[1]
        index = int(match[2]) if match is not None else -1
        target = (
            match is not None
            and not spec.is_draft
            and match[1] == main
            and (declared is None or index < declared)
        )
        if target:
            by_index.setdefault(index, []).append(name)
        else:
            tail.append(name)
    hidden = declared if declared is not None else max(by_index, default=-1) + 1
    return DecoderLayers(
        by_index={i: tuple(names) for i, names in sorted(by_index.items())},
        tail=tuple(tail),
        num_hidden_layers=hidden,
    )


def vllm_partition(num_hidden_layers: int, pp_size: int) -> tuple[int, ...]:
    """Decoder layers per stage in vLLM's default partition.

    An even share each; the remainder goes one layer at a time to the
    stages before the last, nearest to it first (the last stage also holds
    the final norm and head): 31 layers on 4 stages give ``(8, 8, 8, 7)``,
    10 on 4 give ``(2, 3, 3, 2)``.

    Raises:
        ValueError: ``pp_size`` is not positive.
    """
    if pp_size < 1:
        raise ValueError(f"vllm_partition(pp_size={pp_size}) needs at least one stage")
    share, remainder = divmod(num_hidden_layers, pp_size)
    sizes = [share] * pp_size
    for k in range(remainder):
        sizes[pp_size - 2 - k] += 1
    return tuple(sizes)


@attrs.frozen
class PipelineSplit:
    """One pipeline split: each worker's layers and the decoder layers each stage holds.

    Attributes:
        workers: one ``layer -> spec`` dict per worker, in stage order.
        partition: decoder layers per stage (they sum to ``num_hidden_layers``).
        kind: ``vllm`` (the default partition) or ``custom`` (``VLLM_PP_LAYER_PARTITION``).
        num_hidden_layers: the target's decoder-layer count.
    """

    workers: tuple[dict[str, KVCacheSpec], ...]
    partition: tuple[int, ...]
    kind: str
    num_hidden_layers: int

    def describe(self) -> str:
        """``2 worker(s), vllm partition 16+15`` (for problem descriptions)."""
        text = f"{len(self.workers)} worker(s)"
        if len(self.workers) > 1:
            text += f", {self.kind} partition {'+'.join(map(str, self.partition))}"
        return text


def _assign(
    specs: Mapping[str, KVCacheSpec], layers: DecoderLayers, partition: Sequence[int]
) -> tuple[list[dict[str, KVCacheSpec]], list[int]]:
    """Each stage's layers; stages left without a KV layer merge into the next one."""
    workers: list[dict[str, KVCacheSpec]] = []
    sizes: list[int] = []
    start = carried = 0
    for size in partition:
        end = start + size
        names = [n for i, ns in layers.by_index.items() if start <= i < end for n in ns]
        carried += size
        if names:
            workers.append({n: specs[n] for n in names})
            sizes.append(carried)
            carried = 0
        start = end
    if carried and sizes:
        sizes[-1] += carried  # trailing decoder layers without KV cache
    if layers.tail:
        if not workers:
            workers.append({})
            sizes.append(carried)
        workers[-1].update({n: specs[n] for n in layers.tail})
    return workers, sizes


def draw_pipeline_split(
    draw: st.DrawFn, model: Model | Mapping[str, KVCacheSpec], max_workers: int
) -> PipelineSplit:
    """One draw of :func:`pipeline_splits`, made with the caller's ``draw`` (see :mod:`.inline`)."""
    specs = as_specs(model)
    layers = decoder_layers(model)
    hidden = layers.num_hidden_layers
    if not specs:
        count = draw(st.integers(1, max_workers))
        return PipelineSplit(tuple({} for _ in range(count)), (0,) * count, "vllm", 0)
    stages = draw(st.integers(1, max(1, min(max_workers, len(layers.by_index)))))
    kind = "custom" if stages > 1 and draw(st.booleans()) else "vllm"
    if kind == "custom":
        cuts = draw(
            st.lists(
                st.integers(1, hidden - 1), min_size=stages - 1, max_size=stages - 1, unique=True
            )
        )
        bounds = [0, *sorted(cuts), hidden]
        partition: tuple[int, ...] = tuple(b - a for a, b in itertools.pairwise(bounds))
    else:
        partition = vllm_partition(hidden, stages)
    workers, sizes = _assign(specs, layers, partition)
    return PipelineSplit(tuple(workers), tuple(sizes), kind, hidden)


_pipeline_splits = st.composite(draw_pipeline_split)


def pipeline_splits(
    model: Model | Mapping[str, KVCacheSpec], *, max_workers: int = 4
) -> st.SearchStrategy[PipelineSplit]:
    """Pipeline splits of ``model`` over 1..``max_workers`` stages, cut between decoder layers.

    vLLM's default partition (shrinks to it) or an uneven custom one (any
    cut points, as ``VLLM_PP_LAYER_PARTITION`` allows).  All KV cache
    layers of one decoder layer stay on one worker; draft/MTP layers go with
    the last stage.  A stage whose decoder layers hold no KV cache merges
    into the next, so no worker is empty, except for the attention-free
    model, whose 1..``max_workers`` workers all hold no layer (as in vLLM).

    Raises:
        ValueError: ``max_workers`` is below one.
    """
    if max_workers < 1:
        raise ValueError(f"pp_splits(max_workers={max_workers}) needs at least one worker")
    return _pipeline_splits(model, max_workers)


def pp_splits(
    model: Model | Mapping[str, KVCacheSpec], *, max_workers: int = 4
) -> st.SearchStrategy[list[dict[str, KVCacheSpec]]]:
    """The workers of :func:`pipeline_splits` alone: one ``layer -> spec`` dict per stage.

    Raises:
        ValueError: ``max_workers`` is below one.
    """
    return pipeline_splits(model, max_workers=max_workers).map(lambda s: list(s.workers))
