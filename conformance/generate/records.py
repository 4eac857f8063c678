"""The records the strategies produce: :class:`Model` and :class:`PlanningProblem`."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType

import attrs

from conformance.generate.render import config_repr, render_layers
from kvref.config import PlanningConfig
from kvref.hf import HFValue, hf_config_fields
from kvref.specs import KVCacheSpec

__all__ = ["Model", "PlanningProblem"]


def _read_only_specs(value: Mapping[str, KVCacheSpec]) -> Mapping[str, KVCacheSpec]:
    # A private, read-only copy: a builder that mutates its input (vLLM's
    # default does, contract.md#the-builder-interface) must not change the counterexample the kit
    # prints.
    return MappingProxyType(dict(value))


def _read_only_workers(
    value: Iterable[Mapping[str, KVCacheSpec]],
) -> tuple[Mapping[str, KVCacheSpec], ...]:
    return tuple(_read_only_specs(w) for w in value)


def _int_tuple(value: Iterable[int]) -> tuple[int, ...]:
    return tuple(value)


def _hidden_layers(inst: object, attribute: attrs.Attribute[int | None], value: object) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"Model.num_hidden_layers={value!r} must be None or an int >= 1")


@attrs.frozen(repr=False)
class Model:
    """A model's KV cache layers: layer name to spec, in layer order, and a description.

    ``specs`` is a read-only copy; insertion order is the model's layer order,
    which vLLM's grouping depends on.

    Attributes:
        specs: layer name to spec.
        description: for humans; starts with ``<family>:`` for generated models.
        family: the family that made the model (``vendor`` for vendor models).
        num_hidden_layers: the target's decoder-layer count, layers without a
            KV cache included (``None``: one past the highest layer index);
            pipeline splits cut between these layers.
        hf_config: the Hugging Face config fields vLLM would show a builder of
            this model (:mod:`conformance.generate.hf`), as sorted pairs.
    """

    specs: Mapping[str, KVCacheSpec] = attrs.field(converter=_read_only_specs, hash=False)
    description: str = ""
    family: str = attrs.field(default="", kw_only=True)
    num_hidden_layers: int | None = attrs.field(
        default=None, kw_only=True, validator=_hidden_layers
    )
    hf_config: tuple[tuple[str, HFValue], ...] = attrs.field(
        default=(), kw_only=True, converter=hf_config_fields
    )

    def __repr__(self) -> str:
        legend, patterns = render_layers([self.specs])
        lines = [f"Model({self.description!r}, {len(self.specs)} layers"]
        lines += [f"  {line}" for line in legend]
        if patterns[0]:
            lines.append(f"  layers: {patterns[0]}")
        return "\n".join(lines) + ")"


@attrs.frozen(repr=False)
class PlanningProblem:
    """One cross-worker planning problem: what Core feeds ``get_kv_cache_configs``.

    See contract.md#core-flow.

    Attributes:
        config: the planning config (layout, lengths, override, auto-fit, ...).
        workers: one read-only ``layer -> spec`` mapping per worker (PP stage).
        available_memory: bytes each worker profiled as free for the KV cache.
        description: how the problem was made, for humans.
        num_hidden_layers: the model's decoder-layer count (``None``: unknown).
        partition: decoder layers per worker (``()``: unknown).

    The repr is the counterexample a vendor reads: specs are listed once with
    a letter, and each worker's layers as a run-length pattern of letters.

    """

    config: PlanningConfig
    workers: tuple[Mapping[str, KVCacheSpec], ...] = attrs.field(
        converter=_read_only_workers, hash=False
    )
    available_memory: tuple[int, ...] = attrs.field(converter=_int_tuple)
    description: str = ""
    num_hidden_layers: int | None = attrs.field(default=None, kw_only=True)
    partition: tuple[int, ...] = attrs.field(default=(), kw_only=True, converter=_int_tuple)

    def __attrs_post_init__(self) -> None:
        if len(self.available_memory) != len(self.workers):
            raise ValueError(
                f"PlanningProblem: {len(self.workers)} workers but "
                f"{len(self.available_memory)} available_memory values"
            )

    @property
    def specs(self) -> Mapping[str, KVCacheSpec]:
        """Every worker's layers in one read-only mapping, in worker order."""
        merged: dict[str, KVCacheSpec] = {}
        for worker in self.workers:
            merged.update(worker)
        return MappingProxyType(merged)

    def worker_specs(self) -> list[dict[str, KVCacheSpec]]:
        """Fresh mutable copies of the workers' mappings, to hand to a builder."""
        return [dict(w) for w in self.workers]

    def __repr__(self) -> str:
        legend, patterns = render_layers(self.workers)
        lines = [f"PlanningProblem({self.description!r},", f"  config: {config_repr(self.config)}"]
        lines += [f"  {line}" for line in legend]
        for i, (pattern, avail) in enumerate(zip(patterns, self.available_memory, strict=True)):
            lines.append(
                f"  worker {i}: {pattern or '(no layers)'}; "
                f"available_memory={avail} ({avail / 2**30:.2f} GiB)"
            )
        return "\n".join(lines) + ")"
