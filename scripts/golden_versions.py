"""Golden outputs of the installed vLLM release: write them, or check them (``--check``).

``tests/data/golden`` holds the problems (``NAME.json``) and vLLM 0.33.0's
outputs (``NAME.out.json``, made by the project's first oracle and by
``scripts/make_golden.py``).  Another release ``X.Y.Z`` keeps its outputs in
``vllm-X.Y.Z/``.  With vLLM ``X.Y.Z`` installed, this script runs that
release's own planning code (``make_golden.run_problem``) on:

- ``versions.json``: problems on which the supported releases differ, each
  expressible in all of them (made here; with vLLM 0.33.0 installed this
  writes ``versions.json`` and ``versions.out.json``, resolving HiSparse
  layers with 0.33.0 as ``make_golden.py`` does, and every other release
  plans the committed file);
- with another release than 0.33.0: every top-level problem file, written to
  ``vllm-X.Y.Z/NAME.out.json`` (a problem the first oracle made is planned
  with the effective config of its 0.33.0 output, which is what it means),
  and the release's own problems (fields only it has), written to
  ``vllm-X.Y.Z/NAME.json`` and ``.out.json``.

Usage (tox's ``vllm`` env, or any venv with vLLM and kvref's test extras)::

    python scripts/golden_versions.py            # write
    python scripts/golden_versions.py --check    # compare, write nothing (exit 1 if stale)
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

import attrs  # noqa: E402
import golden  # noqa: E402

from kvref.versions import V0_34, VllmVersion  # noqa: E402


def _make_golden() -> Any:
    spec = importlib.util.spec_from_file_location(
        "make_golden", REPO / "scripts" / "make_golden.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["make_golden"] = module
    spec.loader.exec_module(module)
    return module


MG = _make_golden()
VERSION: VllmVersion = MG.VERSION
OUT_DIR: Path = MG.OUT_DIR
GIB = MG.GIB

# -- problems ---------------------------------------------------------------------

_MLA = {"kind": "mla", "block_size": 64, "num_kv_heads": 1, "head_size": 576, "dtype": "bfloat16"}
_SWMLA = {**_MLA, "kind": "sliding_window_mla", "sliding_window": 128}
_FULL = {"kind": "full_attention", "num_kv_heads": 8, "head_size": 128, "dtype": "bfloat16"}


def _layers(prefix: str, spec: Mapping[str, Any], count: int, start: int = 0) -> dict[str, Any]:
    return {f"{prefix}{i}": dict(spec) for i in range(start, start + count)}


def _shared_problems() -> list[dict[str, Any]]:
    """Problems on which 0.33.0 and 0.34.0 differ, expressible in both."""
    fp8 = {"kv_quant_mode": "FP8_PER_TENSOR"}
    mla_fp8 = {**_MLA, "dtype": "float8_e4m3fn", **fp8}
    swmla_fp8 = {**_SWMLA, "dtype": "float8_e4m3fn", **fp8}
    # A compressed MLA page (41,984 B) that neither divides the SW-MLA page
    # (73,728 B) nor can be padded: page unification fails.
    small_mla = {**_MLA, "dtype": "uint8", "state_content_bytes": 656}
    fp8_full = {**_FULL, "dtype": "float8_e4m3fn", **fp8}
    hisparse = {"index_topk": 2048, "device_buffer_size": 3 * 2048}
    return [
        MG._problem(
            "swmla_quant_modes",
            [
                _layers("m", _MLA, 4)
                | _layers("w", _SWMLA, 2)
                | _layers("w", {**_SWMLA, **fp8}, 2, 2)
            ],
        ),
        MG._problem(
            "swmla_alignments",
            [
                _layers("m", _MLA, 4)
                | _layers("w", _SWMLA, 2)
                | _layers("w", {**_SWMLA, "alignment": 576}, 2, 2)
            ],
        ),
        MG._problem("all_fp8_mla", [_layers("m", mla_fp8, 2) | _layers("w", swmla_fp8, 2)]),
        MG._problem(
            "swmla_fallback",
            [_layers("m", small_mla, 2) | _layers("w", {**_SWMLA, "bounded_replay": True}, 2)],
        ),
        MG._problem(
            "zeroing_across_workers",
            [
                _layers("f", _FULL, 2) | _layers("q", fp8_full, 2),
                _layers("f", _FULL, 4, 2),
            ],
            config={"pipeline_parallel_size": 2},
            available_memory=[GIB, GIB],
        ),
        MG._problem(
            "draft_model_decode_slot",
            [_layers("f", _FULL, 4) | _layers("d", {**_FULL, "is_draft": True}, 1)],
            config={"speculative_method": "draft_model", "num_speculative_tokens": 2},
        ),
        MG._problem(
            "hisparse_draft_model_buffer",
            [MG._mla_model(4)],
            config={
                "max_model_len": 8192,
                "kv_cache_layout": "BLHNC",
                "hisparse": hisparse,
                "host_pool_bytes": 1 << 28,
                "speculative_method": "draft_model",
                "num_speculative_tokens": 2,
            },
            resolve_hisparse=True,
        ),
    ]


def _fields_0_34() -> list[dict[str, Any]]:
    """Problems using spec fields only vLLM 0.34.0 has."""
    mamba = {
        "kind": "mamba",
        "shapes": [[4, 1000], [8, 64, 64]],
        "dtypes": ["bfloat16", "float32"],
        "state_alignment": 256,
    }
    small_full = {**_FULL, "num_kv_heads": 2}
    return [
        MG._problem(
            "mamba_state_alignment",
            [{f"l{i}": dict(small_full if i % 4 == 3 else mamba) for i in range(8)}],
        ),
        MG._problem(
            "kv_head_major_slots",
            [_layers("f", _FULL, 2) | _layers("h", {**_FULL, "kv_head_major_slots": True}, 2)],
        ),
        MG._problem(
            "swmla_non_causal_multi_token_decode",
            [
                _layers("m", _MLA, 2)
                | _layers("w", _SWMLA, 1)
                | _layers("w", {**_SWMLA, "non_causal_multi_token_decode": True}, 1, 1)
            ],
        ),
    ]


#: The problem file shared by every release, made here.
SHARED = "versions"
#: Per release: its own problem files (fields only it has).
OWN: dict[VllmVersion, dict[str, Callable[[], list[dict[str, Any]]]]] = {
    V0_34: {"fields_0_34": _fields_0_34},
}

# -- running ------------------------------------------------------------------------


def _run(raw: dict[str, Any], problem: golden.GoldenProblem | None = None) -> dict[str, Any]:
    """``make_golden``'s run, with vLLM's layout resolution first where the problem asks."""
    if not MG._LAYOUT_INPUTS & set(raw.get("config", {})):
        return dict(MG.run_problem(raw, problem))
    planned, record = MG._resolve_layout(raw)
    return dict(MG.run_problem(planned) | {"layout_resolution": record})


def _effective(path: Path, raw: dict[str, Any]) -> golden.GoldenProblem:
    """A first-oracle problem as 0.33.0 planned it (its output's config), as ``VERSION``."""
    problem = golden.load_problem(path, raw["name"])
    return attrs.evolve(problem, config=problem.config.with_vllm_version(VERSION))


def _outputs_of(path: Path, made_here: bool) -> list[dict[str, Any]]:
    """``VERSION``'s outputs for every problem of a committed top-level problem file."""
    base = golden.load_expected(path) if golden.expected_path(path).exists() else []
    base_resolved = {o["name"]: o.get("resolved", {}) for o in base}
    outs = []
    for raw in golden._read_json_list(path):
        if made_here or MG._LAYOUT_INPUTS & set(raw.get("config", {})):
            out = _run(copy.deepcopy(raw))
        else:
            out = _run(copy.deepcopy(raw), _effective(path, raw))
            # The block size the first oracle's problem gives its specs by default.
            if "block_size" in base_resolved.get(raw["name"], {}):
                out["resolved"]["block_size"] = base_resolved[raw["name"]]["block_size"]
        outs.append(out)
    return outs


def _files() -> dict[Path, Any]:
    """Every file this run owns, with its content."""
    files: dict[Path, Any] = {}
    shared = OUT_DIR / f"{SHARED}.json"
    if VERSION == golden.BASE_VERSION:
        made = _shared_problems()
        raws = [MG._resolve_hisparse(r) if r.get("resolve_hisparse") else r for r in made]
        files[shared] = raws
        files[golden.expected_path(shared)] = [_run(copy.deepcopy(r)) for r in raws]
        return files
    own = golden.version_dir(OUT_DIR, VERSION)
    mg_files = {f"{name}.json" for name in MG.FILES} | {shared.name}
    for path in golden.golden_input_files(OUT_DIR):
        made_here = path.name in mg_files
        files[golden.expected_path(path, VERSION)] = _outputs_of(path, made_here)
    for name, make in OWN.get(VERSION, {}).items():
        raws = [MG._resolve_hisparse(r) if r.get("resolve_hisparse") else r for r in make()]
        files[own / f"{name}.json"] = raws
        files[own / f"{name}.out.json"] = [_run(copy.deepcopy(r)) for r in raws]
    return files


def main(argv: list[str] | None = None) -> int:
    """Write (or with ``--check`` compare) the golden files of the installed vLLM release."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare, write nothing")
    args = parser.parse_args(argv)
    stale = []
    for path, data in _files().items():
        text = MG._dump(data)
        if args.check:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(str(path.relative_to(OUT_DIR)))
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        if path.name.endswith(".out.json"):
            ok = sum(o["ok"] for o in data)
            print(f"vLLM {VERSION}: {path.relative_to(OUT_DIR)}: {ok}/{len(data)} ok")
    if stale:
        print(f"stale golden files of vLLM {VERSION}: {stale}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
