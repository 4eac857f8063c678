"""The plugin's kit run imports Hypothesis as Python does, not assertion-rewritten by pytest.

pytest rewrites the asserts of every package that ships a pytest plugin;
for Hypothesis, whose engine the kit drives hard, that cost the plugin about
a quarter of the CLI's run (benchmarks/plugin_cost.py).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from conformance.plugin import _keep_hypothesis_plain

#: Writes the loader of ``hypothesis.core`` at the end of the session.
_CONFTEST = """
import importlib, os

def pytest_sessionfinish(session):
    core = importlib.import_module("hypothesis.core")
    with open(os.environ["KVREF_TEST_LOADER"], "w") as f:
        f.write(type(core.__loader__).__name__)
"""


def _loader(pytester: pytest.Pytester, tmp_path: Path, *args: str) -> str:
    out = tmp_path / "loader.txt"
    pytester.makeconftest(_CONFTEST)
    pytester.makepyfile(test_nothing="def test_nothing():\n    pass\n")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KVREF_TEST_LOADER", str(out))
        result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "0", *args)
    assert out.is_file(), result.outlines[-20:]
    return out.read_text()


def test_the_kit_run_imports_hypothesis_plain(pytester: pytest.Pytester, tmp_path: Path) -> None:
    """With ``--kv-builder``, Hypothesis is not rewritten; in any other session it is."""
    assert _loader(pytester, tmp_path) == "AssertionRewritingHook"
    kit = _loader(
        pytester,
        tmp_path,
        "--pyargs", "conformance", "test_nothing.py",
        "--kv-builder", "kvref:ReferenceKVCacheConfigBuilder", "--kv-seed", "1",
        "--kv-select", "KV-GROUP-PARTITION", "--kv-max-examples", "1",
    )  # fmt: skip
    assert kit != "AssertionRewritingHook", kit


def _config(hook: Any) -> Any:
    return SimpleNamespace(pluginmanager=SimpleNamespace(rewrite_hook=hook))


def test_only_hypothesis_is_unmarked() -> None:
    """Hypothesis and the kit are unmarked, the user's own stay marked; the cache is cleared."""
    hook = SimpleNamespace(
        _must_rewrite={"hypothesis", "kvref", "conformance", "mine"},
        _marked_for_rewrite_cache={"hypothesis.core": True},
    )
    _keep_hypothesis_plain(_config(hook))
    assert hook._must_rewrite == {"mine"}
    assert hook._marked_for_rewrite_cache == {}


@pytest.mark.parametrize("hook", [None, SimpleNamespace(), SimpleNamespace(_must_rewrite=[])])
def test_an_unexpected_hook_is_left_alone(hook: Any) -> None:
    """A pytest whose rewrite hook looks otherwise: nothing is touched, nothing raised."""
    before = repr(hook)
    _keep_hypothesis_plain(_config(hook))
    assert repr(hook) == before
