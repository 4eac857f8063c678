"""Dtypes, field validators and converters shared by the spec kinds of :mod:`kvref.specs`.

Import the names from :mod:`kvref.specs`: the spec kinds live in the
``kvref._spec_*`` modules only to keep each module small, and every public
class names ``kvref.specs`` as its module (see :func:`homed`), so reprs of
types, pickles and printed counterexamples read ``kvref.specs.X`` whichever
module defines ``X``.
"""

from __future__ import annotations

import sys
from fractions import Fraction
from typing import TYPE_CHECKING, Any, TypeGuard, TypeVar

import attrs

from kvref.errors import SpecError

if TYPE_CHECKING:
    import torch

__all__ = [
    "HOME",
    "MultipleOf",
    "alignment_validator",
    "boolean",
    "convert_tokens_per_state",
    "dtype_size",
    "homed",
    "is_int",
    "is_torch_dtype",
    "non_negative",
    "optional_positive",
    "optional_str",
    "positive",
    "to_dtype",
    "tokens_per_state_validator",
]

#: The module every spec class and helper of the public surface names as its own.
HOME = "kvref.specs"

_T = TypeVar("_T")


def homed(obj: _T) -> _T:
    """Give a class (or a function pickles refer to) :data:`HOME` as its ``__module__``.

    Pickle finds a class by ``__module__`` and ``__qualname__``, and the kit's
    counterexample source imports it from ``__module__``: both keep saying
    ``kvref.specs``, which re-exports the object itself.  Apply it outermost,
    to the class attrs built.
    """
    obj.__module__ = HOME
    return obj


_DTYPE_ALIASES: dict[str, str] = {
    "bf16": "bfloat16",
    "fp16": "float16",
    "half": "float16",
    "fp32": "float32",
    "float": "float32",
    "fp8": "float8_e4m3fn",
    "fp8_e4m3": "float8_e4m3fn",
    "fp8_e5m2": "float8_e5m2",
}


def is_torch_dtype(value: object) -> TypeGuard[torch.dtype]:
    """Whether ``value`` is a ``torch.dtype`` (without importing torch)."""
    # A torch.dtype can only exist once torch is imported: asking needs no import.
    torch_module = sys.modules.get("torch")
    return torch_module is not None and isinstance(value, torch_module.dtype)


def to_dtype(value: object, field: str = "dtype") -> torch.dtype:
    """Convert a ``torch.dtype`` or a dtype name ("bfloat16", "bf16", "torch.float16") to a dtype.

    Only a name imports torch: ``import kvref`` and planning on specs built
    from dtype objects never do.

    Raises:
        SpecError: the value is neither a dtype nor the name of one.
    """
    if is_torch_dtype(value):
        return value
    if isinstance(value, str):
        # Specs hold torch dtypes, so resolving a name is where torch is first needed.
        import torch

        name = value.removeprefix("torch.")
        name = _DTYPE_ALIASES.get(name, name)
        candidate = getattr(torch, name, None)
        if isinstance(candidate, torch.dtype):
            return candidate
    raise SpecError(f"{field}={value!r} is not a torch dtype or the name of one")


def dtype_size(dtype: torch.dtype) -> int:
    """Bytes per element of ``dtype`` (``sizeof`` in the contract)."""
    return int(dtype.itemsize)


def is_int(value: object) -> bool:
    """Whether ``value`` is an int and not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def positive(inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    """Validate a positive int (an attrs validator)."""
    if not is_int(value) or value <= 0:  # type: ignore[operator]
        raise SpecError(f"{type(inst).__name__}.{attribute.name}={value!r} must be a positive int")


def non_negative(inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    """Validate a non-negative int (an attrs validator)."""
    if not is_int(value) or value < 0:  # type: ignore[operator]
        raise SpecError(
            f"{type(inst).__name__}.{attribute.name}={value!r} must be a non-negative int"
        )


def optional_positive(inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    """Validate ``None`` or a positive int (an attrs validator)."""
    if value is not None:
        positive(inst, attribute, value)


def boolean(inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    """Validate a bool (an attrs validator)."""
    if not isinstance(value, bool):
        raise SpecError(f"{type(inst).__name__}.{attribute.name}={value!r} must be a bool")


def optional_str(inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    """Validate ``None`` or a str (an attrs validator)."""
    if value is not None and not isinstance(value, str):
        raise SpecError(f"{type(inst).__name__}.{attribute.name}={value!r} must be a str or None")


@homed
@attrs.frozen
class MultipleOf:
    """A block-stride alignment "multiple of ``n`` tokens" (vLLM's ``MultipleOf``).

    The byte alignment it implies depends on the spec: see
    :meth:`KVCacheSpec.get_block_stride_alignment`.
    """

    n: int = attrs.field(validator=positive)


def alignment_validator(inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    """Validate ``block_stride_alignment``: ``None``, a positive int or ``MultipleOf``."""
    if value is None or isinstance(value, MultipleOf):
        return
    if not is_int(value) or value <= 0:  # type: ignore[operator]
        raise SpecError(
            f"{type(inst).__name__}.{attribute.name}={value!r} must be a positive int, "
            "MultipleOf(n) or None"
        )


def tokens_per_state_validator(
    inst: object, attribute: attrs.Attribute[Any], value: object
) -> None:
    """Validate ``tokens_per_state``: an int or a Fraction (the sign is checked later)."""
    if isinstance(value, bool) or not isinstance(value, (int, Fraction)):
        raise SpecError(
            f"{type(inst).__name__}.{attribute.name}={value!r} must be an int or a Fraction"
        )


def convert_tokens_per_state(value: object) -> object:
    """Convert ``tokens_per_state``: ``"a/b"`` strings to Fractions, whole Fractions to ints."""
    # Fractions with denominator 1 are ints in vLLM's arithmetic; normalise so
    # that equal values compare equal.
    if isinstance(value, Fraction) and value.denominator == 1:
        return int(value)
    if isinstance(value, str) and "/" in value:
        try:
            return Fraction(value)
        except ValueError:
            return value
    return value
