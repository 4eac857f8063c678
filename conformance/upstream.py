"""vLLM's documented defects, the releases that carry each, and how a failure is matched to one.

A vendor's vLLM-native builder that calls ``super()`` ships vLLM's own code,
defects included: such a failure stays a failure (the vendor ships it), but
the report names the upstream defect it matches, so a vendor can tell its
own bugs from upstream's at a glance.

A failure matches a defect when three things hold on the minimal
counterexample: the failing invariant is one the defect breaks, the inputs
have the defect's shape (its *signature*, below), and vLLM's own
``DefaultKVCacheConfigBuilder`` fails the same invariant on the same inputs
(the caller checks that last one by running it), and the release the run
judges (the example's ``PlanningConfig.vllm_version``) is one that carries the
defect.  The defects are described in docs/vllm.md ("Differences between
kvref and vLLM").

Which releases carry each defect was read from each release's own code:
vLLM 0.34.0's default placement walks a group's ``layer_names`` with their
per-layer specs (``get_kv_cache_config_from_groups``), so the projection
defect is gone there; its per-layer block strides in layer-outer layouts are
unchanged, so the stride alias is still there (and 0.34.0's worker refuses
such a placement outright under the extensible KV cache).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from kvref.specs import KVCacheSpec
from kvref.versions import V0_33, V0_34, VllmVersion

__all__ = ["DEFECTS", "UpstreamDefect", "defects_of", "matching_defect"]


@attrs.frozen
class UpstreamDefect:
    """One documented defect of vLLM's default planning.

    Attributes:
        key: a stable name (used in the report and the expectations manifest).
        title: what goes wrong, in a line.
        invariants: the invariants it breaks.
        doc: where docs/vllm.md describes it.
        issue: the upstream issue, when one is known.
        signature: whether an example has the inputs the defect needs.
        versions: the supported releases whose default planning carries it.
    """

    key: str
    title: str
    invariants: frozenset[str]
    doc: str
    issue: str | None
    signature: Callable[[Any], bool] = attrs.field(eq=False, repr=False)
    versions: frozenset[VllmVersion] = frozenset({V0_33})

    def invariants_in(self, version: VllmVersion) -> frozenset[str]:
        """The invariants it breaks under ``version`` (those the release judges at all)."""
        return frozenset(i for i in self.invariants if _FIRST_RELEASE.get(i, V0_33) <= version)

    @property
    def releases(self) -> str:
        """The releases that carry it, oldest first (``"0.33.0, 0.34.0"``)."""
        return ", ".join(str(v) for v in sorted(self.versions))

    def describe(self) -> str:
        """One line for the report."""
        issue = f", {self.issue}" if self.issue else ""
        return f"vLLM {self.releases} defect {self.key}: {self.title} ({self.doc}{issue})"


#: Invariants judged from a release on only (the rules of 0.34.0's worker under
#: the extensible KV cache; N/A before it).
_FIRST_RELEASE: Mapping[str, VllmVersion] = {
    "KV-WORKER-LAYER-REGIONS": V0_34,
    "KV-WORKER-BLOCK-SEGMENTS": V0_34,
    "KV-WORKER-COMMITTED": V0_34,
    "KV-WORKER-POOL-BYTES": V0_34,
}


def _pipelined(example: Any) -> bool:
    # The projection defect needs a group whose layers all live on other workers.
    return len(getattr(example, "workers", ())) > 1


def _mixed_alignment(specs: Mapping[str, KVCacheSpec]) -> bool:
    strides: dict[int, set[int]] = {}
    for spec in specs.values():
        strides.setdefault(spec.page_size_bytes, set()).add(spec.block_stride)
    return any(len(found) > 1 for found in strides.values())


def _config(example: Any) -> Any:
    # A serving example carries its planning problem.
    return getattr(example, "config", None) or getattr(
        getattr(example, "example", None), "config", None
    )


def _aliasing_strides(example: Any) -> bool:
    layout = getattr(_config(example), "kv_cache_layout", None)
    if layout is None or layout.is_block_outermost:
        return False
    workers: Sequence[Mapping[str, KVCacheSpec]] = getattr(example, "workers", ())
    # Several scenarios place every worker's layers together (one plan of the
    # merged specs): the strides can differ across workers too.
    merged = {name: spec for worker in workers for name, spec in worker.items()}
    return _mixed_alignment(merged)


#: The defects docs/vllm.md documents, by key.
DEFECTS: tuple[UpstreamDefect, ...] = (
    UpstreamDefect(
        key="pp-empty-group-projection",
        title=(
            "pipeline-parallel projection of a uniform-type group with no layers on a worker "
            "keeps the global wrapper, so that worker gets a tensor for layers it does not hold"
        ),
        # Core's per-worker check sees it, and so does the placement of one
        # pipeline stage (placement and device scenarios): a tensor of a layer
        # the stage has no group for, its bytes past the stage's own layers',
        # no view the stage can build for it.
        invariants=frozenset(
            {
                "KV-CORE-WORKER-LAYERS",
                "KV-PLACE-UNKNOWN-LAYER",
                "KV-PLACE-SIZE-BOUND",
                "KV-DEV-VIEWS",
            }
        ),
        doc="docs/vllm.md#differences-between-kvref-and-vllm (b)",
        issue="vLLM issue 54711",
        signature=_pipelined,
        # Fixed in 0.34.0's default placement (it walks layer_names).
        versions=frozenset({V0_33}),
    ),
    UpstreamDefect(
        key="layer-outer-stride-alias",
        title=(
            "in layer-outer layouts, layers of one page size that ask for different "
            "block_stride_alignment get different block strides, so distinct block IDs alias"
        ),
        invariants=frozenset(
            {
                "KV-PLACE-NO-BLOCK-ALIAS",
                "KV-PLACE-NO-LAYER-OVERLAP",
                "KV-PLACE-PAGE-PITCH",
                "KV-DEV-TAGS",
                "KV-SERVE-ISOLATION",
                "KV-SERVE-POOL",
                # 0.34.0's worker refuses the placement outright: tensors that
                # start a layer region at one offset with other block strides.
                "KV-WORKER-LAYER-REGIONS",
            }
        ),
        doc="docs/vllm.md#differences-between-kvref-and-vllm (c)",
        issue=None,
        signature=_aliasing_strides,
        versions=frozenset({V0_33, V0_34}),
    ),
)


def defects_of(version: VllmVersion) -> tuple[UpstreamDefect, ...]:
    """The documented defects ``version``'s default planning carries."""
    return tuple(d for d in DEFECTS if version in d.versions)


def matching_defect(invariant: str, example: Any) -> UpstreamDefect | None:
    """The documented defect whose release, invariants and signature fit this failure.

    ``None``: none does.  The release is the one the example plans as (its
    config's ``vllm_version``; an example without one, the oldest).  The
    caller must still confirm that vLLM's own default builder fails
    ``invariant`` on ``example``: the shape alone proves nothing.
    """
    version = getattr(_config(example), "vllm_version", V0_33)
    for defect in defects_of(version):
        if invariant in defect.invariants_in(version) and defect.signature(example):
            return defect
    return None
