"""Which vLLM contract the kit checks, and what another installed vLLM means for a verdict.

The invariants, their reasons and the generated problems follow vLLM
0.33.0's ``KVCacheConfigBuilder`` interface and Core flow (docs/contract.md).
A vLLM-native builder is run against the vLLM that is installed: its spec
classes, its ``VllmConfig`` and its Core flow.  With another release there,
the kit still judges 0.33.0's contract, so a verdict says whether the
builder keeps 0.33.0's rules; what that release changed may show as
failures or go unchecked.  The kit says so once per run, never as a verdict.
"""

from __future__ import annotations

from importlib import metadata

#: The vLLM release whose builder contract the kit checks.
CONTRACT_VLLM = "0.33.0"
#: How reports name it.
CONTRACT = f"vLLM {CONTRACT_VLLM}"


def installed_vllm() -> str | None:
    """The installed vLLM's version, read from its metadata (vLLM is not imported)."""
    try:
        return metadata.version("vllm")
    except metadata.PackageNotFoundError:
        return None


def version_note(installed: str | None = None) -> str | None:
    """What an installed vLLM other than 0.33.0 means for the run (``None``: nothing to say).

    ``installed`` defaults to :func:`installed_vllm`; no vLLM installed is
    nothing to say (kvref-native builders need none).
    """
    found = installed_vllm() if installed is None else installed
    if found is None or found == CONTRACT_VLLM:
        return None
    return (
        f"vLLM {found} is installed, but this kit checks the {CONTRACT} builder contract "
        "(docs/contract.md). A vLLM-native builder runs against vLLM "
        f"{found}'s classes and Core flow, and is judged by {CONTRACT_VLLM}'s rules: what "
        f"{found} changed in the interface may show as failures or go unchecked. "
        f"Use vLLM {CONTRACT_VLLM} for a verdict on that contract"
    )
