"""Grouping invariants: ``get_kv_cache_groups`` partitions the layers into sound groups."""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from conformance.check.bounds import named_layer_specs
from conformance.check.catalog import Check, Unjudged, flag, invariant, invariant_on
from conformance.check.observations import CallResult, GroupingObservation
from conformance.check.purity import changed_input, unstable
from conformance.check.violations import Violation
from kvref.records import KVCacheGroupSpec
from kvref.specs import KVCacheSpec, MambaSpec, UniformTypeKVCacheSpecs


def returned_groups(result: CallResult) -> list[KVCacheGroupSpec] | None:
    """The groups a grouping call returned, or ``None`` when it failed."""
    return list(result.value) if result.ok else None


#: The groups one grouping call returned.
Groups = list[KVCacheGroupSpec]


def first_groups(obs: GroupingObservation) -> Groups | None:
    """The groups the observation's first call returned, or ``None`` when it failed."""
    return returned_groups(obs.first)


def grouping_invariant(
    id: str,
    title: str,
    *,
    anchor: str,
    gate: Callable[[GroupingObservation], Unjudged | None] | None = None,
) -> Callable[[Callable[[GroupingObservation, Groups], Any]], Check]:
    """Declare a check of the groups the first grouping call returned (:func:`first_groups`).

    Core's flow and the profiling path judge their grouping answers by it too;
    ``gate`` is :func:`~conformance.check.catalog.judged_on`'s.
    """
    return invariant_on(
        first_groups, id, title, anchor=anchor, scenario="grouping", in_core=True, gate=gate
    )


def each_group(
    id: str,
    title: str,
    *,
    anchor: str,
    gate: Callable[[GroupingObservation], Unjudged | None] | None = None,
) -> Callable[[Callable[[GroupingObservation, int, KVCacheGroupSpec], Iterable[Violation]]], Check]:
    """Declare a :func:`grouping_invariant` judged group by group.

    The decorated ``fn(obs, index, group)`` gives one group's findings; the
    check's are every group's, in the groups' order.
    """

    def declare(
        fn: Callable[[GroupingObservation, int, KVCacheGroupSpec], Iterable[Violation]],
    ) -> Check:
        def check(obs: GroupingObservation, groups: Groups) -> list[Violation]:
            return [v for i, g in enumerate(groups) for v in fn(obs, i, g)]

        return grouping_invariant(id, title, anchor=anchor, gate=gate)(functools.wraps(fn)(check))

    return declare


def given_specs(
    obs: GroupingObservation, group: KVCacheGroupSpec
) -> Iterator[tuple[str, KVCacheSpec, KVCacheSpec]]:
    """Each layer of ``group`` the input has: its name, its group spec and its own spec.

    A name the input lacks is KV-GROUP-UNKNOWN-LAYER's finding.
    """
    for name, kept in named_layer_specs(group):
        given = obs.specs.get(name)
        if given is not None:
            yield name, kept, given


@grouping_invariant(
    "KV-GROUP-PARTITION",
    "every input layer is in exactly one group",
    anchor="grouping-partition",
)
def _partition(obs: GroupingObservation, groups: Groups) -> list[Violation]:
    where: dict[str, int] = {}
    out = []
    for index, group in enumerate(groups):
        for name in dict.fromkeys(group.layer_names):
            if name in where and name in obs.specs:
                out.append(
                    flag(
                        f"layer is in group {where[name]} and group {index}",
                        layer=name,
                    )
                )
            where.setdefault(name, index)
    for name in obs.specs:
        if name not in where:
            out.append(flag("layer is in no group", layer=name))
    return out


@each_group(
    "KV-GROUP-UNKNOWN-LAYER",
    "groups name only layers of the input",
    anchor="grouping-partition",
)
def _unknown_layer(obs: GroupingObservation, i: int, g: KVCacheGroupSpec) -> list[Violation]:
    return [
        flag(f"group {i} names a layer the input does not have", layer=n)
        for n in g.layer_names
        if n not in obs.specs
    ]


@each_group(
    "KV-GROUP-REPEATED-LAYER",
    "no group lists a layer twice",
    anchor="grouping-partition",
)
def _repeated_layer(obs: GroupingObservation, i: int, g: KVCacheGroupSpec) -> list[Violation]:
    return [
        flag(f"group {i} lists the layer {count} times", layer=name)
        for name, count in Counter(g.layer_names).items()
        if count > 1
    ]


@each_group(
    "KV-GROUP-NONEMPTY",
    "no global group is empty",
    anchor="grouping-partition",
)
def _nonempty(obs: GroupingObservation, i: int, g: KVCacheGroupSpec) -> list[Violation]:
    if g.layer_names:
        return []
    return [flag(f"group {i} has no layer; global groups must hold layers")]


