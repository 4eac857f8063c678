"""Import the installed vLLM lazily, say how to install it, and keep its logger quiet.

vLLM is imported on the first call that needs it, so kvref and the kit keep
working where vLLM is not installed; the calls that need it then raise
:class:`VLLMUnavailableError` saying how to install it.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import logging
import os
import warnings
from collections.abc import Iterator
from typing import Any

import attrs

from kvref.errors import UnsupportedError
from kvref.versions import NEWEST, SUPPORTED, installed_vllm_version

__all__ = [
    "INSTALL_HINT",
    "VLLM_VERSION",
    "VLLMOutputError",
    "VLLMUnavailableError",
    "is_vllm_available",
    "keep_vllm_quiet",
    "quiet_vllm",
    "vllm_modules",
]

#: The installed vLLM release if kvref supports it, else the newest (no vLLM import).
VLLM_VERSION = str(installed_vllm_version() or NEWEST)

#: How to get a vLLM this module can use.
INSTALL_HINT = (
    f"vLLM {' or '.join(str(v) for v in SUPPORTED)} is needed: run `tox -e vllm`, or install "
    "one on a CPU machine with `scripts/install-vllm-cpu.sh [VERSION]` (torch==2.13.0, vllm "
    "--no-deps and the deps listed in requirements/vllm-cpu.txt); see docs/vllm.md"
)


class VLLMUnavailableError(UnsupportedError):
    """vLLM cannot be imported; the message says how to install it."""


class VLLMOutputError(RuntimeError):
    """What vLLM returned cannot be expressed as kvref records.

    Deliberately not a :class:`~kvref.errors.KVRefError` (nor a
    ``ValueError``): it reports a broken result, not an input that vLLM
    refused with a clear error, so the conformance kit must not take it for
    a typed refusal.
    """


@attrs.frozen
class _VLLM:
    """The vLLM modules and types the conversions use."""

    kvi: Any
    kvp: Any
    builder_module: Any
    config_module: Any
    multiple_of: Any
    version: str


def _import_vllm() -> dict[str, Any]:
    return {
        name: importlib.import_module(name)
        for name in (
            "vllm",
            "vllm.config",
            "vllm.v1.core.kv_cache_config_builder",
            "vllm.v1.core.kv_cache_planning",
            "vllm.v1.kv_cache_interface",
            "vllm.v1.attention.backend",
        )
    }


@functools.lru_cache(maxsize=1)
def vllm_modules() -> _VLLM:
    """Import the parts of vLLM that planning needs (once; importing vLLM takes seconds).

    Raises:
        VLLMUnavailableError: vLLM (or one of its dependencies) cannot be imported.
    """
    # A machine without network must not try to reach the Hugging Face hub.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        with warnings.catch_warnings():
            # What vLLM's import warns of (torch's deprecations) is vLLM's, not the
            # caller's: under pytest it was printed before the session began.
            warnings.simplefilter("ignore", DeprecationWarning)
            modules = _import_vllm()
    except ImportError as exc:
        raise VLLMUnavailableError(f"cannot import vLLM ({exc}). {INSTALL_HINT}") from exc
    vllm = modules["vllm"]
    kvi = modules["vllm.v1.kv_cache_interface"]
    kvp = modules["vllm.v1.core.kv_cache_planning"]
    builder_module = modules["vllm.v1.core.kv_cache_config_builder"]
    config_module = modules["vllm.config"]
    VMultipleOf = modules["vllm.v1.attention.backend"].MultipleOf  # noqa: N806 - a class
    version = str(getattr(vllm, "__version__", "unknown"))
    return _VLLM(
        kvi=kvi,
        kvp=kvp,
        builder_module=builder_module,
        config_module=config_module,
        multiple_of=VMultipleOf,
        version=version,
    )


def is_vllm_available() -> bool:
    """Whether :func:`vllm_modules` can import vLLM."""
    try:
        vllm_modules()
    except VLLMUnavailableError:
        return False
    return True


#: Whether this process keeps vLLM's logger at ERROR for good (see :func:`keep_vllm_quiet`).
_QUIET = {"for_good": False}


def keep_vllm_quiet() -> None:
    """Leave vLLM's logger at ERROR after every :func:`quiet_vllm` block of this process.

    For processes that exist only to plan (the kit's CLI, its worker and twin
    processes): setting a logger's level clears the cache of every logger of
    the process (hundreds once vLLM and torch are imported), which two
    thousand planning calls a run paid twice each.
    """
    _QUIET["for_good"] = True


@contextlib.contextmanager
def quiet_vllm() -> Iterator[None]:
    """Keep vLLM's logger at ERROR for the duration of the block."""
    # vLLM logs every padding layer, override and auto-fit at INFO; a kit run
    # makes thousands of planning calls, so keep only its errors.
    logger = logging.getLogger("vllm")
    level = logger.level
    if level != logging.ERROR:
        # vLLM's import configures its logger afresh: set it on every block.
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        if not _QUIET["for_good"] and level != logging.ERROR:
            logger.setLevel(level)
