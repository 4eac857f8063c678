#!/usr/bin/env bash
# Device check on a machine with an NVIDIA GPU: the allocation, device-invariant and
# serving-simulation tests on CUDA, then the KV-DEV-TAGS bandwidth and the serving
# simulation's throughput benchmarks.  Needs only PyPI.
#
#   scripts/gpu-check.sh                 # cuda (the current device)
#   KVREF_TEST_DEVICE=cuda:1 scripts/gpu-check.sh
#
# Environment:
#   KVREF_TEST_DEVICE  torch device the tests and the benchmark use (default: cuda)
#   VENV               virtual environment to create or reuse (default: .venv-gpu)
#   PYTHON             interpreter that creates it (default: python3)
#   TORCH_SPEC         torch requirement when none with CUDA is importable (default: torch)
set -euo pipefail
cd "$(dirname "$0")/.."

DEVICE=${KVREF_TEST_DEVICE:-cuda}
VENV=${VENV:-.venv-gpu}
PYTHON=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch}

step() { printf '\n== %s\n' "$*"; }

step "venv $VENV"
# System site packages let an image's preinstalled CUDA torch count: downloading a CUDA
# torch takes most of the few minutes this script should need.
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv --system-site-packages "$VENV"
fi
PY="$VENV/bin/python"

step "install"
if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  # PyPI's default Linux x86_64 wheels are CUDA builds.
  "$PY" -m pip install -q "$TORCH_SPEC"
fi
"$PY" -m pip install -q -e '.[test]'

step "device"
"$PY" - "$DEVICE" <<'EOF'
import sys

import torch

device = torch.device(sys.argv[1])
if device.type == "cuda" and not torch.cuda.is_available():
    sys.exit(f"torch {torch.__version__} sees no CUDA device")
print(f"torch {torch.__version__} (CUDA {torch.version.cuda}) on {device}:",
      torch.cuda.get_device_name(device) if device.type == "cuda" else device.type)
EOF

step "tests on $DEVICE"
KVREF_TEST_DEVICE="$DEVICE" timeout 600 "$PY" -m pytest -q \
  tests/reference/test_allocation.py tests/extensions/device/test_device.py tests/extensions/serve/test_serve.py

step "KV-DEV-TAGS bandwidth on $DEVICE"
timeout 300 "$PY" benchmarks/device.py --device "$DEVICE"

step "serving simulation throughput on $DEVICE"
timeout 300 "$PY" benchmarks/serve.py --device "$DEVICE"
