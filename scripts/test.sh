#!/usr/bin/env bash
# Runs every test: installs what the tests need (system packages, a real
# llama-server on ggml's CPU backend and one on ggml-vulkan over Mesa's
# software driver, lavapipe), builds with warnings as errors and runs ctest (unit and
# integration tests against real llama-servers, real agent CLIs and SDKs from
# npm, headless Chromium, tmux); then the whole suite again under
# AddressSanitizer and UBSan (a second build), then a short run of every
# libFuzzer target.
#   TOKI_TEST_LABEL=unit scripts/test.sh     only the tests with that ctest label
#   TOKI_TEST_SANITIZE=0                     skip the sanitizer run
#   TOKI_TEST_FUZZ_SECONDS=N                 seconds per fuzz target (default 12; 0 skips)
#   TOKI_BUILD_DIR=dir                       where to build (default build)
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh
scripts/provision-llama-server.sh >/dev/null
scripts/provision-llama-server.sh --backend vulkan >/dev/null

build=${TOKI_BUILD_DIR:-build}
cmake -S . -B "$build" -DTOKI_WERROR=ON >/dev/null
cmake --build "$build" -j"$(nproc)"

args=(--test-dir "$build" --output-on-failure)
[ -n "${TOKI_TEST_LABEL:-}" ] && args+=(-L "$TOKI_TEST_LABEL")
passed=0
failed=0
run() {
	echo "== $*"
	if "$@"; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
}
run ctest "${args[@]}"
if [ "${TOKI_TEST_SANITIZE:-1}" != 0 ]; then
	run scripts/test-sanitize.sh
fi
# 12 s a target (each replays its corpus and regressions first): 11 targets
# two at a time fit in 72 s, which keeps the whole run under 30 minutes on a
# 2-core machine (20 s a target took it to 31 with the endpoint's, the
# service's and install-llama's CUDA tests); scripts/fuzz.sh N runs them
# longer.
if [ "${TOKI_TEST_FUZZ_SECONDS:-12}" != 0 ] && [ -z "${TOKI_TEST_LABEL:-}" ]; then
	run scripts/fuzz.sh "${TOKI_TEST_FUZZ_SECONDS:-12}"
fi
echo "test suites: $passed passed, $failed failed"
[ "$failed" = 0 ]
