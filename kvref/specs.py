"""KV cache spec kinds (contract.md#specs): page size, maximum memory, merge, same-type test.

Every spec is a frozen attrs class whose fields are validated at construction:
a bad value raises :class:`~kvref.errors.SpecError` naming the field and the
value.  Equality and hashing follow vLLM's dataclasses (``is_draft`` is left
out of both).  All fields are keyword-only.

Specs are immutable, so what planning derives from them is computed once per
instance (see ``KVCacheSpec._MEMOISED``): the page geometry, and the tuple of
compared fields that equality and the hash use.  None of it is in the repr or
the pickled state, and ``attrs.evolve`` builds a fresh instance.

This module is where the spec kinds are imported from.  They are written in
smaller modules: ``kvref._spec_fields`` (dtypes, validators, ``MultipleOf``),
``kvref._spec_base`` (``KVCacheSpec``, ``MemoryInputs``),
``kvref._spec_attention`` (the attention kinds, ``evolve_spec``),
``kvref._spec_state`` (``MambaSpec``) and ``kvref._spec_groups`` (the
uniform-type wrapper).  Each class names this module as its ``__module__``,
so pickles, reprs of types and printed counterexamples say
``kvref.specs.X`` as they always did.
"""

from __future__ import annotations

import kvref._spec_attention as _attention

# Every attention kind (and evolve_spec): the names of _spec_attention.__all__,
# listed there only, and added to this module's __all__ below.
from kvref._spec_attention import *  # noqa: F403
from kvref._spec_base import KVCacheSpec, MemoryInputs
from kvref._spec_fields import MultipleOf, dtype_size, to_dtype
from kvref._spec_groups import (
    GroupKVCacheSpec,
    UniformTypeKVCacheSpecs,
    # Not used here: a pickled wrapper calls kvref.specs._rebuild_uniform_type.
    _rebuild_uniform_type,  # noqa: F401
    iter_layer_specs,
)
from kvref._spec_state import MambaSpec

__all__ = [
    "GroupKVCacheSpec",
    "KVCacheSpec",
    "MambaSpec",
    "MemoryInputs",
    "MultipleOf",
    "UniformTypeKVCacheSpecs",
    "dtype_size",
    "iter_layer_specs",
    "to_dtype",
]
__all__ += _attention.__all__
