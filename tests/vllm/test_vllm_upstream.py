"""vLLM's own CPU planning tests, with vLLM's default builder and with kvref's (issue 45).

``scripts/fetch-vllm-tests.sh`` extracts vLLM's planning test files from the
sdist of the installed release (pinned by sha256; nothing of vLLM is
committed here).  They run twice in a pytest subprocess, with
``tests/vllm/upstream_plugin.py`` in place of vLLM's root conftest:

1. with the platform's own builder (vLLM's default), recording every test
   that asks the platform for its builder (vLLM's ``get_kv_cache_configs``,
   ``get_global_kv_cache_groups``: the only way another builder changes a
   test's course);
2. those tests again, with the platform returning kvref's qualname.

Every test that passes with vLLM's default and asks for the builder must
pass with kvref's, except :data:`EXPECTED_DIFFERENCES` (each with its
reason).  A test that never asks for the builder runs the same code either
way, so its default outcome is its outcome with kvref's builder too.

Offline, vLLM's ``ModelConfig()`` needs the config of its default model
(``Qwen/Qwen3-0.6B``; one test asks for ``Qwen/Qwen1.5-7B``): the two public
``config.json`` files' architecture fields are in tests/vllm/data/hf and are
laid out as a Hugging Face cache for the run.  A field that differed from
the hub's would fail a test under both builders alike, never hide a difference.

Slow tier (measured on a loaded 2-core machine: 0.33.0 110-170 s with the 47 MB
download, 0.34.0 55-105 s with the files in place; see docs/platforms.md):
``pytest -m slow tests/vllm/test_vllm_upstream.py``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm.v1.core.kv_cache_planning")

from kvref.interop.vllm_builder import QUALNAME

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent

#: Tests that pass with vLLM's default and ask for the builder, but fail with
#: kvref's, and why (docs/contract.md#deliberate-differences).  Empty: none does.
EXPECTED_DIFFERENCES: dict[str, str] = {}

#: Tests left out of both runs, and why.
DESELECTED = {
    # Starts `python -O` importing vLLM, which compiles every vLLM module without
    # a bytecode cache (about a minute); it tests is_kv_cache_spec_uniform under
    # -O and never asks for a builder.
    "tests/v1/core/test_kv_cache_planning.py::test_is_kv_cache_spec_uniform": "-O subprocess",
}


def _fetch() -> Path:
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "fetch-vllm-tests.sh")],
        cwd=ROOT,
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return ROOT / done.stdout.strip().splitlines()[-1]


def _hf_home(tmp: Path) -> Path:
    """A Hugging Face cache holding the configs of vLLM's test models."""
    home = tmp / "hf"
    for data in (HERE / "data" / "hf").glob("*.json"):
        repo = home / "hub" / f"models--{data.stem}"
        snapshot = repo / "snapshots" / ("0" * 40)
        snapshot.mkdir(parents=True)
        shutil.copy(data, snapshot / "config.json")
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text("0" * 40)
    return home


def _run(tests: Path, tmp: Path, name: str, **env: str) -> dict[str, Any]:
    record = tmp / f"{name}.json"
    files = (tests / "test-files.txt").read_text().split()
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "upstream_plugin",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:randomly",
        "--rootdir",
        str(tests),
        "-c",
        os.devnull,
        *files,
        *(f"--deselect={test}" for test in DESELECTED),
    ]
    environment = {
        **os.environ,
        "PYTHONPATH": str(HERE),
        "VLLM_TARGET_DEVICE": "cpu",
        "HF_HOME": str(_hf_home(tmp / name)),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "KVREF_UPSTREAM_RECORD": str(record),
        **env,
    }
    done = subprocess.run(
        command,
        cwd=tests,
        env=environment,
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    assert record.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    result: dict[str, Any] = json.loads(record.read_text())
    result["summary"] = done.stdout.strip().splitlines()[-1:]
    return result


def test_vllm_planning_tests_pass_with_kvrefs_builder(tmp_path: Path) -> None:
    """Each vLLM test that passes with its default and asks for the builder passes with kvref's."""
    tests = _fetch()
    default = _run(tests, tmp_path, "default")
    outcomes: dict[str, str] = default["outcomes"]
    reached = sorted(set(default["resolved"]) - {""})
    assert len(outcomes) >= 150, default["summary"]
    assert reached, "no test asked the platform for its builder"
    only = tmp_path / "only.json"
    only.write_text(json.dumps(reached))
    ours = _run(
        tests, tmp_path, "kvref", KVREF_UPSTREAM_BUILDER=QUALNAME, KVREF_UPSTREAM_ONLY=str(only)
    )
    # kvref's builder was the one resolved in every test that asks for one.
    assert sorted(set(ours["resolved"]) - {""}) == reached
    passed_default = {t for t in reached if outcomes.get(t) == "passed"}
    passed_ours = {t for t, o in ours["outcomes"].items() if o == "passed"}
    lost = sorted(passed_default - passed_ours - set(EXPECTED_DIFFERENCES))
    summary = {
        "vllm": tests.name,
        "collected": len(outcomes),
        "deselected": len(DESELECTED),
        "passed_with_default": sum(o == "passed" for o in outcomes.values()),
        "ask_for_the_builder": len(reached),
        "of_those_passed_with_default": len(passed_default),
        "of_those_passed_with_kvref": len(passed_default & passed_ours),
        "expected_differences": EXPECTED_DIFFERENCES,
        "failed_with_default": sorted(t for t, o in outcomes.items() if o == "failed"),
    }
    print(json.dumps(summary, indent=1))
    assert not lost, {t: ours["outcomes"].get(t) for t in lost}
    # A listed difference must still be one (else the list is stale).
    for test in EXPECTED_DIFFERENCES:
        assert test in passed_default and test not in passed_ours, test
