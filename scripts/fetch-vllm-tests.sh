#!/usr/bin/env bash
# Fetch vLLM's own CPU planning tests for the installed vLLM, from its sdist.
#
#   scripts/fetch-vllm-tests.sh                    # into build/vllm-tests/<version>
#   PYTHON=.venv034/bin/python scripts/fetch-vllm-tests.sh /tmp/vllm-tests
#
# tests/vllm/test_vllm_upstream.py runs them with vLLM's default builder and
# again with kvref's wherever a test reaches a builder (docs/platforms.md);
# scripts/test.sh and tox fetch them when they set up an environment.
# The sdist is downloaded with pip from the package index, pinned by version
# and sha256 (below), and only the test files are extracted; nothing of vLLM
# is committed to this repository.  Prints the directory; a second run with
# the files in place does nothing.
#
# pip prepares an sdist's metadata even to download it, and vLLM's setup.py
# imports torch and setuptools-rust: the metadata is built without isolation
# in $PYTHON's environment (which has torch) with the two small build
# requirements installed into a throw-away folder, for no device
# (VLLM_TARGET_DEVICE=empty) and under the release's own version number.
# Measured on a CPU machine: about 20-40 s, a 47 MB download.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-.venv/bin/python}
VERSION=$("$PYTHON" -c "import importlib.metadata as m; print(m.version('vllm').split('+')[0])")
case "$VERSION" in
  0.33.0) SHA256=f4c33c2503d52bb411146afa9618a4f48bed68912f617e6803ac8d76e4c74112 ;;
  0.34.0) SHA256=fcad848b246a9d8652b47e6425af92334dc02492f9802720f54e27b823cf0113 ;;
  *) echo "fetch-vllm-tests.sh: vLLM $VERSION has no pinned sdist here (0.33.0, 0.34.0)" >&2; exit 2 ;;
esac
DEST=${1:-build/vllm-tests/$VERSION}

# The CPU planning tests, the helpers they import and the packages' __init__ files.
FILES=(
  tests/__init__.py
  tests/v1/__init__.py
  tests/v1/core/__init__.py
  tests/v1/core/utils.py
  tests/v1/core/test_kv_cache_config_builder.py
  tests/v1/core/test_kv_cache_planning.py
  tests/v1/core/test_kv_cache_utils.py
  tests/v1/core/test_contiguous_kv_packing.py
  tests/v1/engine/__init__.py
  tests/v1/engine/test_init_error_messaging.py
  tests/v1/kv_connector/__init__.py
  tests/v1/kv_connector/unit/__init__.py
  tests/v1/kv_connector/unit/utils.py
)
# 0.34.0's planning tests also import its speculative-decoding test helpers.
if [[ "$VERSION" == 0.34.0 ]]; then
  FILES+=(tests/v1/spec_decode/__init__.py tests/v1/spec_decode/utils.py)
fi

# What a complete extraction records: the sdist's hash and the file list's.
STAMP="$SHA256 $(printf '%s\n' "${FILES[@]}" | sha256sum | cut -c1-16)"
if [[ -f "$DEST/.stamp" && "$(cat "$DEST/.stamp")" == "$STAMP" ]]; then
  echo "$DEST"
  exit 0
fi

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
"$PYTHON" -m pip install -q --disable-pip-version-check --target "$WORK/build-deps" \
  'setuptools>=77.0.3,<81' setuptools-scm setuptools-rust >&2
echo "vllm==$VERSION --hash=sha256:$SHA256" > "$WORK/requirements.txt"
PYTHONPATH="$WORK/build-deps" VLLM_TARGET_DEVICE=empty VLLM_VERSION_OVERRIDE="$VERSION" \
  "$PYTHON" -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: \
  --no-build-isolation --require-hashes -r "$WORK/requirements.txt" -d "$WORK" >&2
SDIST="$WORK/vllm-$VERSION.tar.gz"
echo "$SHA256  $SDIST" | sha256sum -c --quiet -

rm -rf "$DEST"
mkdir -p "$DEST"
tar -xzf "$SDIST" -C "$DEST" --strip-components=1 "${FILES[@]/#/vllm-$VERSION/}"
printf '%s\n' "${FILES[@]}" | grep '/test_[^/]*\.py$' > "$DEST/test-files.txt"
echo "$STAMP" > "$DEST/.stamp"
echo "$DEST"
