#!/usr/bin/env bash
# Runs the whole ctest suite (unit + integration) against a build with
# AddressSanitizer, LeakSanitizer and UBSan: build-asan, Debug. The
# integration tests get that build's toki as TOKI_BIN from ctest, so every
# daemon and command they start is the sanitized one.
#
# A sanitizer report fails the test that caused it: each integration test runs
# on its own (sequentially, each with its own ctest call) and afterwards every
# log it left in its work directory (TOKI_TEST_WORK: the toki and llama-server
# logs toki_harness.py writes) is searched for "ERROR: AddressSanitizer",
# "runtime error:" and "LeakSanitizer". A daemon that aborts on its first error
# (abort_on_error=1) also fails the test directly; a command (toki model ...)
# that trips a sanitizer or leaks exits non-zero, which the tests check.
#
#   scripts/test-sanitize.sh                  everything
#   TOKI_TEST_LABEL=unit scripts/test-sanitize.sh     only one label
#   TOKI_SANITIZE_TESTS='test_faults|test_security'  only integration tests matching
#   TOKI_SANITIZE_SKIP='test_x|test_y'       integration tests left out (default: the
#                                           real agent CLIs, test_launch_agents and
#                                           test_agent_configs: minutes of node, and the
#                                           routes they drive are test_api_routes' and
#                                           test_sdks', which run here; and
#                                           test_vulkan_identity, test_endpoint_arch,
#                                           test_endpoint_ops, test_error_log)
#   TOKI_ASAN_BUILD_DIR=dir                   build directory (default build-asan)
#   TOKI_GEN_BIN=toki                         the toki that writes the test models
#                                           (default: the plain build's, TOKI_BUILD_DIR)
set -euo pipefail
cd "$(dirname "$0")/.."

build=${TOKI_ASAN_BUILD_DIR:-build-asan}
# -O1, as AddressSanitizer's documentation advises: toki's own work (its
# tokenizer, templates) took up to 1.5 times as long at -O0.
cmake -S . -B "$build" -DTOKI_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_FLAGS_DEBUG="-g -O1" \
	>/dev/null
cmake --build "$build" -j"$(nproc)"
# The test models are written by the plain build's toki (toki_harness.py
# TOKI_GEN_BIN), brought up to date here: those of the ctest pass before this
# one are used as they are, not written again under the sanitizers.
plain=${TOKI_BUILD_DIR:-build}
if [ -z "${TOKI_GEN_BIN:-}" ] && [ -f "$plain/CMakeCache.txt" ]; then
	cmake --build "$plain" -j"$(nproc)" --target toki
	export TOKI_GEN_BIN=$PWD/$plain/toki
fi

# A small quarantine: ASan keeps freed memory out of reuse (256 MB by
# default), which the load test's bound on toki's RSS growth would read as a
# leak; 16 MB still catches a use shortly after a free.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:quarantine_size_mb=16}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
# The load test's volume adds no code path under the sanitizers, only time
# (108 s here of a 30-minute run): fewer clients for fewer seconds run the
# same paths (queueing past the slots, the connection cap, 503 and back).
export TOKI_LOAD_CLIENTS=${TOKI_LOAD_CLIENTS:-50} TOKI_LOAD_SECONDS=${TOKI_LOAD_SECONDS:-5}
pattern='ERROR: AddressSanitizer|runtime error:|LeakSanitizer'

# This run's logs only: a fresh work directory. Generated test models are
# cached in the usual one; link them rather than generate them again.
default_work=${XDG_CACHE_HOME:-$HOME/.cache}/tokirecur/test
work=$PWD/$build/sanitize-work/$(date +%Y%m%d-%H%M%S)
mkdir -p "$work"
for m in "$default_work"/*.gguf; do
	[ -e "$m" ] && ln -sf "$m" "$work/"
done
echo "sanitizer run: logs in $work"

label=${TOKI_TEST_LABEL:-}
only=${TOKI_SANITIZE_TESTS:-}
# test_vulkan_identity: exact mode's C paths on another backend, which the
# CPU identity tests cover (test_vulkan keeps the self-test's own paths).
# test_endpoint_arch: the endpoint's swaps (test_endpoint's paths) on model
# kinds whose restores test_architectures runs here.
# test_endpoint_ops, test_error_log: no line of C that the tests here do not
# run (scripts/coverage-by-test.sh at b299fc3, 2026-12-06).
skip=${TOKI_SANITIZE_SKIP-test_launch_agents|test_agent_configs|test_vulkan_identity|test_endpoint_arch|test_endpoint_ops|test_error_log}
failed=()
t0=$(date +%s)

if [ -z "$label" ] || [ "$label" = unit ]; then
	if ! ctest --test-dir "$build" -L unit --output-on-failure; then
		failed+=("unit tests")
	fi
fi

if [ -z "$label" ] || [ "$label" = integration ]; then
	mapfile -t tests < <(ctest --test-dir "$build" -N -L integration |
		sed -n 's/^ *Test *#[0-9]*: *//p')
	for t in "${tests[@]}"; do
		if [ -n "$only" ] && ! grep -Eq "$only" <<<"$t"; then
			continue
		fi
		if [ -n "$skip" ] && grep -Eq "$skip" <<<"$t"; then
			echo "-- $t: left out of the sanitized pass (TOKI_SANITIZE_SKIP)"
			continue
		fi
		tw=$work/$t
		mkdir -p "$tw"
		for m in "$work"/*.gguf; do
			[ -e "$m" ] && ln -sf "$(readlink -f "$m")" "$tw/"
		done
		s=$(date +%s)
		rc=0
		TOKI_TEST_WORK=$tw ctest --test-dir "$build" -R "^${t//./\\.}\$" --output-on-failure || rc=$?
		# Models a test generated are kept for the next ones.
		for m in "$tw"/*.gguf; do
			[ -f "$m" ] && [ ! -L "$m" ] && [ ! -e "$work/$(basename "$m")" ] && ln -s "$m" "$work/"
		done
		hits=$(grep -lE "$pattern" "$tw"/*.log 2>/dev/null || true)
		if [ -n "$hits" ]; then
			echo "!! $t: sanitizer reports in:"
			for h in $hits; do
				echo "   $h"
				grep -E -A30 "$pattern" "$h" | head -60 | sed 's/^/     /'
			done
			failed+=("$t (sanitizer)")
		elif [ $rc -ne 0 ]; then
			failed+=("$t")
		fi
		echo "-- $t: rc=$rc, $(($(date +%s) - s))s"
	done
fi

echo "sanitized suite: $(($(date +%s) - t0))s"
if [ ${#failed[@]} -gt 0 ]; then
	printf 'FAILED: %s\n' "${failed[@]}" >&2
	exit 1
fi
echo "no sanitizer reports, every test passed"
