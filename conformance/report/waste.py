"""The report's waste section: efficiency warnings, as records (never a verdict).

What a report, a merge and a renderer read of the waste extension
(:mod:`conformance.extensions.waste`), which compares the plans and fills them in.
"""

from __future__ import annotations

import attrs

__all__ = ["LISTED", "PlanFigures", "WasteSummary", "WasteWarning"]

#: Warnings a report lists (the worst first); the count covers them all.
LISTED = 5


@attrs.frozen(kw_only=True)
class PlanFigures:
    """What one plan gives an operator, on its limiting worker.

    Attributes:
        bytes_per_block: Core's bytes per block on the limiting worker.
        need_bytes: bytes one request of ``max_model_len`` needs there.
        groups: the plan's global KV cache groups.
        num_blocks: the blocks every worker holds in its memory.
        max_model_len: the length planned for (auto-fit may lower it).
        requests: requests of ``max_model_len`` the usable blocks hold at once.
    """

    bytes_per_block: int
    need_bytes: int
    groups: int
    num_blocks: int
    max_model_len: int
    requests: float


@attrs.frozen(kw_only=True)
class WasteWarning:
    """A plan that holds far less than the reference's (the meter's ``THRESHOLD`` times).

    Attributes:
        scenario: the scenario whose example it was (``core``).
        figure: ``requests`` (fewer requests fit) or ``max_model_len`` (auto-fit
            reached a shorter length).
        ratio: the reference's figure over the builder's (``None``: the
            builder's plan holds no request at all).
        builder, reference: the two plans' figures.
        example: the readable example.
    """

    scenario: str
    figure: str
    ratio: float | None
    builder: PlanFigures
    reference: PlanFigures
    example: str

    @property
    def message(self) -> str:
        """The warning in a sentence, with both plans' numbers."""
        b, r = self.builder, self.reference
        times = "no request" if self.ratio is None else f"{self.ratio:.2f}x less"
        if self.figure == "max_model_len":
            head = (
                f"auto-fit reaches max_model_len={b.max_model_len}, {times} than the "
                f"reference's {r.max_model_len}"
            )
        else:
            head = (
                f"{times} fits: {b.requests:.2f} requests of max_model_len={b.max_model_len} "
                f"at once against the reference's {r.requests:.2f}"
            )
        return (
            f"{head} (bytes per block {b.bytes_per_block} vs {r.bytes_per_block}; per-request "
            f"need {b.need_bytes} vs {r.need_bytes} bytes; {b.groups} vs {r.groups} groups; "
            f"{b.num_blocks} vs {r.num_blocks} blocks in the same memory)"
        )


@attrs.frozen(kw_only=True)
class WasteSummary:
    """The run's waste section.

    Attributes:
        compared: core examples where both plans could be compared.
        warned: how many of them were warned about.
        worst: the worst warnings (at most :data:`LISTED`), worst first.
        note: why nothing was compared, when nothing was.
    """

    compared: int = 0
    warned: int = 0
    worst: tuple[WasteWarning, ...] = ()
    note: str | None = None
