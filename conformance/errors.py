"""Errors of the kit itself, as opposed to findings about the builder.

A conformance verdict is a claim about the builder.  When the kit's own code
fails (the vLLM adapter cannot express an input it drew, a converter breaks,
the twin process cannot be driven), no verdict can be given: the run stops
with :class:`KitError`, which every front end reports as an internal error
(the CLI exits 2), never as a failing or inherited invariant.
"""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Iterator

__all__ = ["REPORT_HINT", "BuilderKitError", "KitError", "OptionError", "kit_side"]

#: What every front end asks of a user who meets a :class:`KitError`.
REPORT_HINT = (
    "this is a bug in kvref's conformance kit, not a finding about the builder; "
    "please report it with the command line and the traceback above"
)


class OptionError(ValueError):
    """An option of the run has a value the kit cannot use."""


class KitError(RuntimeError):
    """The kit's own code failed; the run cannot give a verdict.

    Attributes:
        where: which part of the kit failed (``"vLLM adapter"``, ``"twin process"``...).
        detail: the traceback of the failure, as text (it may come from another process).
        hint: what a front end tells the user to do about it.
    """

    hint: str = REPORT_HINT

    def __init__(self, where: str, message: str, detail: str = "") -> None:
        super().__init__(f"internal error in the kit ({where}): {message}")
        self.where = where
        self.detail = detail

    def __reduce__(self) -> tuple[object, ...]:
        # Crosses the worker's pipe intact (the default reduce passes only args).
        return (_rebuild, (self.where, str(self), self.detail))


class BuilderKitError(RuntimeError):
    """A :class:`KitError` that the builder's own code raised: the builder's failure.

    A builder can import the kit and raise its error class, to end its run
    as the kit's failure (exit 2, no verdict) instead of failing.  Where the
    kit knows that only the builder's code ran (inside a vLLM-native hook,
    vLLM's Core calling the builder, a hook in the twin process), such an
    error becomes this one, which the checks report as the builder's
    exception (``KV-CALL-RAISES``).
    """

    @classmethod
    def of(cls, exc: KitError) -> BuilderKitError:
        """The builder's ``exc``, named as the builder raised it."""
        return cls(f"the builder raised the kit's own KitError: {exc}")


def _rebuild(where: str, text: str, detail: str) -> KitError:
    made = KitError(where, "", detail)
    made.args = (text,)
    return made


@contextlib.contextmanager
def kit_side(where: str, what: str) -> Iterator[None]:
    """Turn any exception raised inside into a :class:`KitError` about ``where``.

    Wrap only the kit's own work (converting the kit's inputs for a builder,
    decoding a twin's answer): an exception there says nothing about the builder.
    """
    try:
        yield
    except KitError:
        raise
    except Exception as exc:
        detail = "".join(traceback.format_exception(exc))
        raise KitError(where, f"{what}: {type(exc).__name__}: {exc}", detail) from exc
