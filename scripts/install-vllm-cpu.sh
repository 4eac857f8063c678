#!/usr/bin/env bash
# Install vLLM for planning (not serving) on a CPU-only machine, into the
# environment of $PYTHON (default: python3).  Used by scripts/test.sh and tox;
# see docs/vllm.md.
#
#   scripts/install-vllm-cpu.sh              # vLLM 0.34.0, the newest release kvref supports
#   scripts/install-vllm-cpu.sh 0.33.0       # or another supported release
#   PYTHON=/path/to/venv/bin/python scripts/install-vllm-cpu.sh 0.33.0
#
# vLLM's wheel declares CUDA dependencies (and pins torch 2.14.0), so it goes in
# with --no-deps and the packages its config and planning modules import come
# from requirements/vllm-cpu.txt, which serves both supported releases.  torch
# stays pinned to the CPU build: an unpinned resolve would replace it with a
# multi-GB CUDA build, and the planning import chain of both releases runs on
# torch 2.13.
#
# pip may print a red "ERROR: pip's dependency resolver does not currently take
# into account all the packages that are installed" block naming vLLM's CUDA
# requirements (torch==2.14.0, flashinfer...): that is the --no-deps install
# being noticed, not a failure.  The last line, "vLLM X ready for planning",
# says the install worked; the script exits non-zero otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
VERSION=${1:-${VLLM_VERSION:-0.34.0}}
case "$VERSION" in
  0.33.0|0.34.0) ;;
  *) echo "install-vllm-cpu.sh: vLLM $VERSION is not a release kvref supports (0.33.0, 0.34.0)" >&2; exit 2 ;;
esac

pip() { "$PYTHON" -m pip install -q --disable-pip-version-check "$@"; }

pip "$TORCH_SPEC"
pip --no-deps "vllm==$VERSION"
pip -r requirements/vllm-cpu.txt "$TORCH_SPEC"
pip --no-deps xgrammar==0.2.8
HF_HUB_OFFLINE=1 "$PYTHON" -c "
import vllm, vllm.config, vllm.v1.core.kv_cache_planning
assert vllm.__version__ == '$VERSION', vllm.__version__
print('vLLM', vllm.__version__, 'ready for planning')"
