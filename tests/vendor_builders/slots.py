"""Shared-tuple slots: the per-block byte arithmetic of the vendor builders.

A *tuple* is the caches one decoder layer keeps in one block table (a
compressed latent and its indexer key, say); a group's *slot* is the bytes
one block ID of that group takes: its tuples side by side.  The builders
only work in block-outermost layouts, where every device tensor steps the
same bytes per block (the widest slot, rounded up to every alignment), so a
slot's offsets are all the builder has to choose.

Every cache gets a tensor of its own: the offsets inside a slot are the
builder's, not a uniform layer stride.

Apart from :class:`SlotPlanBuilder`, nothing here is about kvref's form: the
arithmetic works on plain ints and any spec with ``page_size_bytes`` and
``get_block_stride_alignment()``, so the vLLM-native twins of these builders
(tests/vllm/native_builders) use it too, with vLLM's tensor class.
"""

from __future__ import annotations

import math
from abc import abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvref import (
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheSpec,
    KVCacheTensor,
    PlanningConfig,
    ReferenceKVCacheConfigBuilder,
)

__all__ = [
    "GRANULE",
    "CacheTuple",
    "DraftsAfterTargets",
    "FamilyGroups",
    "family_layers",
    "SlotPlan",
    "SlotPlanBuilder",
    "SlotPoolBuilder",
    "lay_out",
    "pack",
    "round_up",
    "side_by_side",
    "specialised",
    "tuples_by_stem",
]

#: The platform's DMA granule: every block starts on it.
GRANULE = 512


