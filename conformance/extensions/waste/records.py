"""The report's waste section: efficiency warnings, as records (never a verdict).

What a report holds (``Report.waste``), a merge joins (``conformance.ci.merge``)
and the text report shows (:func:`section_lines`) of the waste extension
(:mod:`conformance.extensions.waste`), whose meter compares the plans and fills them in.
"""

from __future__ import annotations

import attrs

__all__ = ["LISTED", "PlanFigures", "WasteSummary", "WasteWarning", "section_lines"]

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
        message: the warning in a sentence, with both plans' numbers (made
            from the fields above, never given).
    """

    scenario: str
    figure: str
    ratio: float | None
    builder: PlanFigures
    reference: PlanFigures
    example: str

    # A field, not a property: the JSON report carries each warning's sentence
    # (``attrs.asdict``), as the text report shows it.
    message: str = attrs.field(init=False)

    @message.default
    def _message(self) -> str:
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


def section_lines(waste: WasteSummary | None) -> list[str]:
    """The text report's "Waste" section: efficiency warnings, which never change a verdict."""
    if waste is None:
        return []
    if not waste.compared:
        return ["", f"Waste: nothing compared ({waste.note})"]
    if not waste.warned:
        return [
            "",
            f"Waste: none: on {waste.compared} core plans compared with the reference's, "
            "every plan holds at least half of what the reference's holds",
        ]
    lines = [
        "",
        f"Waste (warnings, no verdict): {waste.warned} of {waste.compared} core plans hold "
        "less than half of what the reference's plan holds in the same memory; the worst:",
    ]
    for w in waste.worst:
        # The example's first line names its family and shape; the JSON has all of it.
        lines += [f"  - {w.message}", f"    example: {w.example.splitlines()[0][:200]}"]
    return lines
