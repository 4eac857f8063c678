#!/usr/bin/env bash
# Install vLLM 0.33.0 for planning (not serving) on a CPU-only machine, into the
# environment of $PYTHON (default: python3).  Used by `tox -e vllm`; see docs/vllm.md.
#
#   scripts/install-vllm-cpu.sh
#   PYTHON=/path/to/venv/bin/python scripts/install-vllm-cpu.sh
#
# vLLM's wheel declares CUDA dependencies, so it goes in with --no-deps and the
# packages its config and planning modules import come from
# requirements/vllm-cpu.txt.  torch stays pinned: an unpinned resolve could
# replace it with another build.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
VLLM_SPEC=${VLLM_SPEC:-vllm==0.33.0}

pip() { "$PYTHON" -m pip install -q --disable-pip-version-check "$@"; }

pip "$TORCH_SPEC"
pip --no-deps "$VLLM_SPEC"
pip -r requirements/vllm-cpu.txt "$TORCH_SPEC"
pip --no-deps xgrammar==0.2.8
HF_HUB_OFFLINE=1 "$PYTHON" -c "import vllm.config, vllm.v1.core.kv_cache_planning; print('vLLM', __import__('vllm').__version__, 'ready for planning')"
