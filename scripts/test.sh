#!/usr/bin/env bash
# Runs every test: installs what the tests need (system packages, a real
# llama-server), builds with warnings as errors, then runs ctest.
#   TOKI_TEST_LABEL=unit scripts/test.sh     only the unit tests
#   TOKI_BUILD_DIR=dir                       where to build (default build)
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh
scripts/provision-llama-server.sh >/dev/null

build=${TOKI_BUILD_DIR:-build}
cmake -S . -B "$build" -DTOKI_WERROR=ON >/dev/null
cmake --build "$build" -j"$(nproc)"

args=(--test-dir "$build" --output-on-failure)
[ -n "${TOKI_TEST_LABEL:-}" ] && args+=(-L "$TOKI_TEST_LABEL")
ctest "${args[@]}"
