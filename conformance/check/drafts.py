"""The draft-group clause: a drafter's attention layers of one kind share one KV cache group.

vLLM's speculative-decoding worker builds one set of attention metadata for
the draft model's attention layers, and asserts at start-up that they sit in
one KV cache group ("All drafting layers should belong to the same kv cache
group", ``validate_same_kv_cache_group`` in vLLM 0.33.0's
``llm_base_proposer.py``).  A builder that spreads EAGLE or MTP draft layers
(``is_draft`` specs) over several groups stops the engine there
(contract.md#grouping-draft-layers).

The kit binds draft layers of one spec (equal specs, ``is_draft`` aside)
and one residency (a configuration's ``host_resident_layers`` go to a host
group of their own, so a drafter it splits is bound on each side apart):
drafters whose caches are of several kinds (sliding and full attention, an
MLA layer with an indexer's and a compressor's side caches) are grouped by
kind by vLLM's own default grouping, and vLLM gives such drafters proposers
that skip the assertion (Gemma-4's, Step-3.5's).  The draft layers are
read from the specs the kit passed, never from the groups'
``is_eagle_group`` marks.
"""

from __future__ import annotations

from collections.abc import Mapping

from conformance.check.catalog import Unjudged, invariant
from conformance.check.catalog import violation as _v
from conformance.check.grouping import first_groups
from conformance.check.observations import GroupingObservation
from conformance.check.violations import Violation
from conformance.check.worker_model import first_group_of
from kvref.config import PlanningConfig
from kvref.specs import KVCacheSpec

__all__ = ["draft_kinds", "drafter_accepts_several_groups"]

_ID = "KV-GROUP-DRAFTS-TOGETHER"


def draft_kinds(
    specs: Mapping[str, KVCacheSpec], host: frozenset[str] = frozenset()
) -> dict[str, set[str]]:
    """The draft layers (``is_draft``) by equal spec and residency, named after their first layer.

    ``host`` is the configuration's ``host_resident_layers``: the contract
    puts those layers in a host group of their own, so a drafter the
    configuration splits between host and device is two kinds, each bound
    on its own side.
    """
    kinds: dict[tuple[KVCacheSpec, bool], set[str]] = {}
    for name, spec in specs.items():
        if spec.is_draft:
            kinds.setdefault((spec, name in host), set()).add(name)
    return {
        f"{type(s).__name__}{' host-resident' if h else ''} ({min(n)!r}'s spec)": n
        for (s, h), n in kinds.items()
    }


#: Target models whose MTP drafter vLLM 0.33.0 serves with a proposer that
#: accepts draft layers in several groups (it overrides
#: ``validate_same_kv_cache_group``): Step-3.5's MTP (``Step3p5MTPProposer``,
#: for ``step3p5``/``step3p7`` targets) and Gemma-4's assistant (``Gemma4Proposer``).
_SEVERAL_GROUPS_MODEL_TYPES = frozenset({"step3p5", "step3p7", "gemma4", "gemma4_text"})
_SEVERAL_GROUPS_ARCHITECTURES = frozenset({"Step3p5ForCausalLM", "Step3p7ForConditionalGeneration"})


def drafter_accepts_several_groups(config: PlanningConfig) -> bool:
    """Whether vLLM serves ``config``'s drafter with a proposer that needs no single group."""
    if config.speculative_method != "mtp":
        return False
    if config.hf("model_type") in _SEVERAL_GROUPS_MODEL_TYPES:
        return True
    architectures = config.hf("architectures")
    return (
        isinstance(architectures, tuple)
        and bool(architectures)
        and architectures[0] in _SEVERAL_GROUPS_ARCHITECTURES
    )


@invariant(
    _ID,
    "a drafter's layers of one spec all sit in one group",
    anchor="grouping-draft-layers",
    scenario="grouping",
    in_core=True,
)
def _drafts_together(obs: GroupingObservation) -> list[Violation] | Unjudged | None:
    if not obs.whole_model:
        # The profiling path groups one pipeline worker's slice, where grouping
        # may split a drafter's layers that Core's global grouping keeps
        # together (the reference does, on a worker holding only the drafter);
        # vLLM's drafter checks the planned config, not the profiling one.
        return Unjudged("one pipeline worker's slice (the profiling path) is not judged")
    if drafter_accepts_several_groups(obs.config):
        # The clause is the base proposer's; this model's proposer waives it.
        return None
    if obs.config.model_kv_cache_grouping is not None:
        # The model's own grouping hook decides the groups; the builder only echoes it.
        return Unjudged("the model declares its grouping")
    kinds = {
        k: n
        for k, n in draft_kinds(obs.specs, obs.config.host_resident_layers).items()
        if len(n) > 1
    }
    if not kinds:
        # A drafter of one layer per spec cannot be spread: counting such
        # examples would report a pass no builder could fail.
        return Unjudged("no drafter with two layers of one spec", applicable=False)
    groups = first_groups(obs)
    if groups is None:
        return None
    # A layer in no group, or in two, is KV-GROUP-PARTITION's finding: each
    # layer counts in the first group that names it.
    where = first_group_of(groups)
    out = []
    for kind, names in sorted(kinds.items()):
        placed = {n: where[n] for n in names if n in where}
        used = sorted(set(placed.values()))
        if len(used) <= 1:
            continue
        spread = "; ".join(
            f"group {i}: {sorted(n for n, g in placed.items() if g == i)[:2]}" for i in used
        )
        out.append(
            _v(
                _ID,
                f"the drafter's {len(placed)} {kind} layers are spread over groups {used} "
                f"({spread}); vLLM's drafter needs them in one group",
                layer=min(placed),
            )
        )
    return out
