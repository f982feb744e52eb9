#!/usr/bin/env bash
# The GPU check, for a machine with a GPU (CUDA, ROCm, Metal, or a Vulkan
# GPU), in two parts, on the llama-server you name, with -ngl 99 and nothing
# else changed. Nothing here needs a GPU to build; no test of scripts/test.sh
# depends on one.
#
# 1. Identity: exact mode's self-test and the identity workloads of
#    tests/integration/test_vulkan_identity.py (a multi-turn conversation, two
#    interleaved ones, every turn resent, a cancelled turn, a restart from
#    slot files; a random-weight model and stories260K; every answer against
#    toki's uncached answer, text and every logprob).
# 2. Concurrency: bench/gpu_concurrency.py, 4 agent sessions at once through
#    llama-server alone (-np 4), toki fast and toki exact (each in front of a
#    llama-server it starts, -np 4): generated tokens/s side by side, and
#    every answer against the same configuration's uncached answer. Exact
#    mode runs one request at a time per backend, so on a GPU it gives up the
#    batching that llama-server alone gets; this says how much. It fails only
#    where exact mode is not identical.
#
#   TOKI_GPU_LLAMA_SERVER=/path/to/llama-server scripts/gpu-check.sh
#
# Both parts run even when the first fails; the exit status is non-zero when
# either failed. It prints the server's devices, then each part and its time;
# the self-test's verdict is in every failure message ("not verified on this
# backend: ..."). A few minutes on a GPU.
#
# Environment:
#   TOKI_GPU_LLAMA_SERVER   the GPU llama-server (required)
#   TOKI_GPU_CHECK_SKIP     "identity" or "concurrency": leave that part out
#   TOKI_GPU_CONCURRENCY_ARGS  more arguments for bench/gpu_concurrency.py
#                           (e.g. "--params 24M --turns 3"; see its --help)
#   TOKI_GPU_CONCURRENCY_JSON  where its JSON goes (default
#                           bench/results/gpu-concurrency-DATE.json)
#   TOKI_GPU_CHECK_TIMEOUT  seconds each part may run (default 600)
#   TOKI_BIN                a toki binary to use as it is, without building
#                           (a machine without toki's build dependencies)
#   TOKI_BUILD_DIR          else the build directory (default build)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${TOKI_GPU_LLAMA_SERVER:-}" ]; then
	echo "gpu-check: set TOKI_GPU_LLAMA_SERVER to a llama-server built for the GPU" >&2
	exit 2
fi
skip=${TOKI_GPU_CHECK_SKIP:-}
case "$skip" in "" | identity | concurrency) ;; *)
	echo "gpu-check: TOKI_GPU_CHECK_SKIP is identity or concurrency, not $skip" >&2
	exit 2
	;;
esac
if [ -n "${TOKI_BIN:-}" ]; then
	[ -x "$TOKI_BIN" ] || { echo "gpu-check: TOKI_BIN=$TOKI_BIN is not executable" >&2; exit 2; }
	toki=$(realpath "$TOKI_BIN")
else
	build=${TOKI_BUILD_DIR:-build}
	cmake -S . -B "$build" >/dev/null
	cmake --build "$build" -j"$(nproc)" --target toki >/dev/null
	toki=$PWD/$build/toki
fi
"$TOKI_GPU_LLAMA_SERVER" --list-devices
t_all=$SECONDS
status=0
limit=${TOKI_GPU_CHECK_TIMEOUT:-600}

if [ "$skip" != identity ]; then
	echo "== gpu-check: identity workloads (tests/integration/test_vulkan_identity.py)"
	t=$SECONDS
	# Not under set -e: the concurrency part runs either way, device time
	# being scarce.
	if TOKI_BIN=$toki TOKI_GPU_CHECK=1 timeout "$limit" python3 -u tests/integration/test_vulkan_identity.py; then
		r=passed
	else
		r="FAILED ($?)"
		status=1
	fi
	echo "== gpu-check: identity workloads $r in $((SECONDS - t)) s"
fi

if [ "$skip" != concurrency ]; then
	echo "== gpu-check: concurrency (bench/gpu_concurrency.py)"
	t=$SECONDS
	json=${TOKI_GPU_CONCURRENCY_JSON:-bench/results/gpu-concurrency-$(date -u +%Y%m%dT%H%M%SZ).json}
	mkdir -p "$(dirname "$json")"
	# Word splitting of the extra arguments is wanted.
	# shellcheck disable=SC2086
	if timeout "$limit" python3 -u bench/gpu_concurrency.py --toki "$toki" \
		--llama-server "$TOKI_GPU_LLAMA_SERVER" --ngl 99 --json "$json" \
		${TOKI_GPU_CONCURRENCY_ARGS:-}; then
		r=passed
	else
		r="FAILED ($?)"
		status=1
	fi
	echo "== gpu-check: concurrency $r in $((SECONDS - t)) s (JSON: $json)"
fi
echo "== gpu-check: $([ "$status" = 0 ] && echo passed || echo FAILED) in $((SECONDS - t_all)) s"
exit "$status"