def round_up(value: int, multiple: int) -> int:
    """The smallest multiple of ``multiple`` that is at least ``value``."""
    return -(-value // multiple) * multiple


@dataclass(frozen=True)
class CacheTuple:
    """The caches of one decoder layer in one group, in the order they sit in the slot.

    Attributes:
        stem: the decoder layer's name prefix (``model.layers.3.attn``).
        index: its decoder-layer index (target layers first, by index).
        draft: an MTP/draft layer, laid after the target's tuples.
        members: ``(layer name, per-layer spec)`` in slot order.
    """

    stem: str
    index: int
    draft: bool
    members: tuple[tuple[str, KVCacheSpec], ...]

    @property
    def nbytes(self) -> int:
        """Bytes of the tuple: its members' pages back to back."""
        return sum(spec.page_size_bytes for _, spec in self.members)


def tuples_by_stem(
    group: KVCacheGroupSpec,
    key: Mapping[str, tuple[str, int, bool, int]],
) -> list[CacheTuple]:
    """The group's own layers as tuples, target layers by index first, then drafts.

    ``key[name]`` is ``(stem, index, draft, rank)``: the decoder layer a cache
    belongs to and its rank inside the tuple.  Only the layers the group
    names are placed (a pipeline worker's projected group may keep a wrapper
    that lists every worker's layers).
    """
    by_stem: dict[str, list[tuple[int, str, KVCacheSpec]]] = {}
    order: dict[str, tuple[bool, int]] = {}
    for name in group.layer_names:
        stem, index, draft, rank = key[name]
        by_stem.setdefault(stem, []).append((rank, name, group.layer_spec(name)))
        order[stem] = (draft, index)
    out = []
    for stem in sorted(by_stem, key=lambda s: (order[s], s)):
        members = tuple((name, spec) for _, name, spec in sorted(by_stem[stem], key=lambda m: m[0]))
        draft, index = order[stem]
        out.append(CacheTuple(stem=stem, index=index, draft=draft, members=members))
    return out


@dataclass(frozen=True)
class SlotPlan:
    """Where every cache sits inside its group's slot, and the bytes one block takes.

    Attributes:
        offsets: layer name to its byte offset inside a block.
        pages: layer name to its page (the bytes it owns per block).
        bytes_per_block: the block stride of every tensor.
    """

    offsets: Mapping[str, int]
    pages: Mapping[str, int]
    bytes_per_block: int

    def tensors(self, num_blocks: int, tensor: Callable[..., Any] = KVCacheTensor) -> list[Any]:
        """One single-layer tensor per cache, all on one backing of ``bpb * num_blocks`` bytes.

        ``tensor`` is the form's tensor class: kvref's, or vLLM's for a vLLM-native builder.
        """
        size = self.bytes_per_block * num_blocks
        return [
            tensor(
                size=size,
                layers=[name],
                layer_stride=self.pages[name],
                block_stride=self.bytes_per_block,
                offset=offset,
            )
            for name, offset in self.offsets.items()
        ]


def pack(
    placed: Iterable[tuple[str, int, KVCacheSpec]],
    *,
    granule: int = 1,
) -> SlotPlan:
    """A slot plan from ``(name, offset, spec)``: the block stride covers the farthest page.

    The block stride is the farthest page end rounded up to ``granule`` and
    to every layer's block-stride alignment, so every block of every tensor
    starts where the kernels want it.
    """
    offsets: dict[str, int] = {}
    pages: dict[str, int] = {}
    end = 0
    alignment = granule
    for name, offset, spec in placed:
        offsets[name] = offset
        pages[name] = spec.page_size_bytes
        end = max(end, offset + spec.page_size_bytes)
        alignment = math.lcm(alignment, spec.get_block_stride_alignment())
    return SlotPlan(offsets=offsets, pages=pages, bytes_per_block=round_up(end, alignment))


def lay_out(tuples: Sequence[Any], start: int) -> list[int]:
    """Start offsets of ``tuples`` (anything with ``nbytes``) laid back to back from ``start``."""
    starts = []
    offset = start
    for t in tuples:
        starts.append(offset)
        offset += t.nbytes
    return starts


def side_by_side(
    members: Iterable[tuple[str, KVCacheSpec]], start: int
) -> list[tuple[str, int, KVCacheSpec]]:
    """``(name, offset, spec)`` of ``members`` placed back to back from ``start``."""
    out = []
    for name, spec in members:
        out.append((name, start, spec))
        start += spec.page_size_bytes
    return out


class DraftsAfterTargets:
    """Where a slot's tuples start: the target tuples back to back from byte 0, then the drafts.

    The target's offsets do not move when speculative decoding is switched on.
    The tuples are anything with ``draft`` and ``nbytes``.
    """

    def _tuple_starts(self, tuples: Sequence[Any]) -> list[int]:
        """Target tuples back to back from byte 0, then the draft tuples after them."""
        targets = [t for t in tuples if not t.draft]
        drafts = [t for t in tuples if t.draft]
        starts = lay_out(targets, 0)
        return starts + lay_out(drafts, self._draft_start(targets, starts))

    def _draft_start(self, targets: Sequence[Any], starts: Sequence[int]) -> int:
        """Where the MTP tuples start: right after the last target tuple."""
        return starts[-1] + targets[-1].nbytes if targets else 0


def specialised(config: PlanningConfig) -> bool:
    """Whether the platform's slot layouts apply to ``config`` at all.

    They need a block-outermost layout; host residency, HiSparse, a
    model-declared grouping and the hybrid manager switched off are left to
    the reference.
    """
    return (
        config.kv_cache_layout.is_block_outermost
        and not config.host_resident_layers
        and config.hisparse is None
        and config.model_kv_cache_grouping is None
        and not config.disable_hybrid_kv_cache_manager
    )


def family_layers(
    specs: Mapping[str, Any],
    parse: Callable[[str, Any], Any | None],
    is_model: Callable[[list[Any]], bool],
) -> list[Any] | None:
    """Every cache of ``specs`` parsed as a family's, if they make one of its models.

    ``parse(name, spec)`` is ``None`` for a cache that is not the family's;
    ``is_model`` says whether the parsed caches are a whole model.  ``None``:
    the model is not the family's (the builder's parent groups it).
    """
    layers = [parse(name, spec) for name, spec in specs.items()]
    found = [layer for layer in layers if layer is not None]
    if len(found) < len(layers) or not is_model(found):
        return None
    return found


class FamilyGroups(ReferenceKVCacheConfigBuilder):
    """The grouping of a builder for one model family: its own for the family's models.

    A subclass parses each cache (:meth:`_parse`: ``None`` when it is not
    the family's), says whether the parsed caches make one of its models
    (:meth:`_is_model`) and groups them (:meth:`_family_groups`); any other
    model, and every config not :func:`specialised`, the reference groups.
    """

    @abstractmethod
    def _parse(self, name: str, spec: KVCacheSpec) -> Any | None:
        """The family's cache ``name`` holds, or ``None`` when it is not one."""

    @abstractmethod
    def _is_model(self, layers: list[Any]) -> bool:
        """Whether the parsed caches of every layer make one of the family's models."""

    @abstractmethod
    def _family_groups(self, layers: list[Any]) -> list[KVCacheGroupSpec]:
        """The platform's groups of a family model's parsed caches."""

    def _model_layers(
        self, config: PlanningConfig, specs: Mapping[str, KVCacheSpec]
    ) -> list[Any] | None:
        if not specialised(config) or not specs:
            return None
        return family_layers(specs, self._parse, self._is_model)

    def get_kv_cache_groups(
        self, config: PlanningConfig, kv_cache_spec: Mapping[str, KVCacheSpec]
    ) -> list[KVCacheGroupSpec]:
        """The platform's groups for the family's models; the reference's otherwise."""
        layers = self._model_layers(config, kv_cache_spec)
        if layers is None:
            return super().get_kv_cache_groups(config, kv_cache_spec)
        return self._family_groups(layers)


class SlotPlanBuilder(ReferenceKVCacheConfigBuilder):
    """The placement of a builder that lays the groups it owns out as a :class:`SlotPlan`.

    A subclass says, in :meth:`_slot_plan`, where each cache sits in a block
    of the groups it owns; everything else (and a block count the reference
    refuses with a typed error) is the reference's.  It does not answer
    ``_get_pool_bytes_per_block``: Core learns the block stride from a
    one-block placement (:class:`SlotPoolBuilder` answers it).
    """

    @abstractmethod
    def _slot_plan(
        self, config: PlanningConfig, groups: Sequence[KVCacheGroupSpec]
    ) -> SlotPlan | None:
        """Offsets of every cache, or ``None`` when the groups are not this platform's."""

    def get_kv_cache_config_from_groups(
        self,
        config: PlanningConfig,
        kv_cache_groups: Sequence[KVCacheGroupSpec],
        num_blocks: int,
    ) -> KVCacheConfig:
        """Every group on the builder's slot plan; all groups alias one backing."""
        plan = self._slot_plan(config, kv_cache_groups)
        if plan is None or type(num_blocks) is not int or num_blocks < 1:
            # Not ours, or a block count the reference refuses with a typed error.
            return super().get_kv_cache_config_from_groups(config, kv_cache_groups, num_blocks)
        return KVCacheConfig(
            num_blocks=num_blocks,
            kv_cache_tensors=plan.tensors(num_blocks),
            kv_cache_groups=list(kv_cache_groups),
            prefix_cache_retention_interval=config.prefix_cache_retention_interval,
        )


class SlotPoolBuilder(SlotPlanBuilder):
    """A :class:`SlotPlanBuilder` that also answers ``_get_pool_bytes_per_block`` with its block."""

    def _get_pool_bytes_per_block(
        self, config: PlanningConfig, kv_cache_groups: Sequence[KVCacheGroupSpec]
    ) -> int | None:
        """The slot plan's block stride; the reference's answer for groups it does not own."""
        plan = self._slot_plan(config, kv_cache_groups)
        if plan is None:
            return super()._get_pool_bytes_per_block(config, kv_cache_groups)
        return plan.bytes_per_block
