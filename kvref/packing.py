"""Packed grouping for block-outermost layouts with mixed page sizes (contract.md#packed-grouping).

In a block-outermost layout a block holds every layer of a group side by
side, so groups need not share one page size; they are instead balanced so
that no group is much wider than the widest one the model needs anyway.

Deliberate difference from vLLM 0.33.0: where vLLM would emit an empty group
or silently drop layers (a state bucket with several, unbalanced page sizes),
this raises :class:`~kvref.errors.GroupingError`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs

from kvref._math import cdiv
from kvref.config import PlanningConfig
from kvref.errors import GroupingError
from kvref.records import KVCacheGroupSpec
from kvref.specs import (
    CircularBufferSpec,
    KVCacheSpec,
    MambaSpec,
    SlidingWindowSpec,
    UniformTypeKVCacheSpecs,
)

__all__ = ["approximate_gcd", "get_packed_kv_cache_groups"]


def approximate_gcd(values: Sequence[int], *, lower_bound: int | None = None) -> int:
    """Pick the ``d >= lower_bound`` minimising ``Σ (d - x mod d) mod d`` (``_approximate_gcd``).

    Candidates run from ``max(1, lower_bound)`` to ``max(values)``; ties go to
    the larger ``d``; a lower bound above every value is returned as is.

    Raises:
        GroupingError: ``values`` is empty or holds a non-positive value.

    """
    if not values:
        raise GroupingError("approximate_gcd needs at least one value")
    if any(x <= 0 for x in values):
        raise GroupingError(f"approximate_gcd values must be positive, got {list(values)!r}")
    low = max(1, lower_bound if lower_bound is not None else 1)
    high = max(values)
    if low > high:
        return low
    best_d, best_pad = low, -1
    for d in range(low, high + 1):
        pad = sum((d - x % d) % d for x in values)
        if best_pad < 0 or pad <= best_pad:
            best_d, best_pad = d, pad
    return best_d


@attrs.frozen
class _Bucket:
    """Layers of one uniform type, with their page-size classes (contract.md#packed-grouping)."""

    spec: UniformTypeKVCacheSpecs
    classes: dict[int, list[str]]

    @property
    def size(self) -> int:
        return len(self.spec.kv_cache_specs)

    @property
    def balanced(self) -> bool:
        return len({len(names) for names in self.classes.values()}) == 1

    @property
    def reps(self) -> int:
        return max(len(names) for names in self.classes.values())

    def is_state(self, repeats: int | None) -> bool:
        first = self.spec.first
        if isinstance(first, (MambaSpec, CircularBufferSpec)):
            return True
        # Without a repeat pattern, sliding windows (SW-MLA included) are sized
        # by their window, not by the model's length, so they pack like states.
        return repeats is None and isinstance(first, SlidingWindowSpec)

    def widest(self, num_groups: int) -> int:
        """Page bytes of the widest of ``num_groups`` groups this bucket splits into."""
        return sum(cdiv(len(names), num_groups) * page for page, names in self.classes.items())


def _buckets(specs: Mapping[str, KVCacheSpec]) -> list[_Bucket]:
    # A layer joins the first bucket it is uniform-type with.  Every
    # same-type test is a per-spec predicate against the bucket's first spec,
    # so testing (first, spec) equals testing the whole bucket plus spec, and
    # the answer depends only on the spec: memoised, this is linear.
    members: list[dict[str, KVCacheSpec]] = []
    firsts: list[KVCacheSpec] = []
    home: dict[KVCacheSpec, int] = {}
    for name, spec in specs.items():
        index = home.get(spec)
        if index is None:
            index = next(
                (
                    i
                    for i, first in enumerate(firsts)
                    if UniformTypeKVCacheSpecs.is_uniform_type([first, spec])
                ),
                len(firsts),
            )
            if index == len(firsts):
                firsts.append(spec)
                members.append({})
            home[spec] = index
        members[index][name] = spec
    buckets = []
    for bucket in members:
        uniform = UniformTypeKVCacheSpecs.from_specs(bucket)
        if uniform is None:  # pragma: no cover - guaranteed by the loop above
            raise GroupingError(f"layers {list(bucket)[:6]} are not of one type")
        classes: dict[int, list[str]] = {}
        for name, spec in bucket.items():
            classes.setdefault(spec.page_size_bytes, []).append(name)
        buckets.append(_Bucket(spec=uniform, classes=classes))
    return buckets


def get_packed_kv_cache_groups(
    config: PlanningConfig, specs: Mapping[str, KVCacheSpec]
) -> list[KVCacheGroupSpec] | None:
    """Group layers for block-outermost packing (vLLM ``_get_packed_kv_cache_groups``).

    Returns ``None`` unless ``config.kv_cache_layout`` is block-outermost and
    the layers have more than one page size.  Every group carries a
    :class:`UniformTypeKVCacheSpecs`.

    Raises:
        GroupingError: a state bucket with several page sizes cannot be split
            without empty groups or dropped layers.

    """
    if not config.kv_cache_layout.is_block_outermost:
        return None
    if len({s.page_size_bytes for s in specs.values()}) <= 1:
        return None

    buckets = _buckets(specs)
    lower = max(
        (b.reps for b in buckets if b.balanced and len(b.classes) > 1),
        default=0,
    )
    repeats = (
        approximate_gcd([b.reps for b in buckets if b.balanced], lower_bound=lower)
        if lower
        else None
    )

    def groups_for(bucket: _Bucket) -> int:
        if bucket.balanced and repeats is not None:
            return cdiv(bucket.reps, repeats)
        return 1

    # A state bucket could go down to one layer per group, so it does not
    # widen the block; every other bucket's split is fixed by the pattern.
    anchor = max(b.widest(b.size if b.is_state(repeats) else groups_for(b)) for b in buckets)

    groups: list[KVCacheGroupSpec] = []
    for bucket in buckets:
        n = groups_for(bucket)
        if anchor > 0 and bucket.is_state(repeats):
            states_per_block = max(anchor // bucket.spec.first.page_size_bytes, 1)
            n = max(n, cdiv(bucket.size, states_per_block))
        if n == 1:
            names = tuple(bucket.spec.kv_cache_specs)
            groups.append(KVCacheGroupSpec(layer_names=names, kv_cache_spec=bucket.spec))
            continue
        groups.extend(_split(bucket, n))
    return groups


def _split(bucket: _Bucket, n: int) -> list[KVCacheGroupSpec]:
    # A "pattern repeat" is the k-th layer of every page class; groups take
    # every n-th repeat so that pipeline stages get balanced groups.
    pattern = list(zip(*bucket.classes.values(), strict=False))
    if not bucket.balanced or n > len(pattern):
        counts = {page: len(names) for page, names in bucket.classes.items()}
        raise GroupingError(
            f"cannot split the {type(bucket.spec.first).__name__} bucket of {bucket.size} "
            f"layers (first {list(bucket.spec.kv_cache_specs)[:6]}) into {n} packed groups: "
            f"its layers per page size {counts} form only {len(pattern)} whole pattern "
            "repeats, so vLLM would emit empty groups or drop layers"
        )
    layer_specs = bucket.spec.kv_cache_specs
    groups = []
    for i in range(n):
        names = [name for repeat in pattern[i::n] for name in repeat]
        uniform = UniformTypeKVCacheSpecs.from_specs({name: layer_specs[name] for name in names})
        if uniform is None:
            # The same-type test is asymmetric: a group led by another spec
            # than the bucket's first may fail it (vLLM: AssertionError).
            raise GroupingError(
                f"packed group {names[:6]} of the bucket led by "
                f"{type(bucket.spec.first).__name__} is not of one type when led by "
                f"{type(layer_specs[names[0]]).__name__}"
            )
        groups.append(KVCacheGroupSpec(layer_names=tuple(names), kv_cache_spec=uniform))
    return groups
