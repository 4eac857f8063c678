"""Exception types raised by kvref.

Every error kvref raises on bad input or an impossible plan is a subclass of
:class:`KVRefError`, itself a :class:`ValueError`, so callers that already
catch ``ValueError`` around vLLM's planner keep working.  vLLM 0.33.0 raises a
mix of ``AssertionError``, ``ValueError``, ``NotImplementedError`` and even
``ZeroDivisionError`` for these conditions; kvref maps each of them to one
typed exception whose message names the field and the value.
"""

from __future__ import annotations

__all__ = [
    "BuilderResolutionError",
    "ConfigError",
    "ConflictingWindowError",
    "GroupingError",
    "HiSparseError",
    "IncompatibleSpecsError",
    "InsufficientMemoryError",
    "KVRefError",
    "KernelBlockError",
    "LayoutError",
    "LayoutResolutionError",
    "PageSizeUnificationError",
    "PartitionError",
    "PlacementError",
    "PlanningError",
    "SpecError",
    "UnsupportedError",
    "WorkerSpecMismatchError",
]


class KVRefError(ValueError):
    """Base class of every error kvref raises for bad input or an impossible plan."""


class SpecError(KVRefError):
    """A KV cache spec field is invalid (vLLM: ``ValueError`` or ``AssertionError``)."""


class ConfigError(KVRefError):
    """A :class:`~kvref.PlanningConfig` field, memory figure or block count is invalid."""


class BuilderResolutionError(ConfigError):
    """A builder qualname is not one, cannot be imported, or does not name a concrete builder."""


class HiSparseError(ConfigError):
    """HiSparse cannot plan this model with this config (vLLM: ``ValueError``).

    Raised for a missing or too small host pool, a layout that is not
    block-outermost, DeepSeek-V4 layers, missing sparse or indexer MLA
    layers, MLA layers of several block sizes, a hot buffer out of range,
    and hot groups of mixed page sizes; the message names the setting.
    """


class IncompatibleSpecsError(SpecError):
    """Specs cannot be merged into one (vLLM: ``AssertionError`` in ``merge``).

    Grouping treats this as "not uniform" and moves on to the next rule.
    """


class ConflictingWindowError(SpecError):
    """Full-attention specs carry two different windows or chunk sizes.

    vLLM raises ``ValueError`` here, which escapes the uniform test instead of
    being treated as "not uniform"; kvref keeps that distinction.
    """


class GroupingError(KVRefError):
    """The layers cannot be split into KV cache groups."""


class PageSizeUnificationError(GroupingError):
    """A page cannot be scaled or padded to the largest page (vLLM: ``NotImplementedError``)."""


class PartitionError(GroupingError):
    """Groups do not partition the layers: a layer is missing, repeated or unknown."""


class LayoutError(KVRefError):
    """A KV cache layout cannot express the requested placement."""


class LayoutResolutionError(LayoutError):
    """No KV cache layout meets every requirement (vLLM: ``ValueError`` or ``AssertionError``).

    Raised by layout resolution when the attention backends share no layout,
    workers report different layouts, the specs need a block-compact or a
    block-outermost layout none of the candidates is, or the environment
    override is not a candidate; the message names both sides.
    """


class KernelBlockError(LayoutError):
    """The worker cannot view a layer's cache blocks as its attention backend's kernel blocks.

    vLLM refuses it when it binds the caches (``ValueError``): a backend
    needs kernel blocks smaller than a packed (block-outermost) cache block
    and the layer's cache is not one it can re-stride, or the backend takes
    no kernel block size that divides the block.  The message names the
    layer, the block size and the backend's kernel block sizes.
    """


class PlacementError(KVRefError):
    """Groups cannot be placed into tensors for the requested number of blocks."""


class UnsupportedError(KVRefError):
    """A feature of vLLM 0.33.0 that kvref deliberately does not implement."""


class PlanningError(KVRefError):
    """The cross-worker planning flow cannot produce a consistent set of configs."""


class WorkerSpecMismatchError(PlanningError):
    """The same layer is reported with different specs by two workers."""


class InsufficientMemoryError(PlanningError):
    """Not even one request at ``max_model_len`` fits in the available memory.

    Attributes:
        max_model_len: the length that was checked.
        needed_bytes: bytes one request needs (0 when no memory is left at all).
        available_bytes: bytes left for cache blocks after the null block.
        estimated_max_model_len: the longest length that fits (0 if none does).
    """

    def __init__(
        self,
        message: str,
        *,
        max_model_len: int,
        needed_bytes: int,
        available_bytes: int,
        estimated_max_model_len: int,
    ) -> None:
        super().__init__(message)
        self.max_model_len = max_model_len
        self.needed_bytes = needed_bytes
        self.available_bytes = available_bytes
        self.estimated_max_model_len = estimated_max_model_len

    @property
    def needed_gib(self) -> float:
        """Needed memory in GiB, rounded to 2 decimals as vLLM prints it."""
        return round(self.needed_bytes / 2**30, 2)

    @property
    def available_gib(self) -> float:
        """Available memory in GiB, rounded to 2 decimals as vLLM prints it."""
        return round(self.available_bytes / 2**30, 2)
