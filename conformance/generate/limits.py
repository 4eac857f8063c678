"""What a builder cannot be asked: the one rule for inputs the kit must not draw for it.

A builder (or the adapter that carries it, such as the vLLM adapter) may
declare capabilities it lacks, on its class (``kvref_unsupported``) or with
``--unsupported``.  Two kinds of consequence follow, both decided here:

- an invariant that ``requires`` a lacking capability is not judged (SKIP,
  with the reason);
- an input the builder cannot be given is never drawn for it.  Drawing it
  anyway and then judging how the builder coped would blame the builder for
  the kit's own choice (contract.md#hook-calls: valid inputs only).

Capabilities:

``host_resident``
    host-resident groups at all: the host invariants are skipped and no
    example keeps layers on the host outside HiSparse.
``host_outside_hisparse``
    host-resident layers named by the config (``host_resident_layers``)
    outside HiSparse.  vLLM 0.33.0 keeps groups on the host only as
    HiSparse's source storage, so its adapter lacks this one: examples drop
    such layers, and the host scenario draws only HiSparse models, on which
    the host invariants are still judged.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from conformance.errors import OptionError
from kvref.config import PlanningConfig
from kvref.versions import NEWEST, VllmVersion

__all__ = [
    "CAPABILITIES",
    "HOST_OUTSIDE_HISPARSE",
    "HOST_RESIDENT",
    "NO_LIMITS",
    "Limits",
    "declared_unsupported",
]

HOST_RESIDENT = "host_resident"
HOST_OUTSIDE_HISPARSE = "host_outside_hisparse"

#: Every capability a builder may declare it lacks, with what that means.
CAPABILITIES: dict[str, str] = {
    HOST_RESIDENT: "host-resident groups (generic and HiSparse's host pool)",
    HOST_OUTSIDE_HISPARSE: "host-resident layers outside HiSparse",
}


def declared_unsupported(builder: object) -> tuple[str, ...]:
    """The capabilities ``builder`` declares it lacks (``kvref_unsupported``), as names.

    A lone name is one capability, not its letters.
    """
    declared = getattr(builder, "kvref_unsupported", ()) or ()
    return (declared,) if isinstance(declared, str) else tuple(str(c) for c in declared)


@attrs.frozen
class Limits:
    """What one run may give its builder: the capabilities it lacks, and the vLLM release.

    Attributes:
        lacking: the capabilities the builder lacks.
        vllm: the vLLM release the run judges against: every config drawn for
            the builder plans as that release (``PlanningConfig.vllm_version``).
    """

    lacking: frozenset[str] = frozenset()
    vllm: VllmVersion = NEWEST

    @classmethod
    def of(
        cls, builder: object, unsupported: Iterable[str] = (), vllm: VllmVersion = NEWEST
    ) -> Limits:
        """What ``builder`` lacks (``kvref_unsupported``, ``unsupported``), at release ``vllm``.

        An isolated builder's proxy carries the declaration as data.

        Raises:
            OptionError: the declaration names a capability the kit does not
                know (a misspelt one would otherwise be ignored, and the
                invariants it meant to opt out of judged).
        """
        declared = declared_unsupported(builder)
        unknown = sorted(c for c in declared if c not in CAPABILITIES)
        if unknown:
            raise OptionError(
                f"the builder's kvref_unsupported names {', '.join(map(repr, unknown))}: not a "
                f"capability the kit knows ({', '.join(CAPABILITIES)})"
            )
        return cls(frozenset(declared) | frozenset(unsupported), vllm)

    @property
    def host_layers_allowed(self) -> bool:
        """Whether a config may name ``host_resident_layers`` outside HiSparse."""
        return not self.lacking & {HOST_RESIDENT, HOST_OUTSIDE_HISPARSE}

    def fit(self, config: PlanningConfig) -> PlanningConfig:
        """``config`` at the run's release, without what the builder cannot be given.

        HiSparse is left alone.
        """
        if config.vllm_version != self.vllm:
            # with_vllm_version keeps whether planning resolves the layout.
            config = config.with_vllm_version(self.vllm)
        if config.host_resident_layers and config.hisparse is None and not self.host_layers_allowed:
            return attrs.evolve(config, host_resident_layers=frozenset(), host_pool_bytes=None)
        return config

    def draws_generic_host(self) -> bool:
        """Whether the host scenario may draw generic host residency (outside HiSparse)."""
        return self.host_layers_allowed


#: A builder that lacks nothing.
NO_LIMITS = Limits()
