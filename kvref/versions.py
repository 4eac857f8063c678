"""The vLLM releases kvref follows, and every planning rule that differs between them.

kvref plans as one vLLM release does; which one is a field of the planning
problem (:attr:`kvref.PlanningConfig.vllm_version`).  Everything that
differs between the supported releases is a field of :class:`Rules`, read
where the rule applies: the differences are data in this one module, never
copies of modules.  ``docs/contract.md`` marks each clause with the
releases it holds for; ``docs/vllm.md`` says where in vLLM each rule lives.
"""

from __future__ import annotations

import importlib.metadata
import re

import attrs

from kvref.errors import ConfigError

__all__ = [
    "NEWEST",
    "SUPPORTED",
    "V0_33",
    "V0_34",
    "Rules",
    "VllmVersion",
    "installed_vllm_version",
    "parse_version",
    "rules",
]

_VERSION = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?$")


@attrs.frozen(order=True)
class VllmVersion:
    """A vLLM release, ``major.minor.patch`` (ordered, so ``V0_34 > V0_33``)."""

    major: int
    minor: int
    patch: int = 0

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}.{self.patch}"

    @property
    def short(self) -> str:
        """``major.minor``, what the CLI and reports accept and print beside the full name."""
        return f"{self.major}.{self.minor}"


V0_33 = VllmVersion(0, 33, 0)
V0_34 = VllmVersion(0, 34, 0)

#: The releases kvref plans as, oldest first.
SUPPORTED: tuple[VllmVersion, ...] = (V0_33, V0_34)
#: The release a problem plans as when it names none.
NEWEST = SUPPORTED[-1]


def parse_version(value: object, field: str = "vllm_version") -> VllmVersion:
    """The supported release ``value`` names: a :class:`VllmVersion`, ``"0.34"`` or ``"0.34.0"``.

    A ``major.minor`` name means that series' supported release.

    Raises:
        ConfigError: ``value`` is not a version, or not a supported one (the
            message names ``field``, the value and the supported releases).
    """
    supported = ", ".join(str(v) for v in SUPPORTED)
    if isinstance(value, VllmVersion):
        found = value
    elif isinstance(value, str) and (match := _VERSION.match(value.strip())):
        major, minor, patch = match.groups()
        series = [v for v in SUPPORTED if (v.major, v.minor) == (int(major), int(minor))]
        if patch is None and series:
            return series[-1]
        found = VllmVersion(int(major), int(minor), int(patch or 0))
    else:
        raise ConfigError(
            f"{field}={value!r} must be a vLLM version such as '0.34' or '0.34.0' "
            f"(supported: {supported})"
        )
    if found not in SUPPORTED:
        raise ConfigError(
            f"{field}={value!r}: vLLM {found} is not supported (supported: {supported})"
        )
    return found


def installed_vllm_version() -> VllmVersion | None:
    """The supported release installed in this environment (``None``: none, or another one).

    Read from the package's metadata: nothing of vLLM is imported.
    """
    try:
        text = importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return None
    try:
        return parse_version(text.split("+")[0])
    except ConfigError:
        return None


@attrs.frozen(kw_only=True)
class Rules:
    """What one vLLM release's planning, Core and workers do, where releases differ.

    Attributes:
        version: the release.
        placement_walks_layer_specs: the default placement takes each layer's
            spec from ``layer_names`` (vLLM issue 54711 fixed), not from a
            uniform wrapper's spec map.
        fallback_covers_sliding_window_mla: the full-allocation fallback also
            promotes sliding-window MLA beside MLA when pages cannot be unified
            (an error before).
        sliding_window_mla_merge_keys: SW-MLA specs merge only with equal
            ``kv_quant_mode`` and ``alignment`` (and keep both); before, the
            merge dropped them to their defaults.
        zeroing_across_workers: ``needs_kv_cache_zeroing`` is one value for
            every worker (an OR), resolved by Core.
        drafter_decode_slot: a draft model adds one slot to
            ``max_decode_query_len``.
        spec_fields: spec fields this release has that the oldest does not, as
            ``"Class.field"`` (the class that declares it; subclasses have it
            too).  A spec that sets one to other than its default is refused
            when planned as a release without it.
        block_alignment_from_layers: the block-outermost bytes per block is
            rounded up to the alignments of the layers a worker holds only; a
            HiSparse hot group with no layer on the worker no longer adds its
            page (it did before).
        extensible_kv_cache: Core plans a capacity that it may later lower in
            place without calling the builder; the worker splits the backing
            into segments and refuses placements it cannot (docs/contract.md).
        default_block_size: the block size a deployment that gives none starts
            from before the attention backends are asked (vLLM
            ``CacheConfig.DEFAULT_BLOCK_SIZE``;
            :attr:`kvref.PlanningConfig.resolved_block_size`).
    """

    version: VllmVersion
    placement_walks_layer_specs: bool
    fallback_covers_sliding_window_mla: bool
    sliding_window_mla_merge_keys: bool
    zeroing_across_workers: bool
    drafter_decode_slot: bool
    spec_fields: frozenset[str]
    block_alignment_from_layers: bool
    extensible_kv_cache: bool
    default_block_size: int


_RULES = {
    V0_33: Rules(
        version=V0_33,
        placement_walks_layer_specs=False,
        fallback_covers_sliding_window_mla=False,
        sliding_window_mla_merge_keys=False,
        zeroing_across_workers=False,
        drafter_decode_slot=False,
        spec_fields=frozenset(),
        block_alignment_from_layers=False,
        extensible_kv_cache=False,
        default_block_size=16,
    ),
    V0_34: Rules(
        version=V0_34,
        placement_walks_layer_specs=True,
        fallback_covers_sliding_window_mla=True,
        sliding_window_mla_merge_keys=True,
        zeroing_across_workers=True,
        drafter_decode_slot=True,
        spec_fields=frozenset(
            {
                "MambaSpec.state_alignment",
                "AttentionSpec.kv_head_major_slots",
                "SlidingWindowMLASpec.non_causal_multi_token_decode",
            }
        ),
        block_alignment_from_layers=True,
        extensible_kv_cache=True,
        default_block_size=64,
    ),
}


def rules(version: object = NEWEST) -> Rules:
    """The rules of ``version`` (anything :func:`parse_version` accepts).

    Raises:
        ConfigError: not a supported version.
    """
    return _RULES[parse_version(version)]
