"""vLLM's own CPU planning tests, with vLLM's default builder and with kvref's.

``scripts/fetch-vllm-tests.sh`` extracts vLLM's planning test files from the
sdist of the installed release (pinned by version and sha256; nothing of
vLLM is committed here; ``scripts/test.sh`` fetches them when it sets up each
release's environment).  They run in one pytest subprocess, with
``tests/vllm/upstream_plugin.py`` in place of vLLM's root conftest: each test
runs as vLLM ships it, then again with kvref's builder wherever it reached a
builder, in the same process:

- ``hook``: the test asked the platform for its builder (vLLM's
  ``get_kv_cache_configs``, ``get_global_kv_cache_groups``); the platform
  then returns kvref's qualname;
- ``module``: the test called vLLM's module-level ``get_kv_cache_groups`` or
  ``get_kv_cache_config_from_groups`` (directly, or through vLLM functions
  other than the default builder's hooks); those then answer with kvref's
  builder too.

Every test that passes with vLLM's default passes in each mode it reached,
except :data:`EXPECTED_DIFFERENCES` (each with its reason).  A test that
reaches neither runs the same code either way, so its default outcome is its
outcome with kvref's builder too.

Offline, vLLM's ``ModelConfig()`` needs the config of its default model
(``Qwen/Qwen3-0.6B``; one test asks for ``Qwen/Qwen1.5-7B``): the two public
``config.json`` files' architecture fields are in tests/vllm/data/hf and are
laid out as a Hugging Face cache for the run.  A field that differed from
the hub's would fail a test under both builders alike, never hide a difference.

Cost (docs/platforms.md): one vLLM import and each reaching test run twice
or three times; the project's pytest plugins are not loaded in the subprocess.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm.v1.core.kv_cache_planning")

from subprocesses import run_captured

from kvref.interop.vllm_builder import QUALNAME

pytestmark = pytest.mark.vllm

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent

#: Tests that pass with vLLM's default and reach a builder, but fail with
#: kvref's, and why (docs/contract.md#deliberate-differences).  Empty: none does.
EXPECTED_DIFFERENCES: dict[str, str] = {}

#: Tests left out of the run, and why.
DESELECTED = {
    # Starts `python -O` importing vLLM, which compiles every vLLM module without
    # a bytecode cache (about a minute); it tests is_kv_cache_spec_uniform under
    # -O and never asks for a builder.
    "tests/v1/core/test_kv_cache_planning.py::test_is_kv_cache_spec_uniform": "-O subprocess",
}


def _tests() -> Path:
    """The folder of vLLM's test files for the installed release.

    ``scripts/test.sh`` fetches them when it sets up each environment; here the
    script finds them in place (its stamp) or fetches them where no setup did.
    A failed fetch fails the test: the run is never skipped for want of them.
    """
    done = run_captured(
        ["bash", str(ROOT / "scripts" / "fetch-vllm-tests.sh")],
        cwd=ROOT,
        env={**os.environ, "PYTHON": sys.executable},
        timeout=900,
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


def _run(tests: Path, tmp: Path, builder: str = QUALNAME) -> dict[str, Any]:
    """One run of vLLM's tests with the plugin: each test as shipped, then with ``builder``."""
    record = tmp / "record.json"
    files = (tests / "test-files.txt").read_text().split()
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "upstream_plugin",
        "--rootdir",
        str(tests),
        "-c",
        os.devnull,
        *files,
        *(f"--deselect={test}" for test in DESELECTED),
    ]
    environment = {
        **os.environ,
        # Only pytest's own plugins and ours: the project's (hypothesis,
        # xdist, benchmark, randomly) cost seconds to import and vLLM's
        # planning tests use none of them.
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
        "PYTHONPATH": str(HERE),
        "VLLM_TARGET_DEVICE": "cpu",
        "HF_HOME": str(_hf_home(tmp)),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "KVREF_UPSTREAM_RECORD": str(record),
        "KVREF_UPSTREAM_BUILDER": builder,
    }
    done = run_captured(command, cwd=tests, env=environment, timeout=1200)
    assert record.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    result: dict[str, Any] = json.loads(record.read_text())
    result["summary"] = done.stdout.strip().splitlines()[-1:]
    return result


def _compare(default: dict[str, str], ours: dict[str, str]) -> tuple[list[str], dict[str, int]]:
    """The tests that pass with vLLM's default and not with kvref's, and the counts."""
    passed_default = {t for t in ours if default.get(t) == "passed"}
    passed_ours = {t for t, o in ours.items() if o == "passed"}
    lost = sorted(passed_default - passed_ours - set(EXPECTED_DIFFERENCES))
    # A listed difference that passes again is stale.
    stale = sorted(t for t in EXPECTED_DIFFERENCES if t in passed_ours)
    counts = {
        "reached": len(ours),
        "of_those_passed_with_default": len(passed_default),
        "of_those_passed_with_kvref": len(passed_default & passed_ours),
    }
    return lost + [f"stale expected difference: {t}" for t in stale], counts


def test_vllm_planning_tests_pass_with_kvrefs_builder(tmp_path: Path) -> None:
    """Each vLLM test that passes with its default and reaches a builder passes with kvref's."""
    tests = _tests()
    record = _run(tests, tmp_path)
    outcomes: dict[str, dict[str, str]] = record["outcomes"]
    default = outcomes["default"]
    assert len(default) >= 150, record["summary"]
    summary: dict[str, Any] = {
        "vllm": tests.name,
        "collected": len(default),
        "deselected": len(DESELECTED),
        "passed_with_default": sum(o == "passed" for o in default.values()),
        "failed_with_default": sorted(t for t, o in default.items() if o == "failed"),
        "expected_differences": EXPECTED_DIFFERENCES,
    }
    lost: dict[str, str] = {}
    for mode in ("hook", "module"):
        # Both routes reach kvref's builder in vLLM's tests of both releases.
        assert outcomes[mode], f"no test of vLLM's reached a builder through {mode}"
        missing, summary[mode] = _compare(default, outcomes[mode])
        # kvref's builder answered in the reruns (not only the platform's qualname changed).
        summary[mode]["kvref_builder_called"] = len(record["kvref_ran"][mode])
        assert record["kvref_ran"][mode], f"kvref's builder never ran through {mode}"
        lost.update({f"{mode}: {t}": record["failures"][mode].get(t, "") for t in missing})
    summary["reached_kvref"] = len(set(outcomes["hook"]) | set(outcomes["module"]))
    print(json.dumps(summary, indent=1))
    assert not lost, "\n\n".join(f"{t}\n{text}" for t, text in lost.items())


@pytest.mark.slow
def test_a_builder_that_reorders_its_groups_fails_vllms_tests(tmp_path: Path) -> None:
    """The comparison catches a builder vLLM's tests catch, through either route."""
    record = _run(_tests(), tmp_path, "upstream_broken.ReversedGroupsBuilder")
    outcomes = record["outcomes"]
    for mode in ("hook", "module"):
        missing, counts = _compare(outcomes["default"], outcomes[mode])
        assert missing, (mode, counts)
