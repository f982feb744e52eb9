#!/usr/bin/env bash
# The GPU identity check, for a machine with a GPU (CUDA, ROCm, Metal, or a
# Vulkan GPU): exact mode's self-test and the identity workloads of
# tests/integration/test_vulkan_identity.py (a multi-turn conversation, two
# interleaved ones, every turn resent, a cancelled turn, a restart from slot
# files; a random-weight model and stories260K; every answer against toki's
# uncached answer, text and every logprob), on the llama-server you name,
# with -ngl 99 and nothing else changed. Nothing here needs a GPU to build;
# no test of scripts/test.sh depends on one. About 2 minutes on a GPU.
#
#   TOKI_GPU_LLAMA_SERVER=/path/to/llama-server scripts/gpu-check.sh
#
# It prints the server's devices, then the tests; the self-test's verdict is
# in every failure message ("not verified on this backend: ...").
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${TOKI_GPU_LLAMA_SERVER:-}" ]; then
	echo "gpu-check: set TOKI_GPU_LLAMA_SERVER to a llama-server built for the GPU" >&2
	exit 2
fi
build=${TOKI_BUILD_DIR:-build}
cmake -S . -B "$build" >/dev/null
cmake --build "$build" -j"$(nproc)" --target toki >/dev/null
"$TOKI_GPU_LLAMA_SERVER" --list-devices
TOKI_BIN=$PWD/$build/toki TOKI_GPU_CHECK=1 timeout 600 python3 -u tests/integration/test_vulkan_identity.py