@each_group(
    "KV-GROUP-WRAPPER",
    "a uniform-type group's wrapper covers exactly its layers",
    anchor="grouping-group-specs",
)
def _wrapper(obs: GroupingObservation, i: int, g: KVCacheGroupSpec) -> list[Violation]:
    spec = g.kv_cache_spec
    if not isinstance(spec, UniformTypeKVCacheSpecs) or not g.layer_names:
        return []  # empty: KV-GROUP-NONEMPTY
    extra = [n for n in spec.kv_cache_specs if n not in g.layer_names]
    missing = [n for n in g.layer_names if n not in spec.kv_cache_specs]
    if not (extra or missing):
        return []
    return [
        flag(
            f"group {i}'s UniformTypeKVCacheSpecs covers "
            f"{sorted(spec.kv_cache_specs)[:4]}"
            f" but the group names {list(g.layer_names)[:4]} (extra {extra[:3]}, "
            f"missing {missing[:3]})",
        )
    ]


@each_group(
    "KV-GROUP-ONE-BLOCK-SIZE",
    "the layers of a group share one block size",
    anchor="grouping-group-specs",
)
def _one_block_size(obs: GroupingObservation, i: int, g: KVCacheGroupSpec) -> list[Violation]:
    sizes = sorted({s.block_size for _, s in named_layer_specs(g)})
    if len(sizes) > 1:
        return [flag(f"group {i} mixes block sizes {sizes}; one block table has one block size")]
    # The group spec's own block size is what its block table counts in
    # (a uniform-type wrapper may declare one); its layers' pages hold
    # theirs, so block b's token slots would land in other blocks' pages.
    counted = getattr(g.kv_cache_spec, "block_size", None)
    if not (sizes and isinstance(counted, int) and counted != sizes[0]):
        return []
    return [
        flag(
            f"group {i}'s spec counts {counted} tokens per block, but its layers' pages "
            f"hold {sizes[0]}: for b >= 1, block b's slots b*{counted}..b*{counted}+"
            f"{counted - 1} land in pages of block IDs other than b",
        )
    ]


@each_group(
    "KV-GROUP-LAYER-SPEC",
    "a layer's group spec stores what the layer stores and never shrinks its page",
    anchor="grouping-group-specs",
)
def _layer_spec_kept(obs: GroupingObservation, i: int, g: KVCacheGroupSpec) -> list[Violation]:
    out = []
    for name, spec, given in given_specs(obs, g):
        problems = []
        if isinstance(given, MambaSpec):
            # One state per request: the block size says nothing about its bytes.
            if spec.page_size_bytes < given.page_size_bytes:
                problems.append(
                    f"page {spec.page_size_bytes} B is smaller than the layer's state page "
                    f"of {given.page_size_bytes} B"
                )
        elif _content_per_token_shrinks(given, spec):
            # Block sizes may change (unification scales them, promotion takes the
            # full layers'), but never the bytes each token keeps.  Padding is no
            # content: promotion rescales the unpadded page (contract.md#grouping-group-specs).
            problems.append(
                f"page {spec.page_size_bytes} B for {spec.block_size} tokens keeps fewer "
                f"bytes per token than the layer's {given.page_size_bytes} B for "
                f"{given.block_size} tokens"
            )
        if spec.state_content_size_bytes != given.state_content_size_bytes or (
            spec.num_page_heads != given.num_page_heads
        ):
            problems.append(
                f"stores (H={spec.num_page_heads}, C={spec.state_content_size_bytes}) per "
                "state "
                f"where the layer stores (H={given.num_page_heads}, "
                f"C={given.state_content_size_bytes})"
            )
        if problems:
            out.append(
                flag(
                    f"group {i}'s spec for the layer shrinks or changes it: " + "; ".join(problems),
                    layer=name,
                )
            )
    return out


def _content_per_token_shrinks(given: KVCacheSpec, kept: KVCacheSpec) -> bool:
    """Whether ``kept`` stores fewer content bytes per token than ``given`` (kit's page formula).

    A padded page never holds less than its content, and padding carries no
    token, so the comparison is of the dense pages (``H * S * C``) per token.
    """
    from conformance.check.pitch import layer_page

    mine, theirs = layer_page(given), layer_page(kept)
    if mine is None or theirs is None:
        return kept.page_size_bytes * given.block_size < given.page_size_bytes * kept.block_size
    return theirs.dense * given.block_size < mine.dense * kept.block_size


@invariant(
    "KV-GROUP-INPUT-UNCHANGED",
    "grouping keeps the layer names it was given",
    anchor="hook-purity",
    scenario="grouping",
)
def _grouping_input(obs: GroupingObservation) -> list[Violation] | None:
    # The rule differs for the dict and for the spec objects in it.
    return changed_input(
        obs.mutations,
        "get_kv_cache_groups",
        "It may replace the dict's values, but not add, remove or reorder its layers, nor change "
        "a spec object or the config it was given",
    )


@invariant(
    "KV-GROUP-DETERMINISTIC",
    "grouping is deterministic and stateless",
    anchor="hook-purity",
    scenario="grouping",
)
def _grouping_deterministic(obs: GroupingObservation) -> list[Violation] | None:
    return unstable(
        obs.first,
        obs.second,
        obs.fresh,
        again="a second call on the same instance returned different groups",
        anew="a fresh instance returned different groups for the same input",
        value=list,
    )
