"""Which vLLM contract a run checks, and what an unsupported installed vLLM means for a verdict.

A run judges one supported vLLM release's contract (``RunOptions.vllm``,
:mod:`kvref.versions`): its ``KVCacheConfigBuilder`` interface, its Core
flow and what its workers accept (docs/contract.md marks each clause with
the releases it holds for).  A vLLM-native builder runs against the vLLM
that is installed; when that release is one the kit does not know, the kit
still judges the run's release, so what the installed one changed may show
as failures or go unchecked.  The kit says so once per run, never as a verdict.
"""

from __future__ import annotations

from importlib import metadata

from kvref.versions import NEWEST, SUPPORTED, VllmVersion

__all__ = ["CONTRACT", "contract_name", "installed_vllm", "version_note"]


def contract_name(version: VllmVersion) -> str:
    """How reports name the contract of ``version`` (``"vLLM 0.34.0"``)."""
    return f"vLLM {version}"


#: The contract a report names when the run says none (the newest supported release's).
CONTRACT = contract_name(NEWEST)


def installed_vllm() -> str | None:
    """The installed vLLM's version, read from its metadata (vLLM is not imported)."""
    try:
        return metadata.version("vllm")
    except metadata.PackageNotFoundError:
        return None


def version_note(judged: VllmVersion, installed: str | None = None) -> str | None:
    """What an installed vLLM the kit does not support means for a run judging ``judged``.

    ``None``: nothing to say (no vLLM installed, or a supported one: a
    vLLM-native builder is then always judged under the installed release).
    ``installed`` defaults to :func:`installed_vllm`.
    """
    found = installed_vllm() if installed is None else installed
    if found is None or any(found.split("+")[0] == str(v) for v in SUPPORTED):
        return None
    supported = ", ".join(str(v) for v in SUPPORTED)
    return (
        f"vLLM {found} is installed, but this kit knows the contracts of vLLM {supported} and "
        f"judged this run by vLLM {judged}'s (docs/contract.md). A vLLM-native builder runs "
        f"against vLLM {found}'s classes and Core flow: what {found} changed may show as "
        "failures or go unchecked. Use a supported vLLM for a verdict on its contract"
    )
