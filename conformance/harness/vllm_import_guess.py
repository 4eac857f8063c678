"""Whether a builder named ``module:Class`` will import vLLM, read from its source text only.

The kit imports vLLM in its own process for a vLLM-native builder (vLLM's
Core runs there), and the worker process it forks imports the builder's
module, and with it vLLM: about 13 s each on a 2-core machine.  Imported
before the fork, vLLM is inherited by the worker instead of imported twice.

Which builders are vLLM-native is known only once the worker has imported
the builder, and the kit never runs the builder's code itself; so the
guess here reads files and never imports one: the module ``vllm.*`` itself,
or a module (or ``path/to/file.py``) whose source has an ``import vllm`` or
``from vllm`` line.  The guess decides only when vLLM is imported, never
how a builder is judged: a wrong guess costs one import's time, nothing else.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

__all__ = ["imports_vllm"]

_IMPORT = re.compile(rb"^[ \t]*(?:from|import)[ \t]+vllm(?:[. \t\n;,]|$)", re.MULTILINE)
#: Source files larger than this are not read (a guess is not worth it).
_MAX_BYTES = 4 << 20


def imports_vllm(name: str) -> bool:
    """Whether the builder ``name`` imports vLLM, judged from its module's source text.

    ``name`` is ``module:Class``, ``module.Class`` or ``path/to/file.py:Class``.
    """
    module, sep, _ = name.rpartition(":")
    if not sep:
        module = name.rpartition(".")[0]
    if not module:
        return False
    if module == "vllm" or module.startswith("vllm."):
        return True
    path = Path(module) if module.endswith(".py") else _source(module)
    if path is None:
        return False
    try:
        if path.stat().st_size > _MAX_BYTES:
            return False
        return _IMPORT.search(path.read_bytes()) is not None
    except OSError:
        return False


def _source(module: str) -> Path | None:
    """The ``.py`` file of ``module`` on ``sys.path``, found without importing anything."""
    parts = module.split(".")
    for entry in sys.path:
        base = Path(entry or ".").joinpath(*parts)
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                return candidate
    return None
