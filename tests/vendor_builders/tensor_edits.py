"""Form-free edits of a placement's tensors, for builders of both forms.

A test builder's bug (or legal variation) is often a rewrite of the
tensors it placed: split them into one tensor per layer, move a layer
region, grow the backing.  Which bytes move is the same whether the tensors
are kvref's (tests/*_builders.py, tests/vendor_builders) or vLLM's
(tests/vllm/native_builders); only the copy-with-changes differs, so every
function takes the form's ``replace`` (``attrs.evolve`` or
``dataclasses.replace``) or tensor class.  Plain Python only, so that either
form imports it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

__all__ = [
    "first_slot_apart",
    "grown",
    "last_region_past_gap",
    "one_layer_tensors",
    "pools_per_layer",
]

_T = TypeVar("_T")


def one_layer_tensors(
    tensors: Iterable[_T],
    keep: Callable[[_T], bool],
    replace: Callable[..., _T],
    **changes: Callable[[_T], int],
) -> list[_T]:
    """``tensors``, each one ``keep`` does not keep split into one tensor per layer.

    Each layer keeps its bytes: its tensor starts where its page did
    (``offset + i * layer_stride``); ``changes`` compute, from the tensor
    split, the other fields the one-layer tensors record.  ``replace`` is the
    form's copy-with-changes (``attrs.evolve`` for kvref's tensors,
    ``dataclasses.replace`` for vLLM's).
    """
    out: list[_T] = []
    for t in tensors:
        if keep(t):
            out.append(t)
            continue
        out += [
            replace(
                t,
                layers=[name],
                offset=t.offset + i * t.layer_stride,  # type: ignore[attr-defined]
                **{field: change(t) for field, change in changes.items()},
            )
            for i, name in enumerate(t.layers)  # type: ignore[attr-defined]
        ]
    return out


def grown(device: Iterable[_T], replace: Callable[..., _T], size: int, shift: int = 0) -> list[_T]:
    """Each tensor ``size`` bytes larger, starting ``shift`` bytes later."""
    return [
        replace(t, size=t.size + size, offset=t.offset + shift)  # type: ignore[attr-defined]
        for t in device
    ]


def last_region_past_gap(
    device: Sequence[Any], num_blocks: int, replace: Callable[..., _T]
) -> list[_T]:
    """The last layer region moved past one page per block of scratch (layer-outer layouts).

    Every tensor's backing grows by the gap; the layers at the last region
    become tensors of their own past it.
    """
    last = max(t.offset + i * t.layer_stride for t in device for i in range(len(t.layers)))
    gap = num_blocks * device[0].block_stride
    moved: list[_T] = []
    for t in device:
        starts = [t.offset + i * t.layer_stride for i in range(len(t.layers))]
        kept = [n for n, at in zip(t.layers, starts, strict=True) if at != last]
        if kept:
            moved.append(replace(t, size=t.size + gap, layers=kept))
        # Layers at the last region become tensors of their own past the gap.
        moved += [
            replace(t, size=t.size + gap, layers=[n], offset=last + gap)
            for n, at in zip(t.layers, starts, strict=True)
            if at == last
        ]
    return moved


def pools_per_layer(device: Iterable[Any], num_blocks: int, tensor: Callable[..., _T]) -> list[_T]:
    """Every layer a pool of its own in one backing, stepping its page (block-outermost layouts).

    In block-outermost layouts a tensor's layers are one page apart: each
    layer's pool is ``num_blocks`` of its pages, the pools back to back.
    """
    placed: list[tuple[str, int, int]] = []
    offset = 0
    for t in device:
        for name in t.layers:
            placed.append((name, t.layer_stride, offset))
            offset += num_blocks * t.layer_stride
    return [
        tensor(
            size=offset,
            layers=[name],
            layer_stride=num_blocks * page,
            block_stride=page,
            offset=at,
        )
        for name, page, at in placed
    ]


def first_slot_apart(
    device: Iterable[Any], slot: int, total: int, replace: Callable[..., _T]
) -> list[_T]:
    """Every layer a tensor of its own, the first ``slot`` bytes one allocation, the rest another.

    A layer in the first slot keeps its offset in an allocation of ``slot``
    bytes; any other moves ``slot`` bytes down in one of ``total - slot``.
    """
    out: list[_T] = []
    for t in device:
        for i, name in enumerate(t.layers):
            at = t.offset + i * t.layer_stride
            first = at < slot
            out.append(
                replace(
                    t,
                    layers=[name],
                    size=slot if first else total - slot,
                    offset=at if first else at - slot,
                )
            )
    return out
