"""Compact, readable reprs of models and problems: the counterexamples a vendor reads.

Specs print with only the fields that differ from their defaults; layers
print once per distinct ``(name template, spec)`` with a letter, and each
worker as a run-length pattern of letters (``(A*5 B)*10 A*2``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import torch

from conformance.check.geometry import round_up
from kvref.config import PlanningConfig
from kvref.layout import KVCacheLayout
from kvref.specs import (
    AttentionSpec,
    KVCacheSpec,
    MLAAttentionSpec,
    MultipleOf,
    SlidingWindowMLASpec,
)

__all__ = ["config_repr", "names_repr", "render_layers", "spec_repr"]

_INDEXED_NAME = re.compile(r"^(.*?)(\d+)(.*)$")
#: Longest run of missing layer indices a pattern bridges with "-" units.
_MAX_GAP = 4


def _value_repr(value: object) -> str:
    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    if isinstance(value, MultipleOf):
        return f"MultipleOf({value.n})"
    if isinstance(value, KVCacheLayout):
        return value.name
    if isinstance(value, frozenset):
        return "{" + names_repr(sorted(value)) + "}"
    if isinstance(value, tuple):
        inner = ", ".join(_value_repr(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    return repr(value)


def _derived_default(spec: KVCacheSpec, name: str, value: object) -> bool:
    """Whether ``value`` of field ``name`` is what the spec computes by itself."""
    if name == "head_size_v" and isinstance(spec, AttentionSpec):
        mla = isinstance(spec, (MLAAttentionSpec, SlidingWindowMLASpec))
        return value == (0 if mla else spec.head_size)
    if name == "page_size_padded":
        alignment = getattr(spec, "alignment", None)
        # MLA alignment padding is recomputed from ``alignment`` (contract.md#spec-kinds).
        return alignment is not None and value == round_up(spec.real_page_size_bytes, alignment)
    return False


def spec_repr(spec: KVCacheSpec) -> str:
    """``Class(field=value, ...)`` with only the fields that differ from their defaults."""
    parts = []
    for field in attrs.fields(type(spec)):
        if not field.init:
            continue
        value = getattr(spec, field.name)
        if field.default is not attrs.NOTHING and value == field.default:
            continue
        if _derived_default(spec, field.name, value):
            continue
        parts.append(f"{field.name}={_value_repr(value)}")
    return f"{type(spec).__name__}({', '.join(parts)})"


def config_repr(config: PlanningConfig) -> str:
    """``PlanningConfig(field=value, ...)`` with only the fields that differ from their defaults."""
    parts = [
        f"{field.name}={_value_repr(getattr(config, field.name))}"
        for field in attrs.fields(PlanningConfig)
        if field.init and not _is_default(config, field)
    ]
    return f"PlanningConfig({', '.join(parts)})"


def _is_default(config: PlanningConfig, field: attrs.Attribute[Any]) -> bool:
    value = getattr(config, field.name)
    default: Any = field.default
    if not isinstance(default, attrs.Factory):  # type: ignore[arg-type]
        return bool(value == default)
    if field.name == "kv_cache_layout":
        # Left to planning, the layout is not an argument; given, it is one
        # unless it is what a config describing no resolution defaults to.
        return config.resolves_kv_cache_layout or (
            not config.describes_kv_cache_layout and value == default.factory(config)
        )
    made = default.factory(config) if default.takes_self else default.factory()
    return bool(value == made)


def _ranges(indices: Sequence[int]) -> str:
    out: list[str] = []
    start = prev = indices[0]
    for i in [*indices[1:], None]:
        if i is not None and i == prev + 1:
            prev = i
            continue
        out.append(str(start) if start == prev else f"{start}..{prev}")
        if i is not None:
            start = prev = i
    return ",".join(out)


def names_repr(names: Sequence[str]) -> str:
    """Layer names with the same template folded: ``model.layers.{0..3,7}.self_attn.attn``."""
    by_template: dict[tuple[str, str], list[int]] = {}
    plain: list[str] = []
    for name in names:
        match = _INDEXED_NAME.match(name)
        if match is None:
            plain.append(name)
        else:
            by_template.setdefault((match[1], match[3]), []).append(int(match[2]))
    folded = [
        f"{prefix}{{{_ranges(sorted(indices))}}}{suffix}"
        for (prefix, suffix), indices in by_template.items()
    ]
    return ", ".join(folded + plain)


def _letters(n: int) -> str:
    out = ""
    n += 1
    while n:
        n, rem = divmod(n - 1, 26)
        out = chr(ord("A") + rem) + out
    return out


def _compress(seq: Sequence[str]) -> str:
    """Run-length encode ``seq`` with repeated patterns: ``(A*5 B)*10 A*2``."""
    out: list[str] = []
    i, n = 0, len(seq)
    while i < n:
        best_period, best_reps = 1, 1
        for period in range(1, (n - i) // 2 + 1):
            covered = period
            while i + covered < n and seq[i + covered] == seq[i + covered - period]:
                covered += 1
            reps = covered // period
            if reps >= 2 and reps * period > best_reps * best_period:
                best_period, best_reps = period, reps
        if best_reps == 1:
            out.append(seq[i])
        elif best_period == 1:
            unit = seq[i] if "+" not in seq[i] else f"({seq[i]})"
            out.append(f"{unit}*{best_reps}")
        else:
            out.append(f"({_compress(seq[i : i + best_period])})*{best_reps}")
        i += best_period * best_reps
    return " ".join(out)


def render_layers(
    workers: Sequence[Mapping[str, KVCacheSpec]],
) -> tuple[list[str], list[str]]:
    """Return a legend of distinct ``(name template, spec)`` and a compact pattern per worker.

    Layers ``prefix{i}suffix`` with consecutive ``i`` form one segment,
    printed as ``[lo..hi]`` and a pattern of per-index units (``S+X`` when
    one index holds several layers, as in encoder-decoder models; ``-`` for
    an index without a KV cache layer).
    """
    labels: dict[tuple[str, str, KVCacheSpec, bool], str] = {}
    legend: list[str] = []

    def label(prefix: str, suffix: str, spec: KVCacheSpec, template: str) -> str:
        key = (prefix, suffix, spec, spec.is_draft)
        if key not in labels:
            labels[key] = _letters(len(labels))
            legend.append(f"{labels[key]} = {template}: {spec_repr(spec)}")
        return labels[key]

    return legend, [_worker_pattern(worker, label) for worker in workers]


@attrs.define
class _Segment:
    """Consecutive layers ``prefix{lo..hi}...``; ``units[k]`` are the labels at index ``lo + k``."""

    prefix: str | None
    lo: int
    hi: int
    units: list[list[str]]

    def render(self) -> str:
        if self.prefix is None:  # a name without an index
            return self.units[0][0]
        span = f"[{self.lo}]" if self.lo == self.hi else f"[{self.lo}..{self.hi}]"
        return f"{span} {_compress(['+'.join(u) for u in self.units])}"


def _worker_pattern(
    worker: Mapping[str, KVCacheSpec], label: Callable[[str, str, KVCacheSpec, str], str]
) -> str:
    segments: list[_Segment] = []
    for name, spec in worker.items():
        match = _INDEXED_NAME.match(name)
        if match is None:
            segments.append(_Segment(None, -1, -1, [[label(name, "", spec, name)]]))
            continue
        prefix, index, suffix = match[1], int(match[2]), match[3]
        letter = label(prefix, suffix, spec, f"{prefix}{{i}}{suffix}")
        last = segments[-1] if segments else None
        if last is not None and last.prefix == prefix and index == last.hi:
            last.units[-1].append(letter)
        elif last is not None and last.prefix == prefix and 0 < index - last.hi <= _MAX_GAP + 1:
            # Short gaps (layers without KV cache, e.g. MLPs) print as "-".
            last.units.extend([["-"]] * (index - last.hi - 1))
            last.units.append([letter])
            last.hi = index
        else:
            segments.append(_Segment(prefix, index, index, [[letter]]))
    return ", ".join(seg.render() for seg in segments)
