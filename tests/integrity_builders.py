"""A legal builder that writes a module during the run and imports it (a kernel it compiles)."""

from __future__ import annotations

import importlib
import sys
import tempfile
import uuid
from collections.abc import Mapping
from pathlib import Path

from kvref import KVCacheGroupSpec, PlanningConfig, ReferenceKVCacheConfigBuilder
from kvref.specs import KVCacheSpec


class CompilesAModule(ReferenceKVCacheConfigBuilder):
    """The reference, after importing a module it wrote at its first grouping call."""

    def get_kv_cache_groups(
        self, config: PlanningConfig, kv_cache_spec: Mapping[str, KVCacheSpec]
    ) -> list[KVCacheGroupSpec]:
        if "kvref_compiled_kernel" not in sys.modules:
            directory = Path(tempfile.mkdtemp(prefix="kvref-kernel-"))
            name = f"kvref_kernel_{uuid.uuid4().hex}"
            (directory / f"{name}.py").write_text("READY = True\n", encoding="utf-8")
            sys.path.insert(0, str(directory))
            importlib.invalidate_caches()
            sys.modules["kvref_compiled_kernel"] = importlib.import_module(name)
        assert sys.modules["kvref_compiled_kernel"].READY
        return super().get_kv_cache_groups(config, kv_cache_spec)
