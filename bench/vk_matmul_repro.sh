#!/usr/bin/env bash
# Builds bench/vk_matmul_repro.c against the Vulkan prefix that
# scripts/provision-llama-server.sh --backend vulkan made (its libggml and
# libggml-dev's headers) and runs it on lavapipe, at the defaults and with
# GGML_VK_DISABLE_COOPMAT=1. Exits 1 when a size is wrong at the defaults.
set -euo pipefail
cd "$(dirname "$0")/.."
wrapper=$(scripts/provision-llama-server.sh --backend vulkan)
dest=$(dirname "$(dirname "$wrapper")")
P=$dest/prefix
L=$P/usr/lib/x86_64-linux-gnu
[ -f "$P/usr/include/ggml.h" ] || { echo "no ggml.h in $P (provision again: --backend vulkan --force)" >&2; exit 2; }
out=${TOKI_BUILD_DIR:-build}/vk_matmul_repro
mkdir -p "$(dirname "$out")"
# Linked against the prefix's libraries, which need sid's newer libc: the
# host's linker is told to leave their symbols alone, and sid's loader runs it.
cc -O1 -o "$out" bench/vk_matmul_repro.c -I"$P/usr/include" "$L/libggml.so.0" \
	"$L/libggml-base.so.0" -lm -Wl,--allow-shlib-undefined
cpu=$(sed -n 's/^GGML_BACKEND_PATH="${TOKI_GGML_BACKEND_PATH:-\(.*\)}"$/\1/p' "$wrapper")
run() {
	env GGML_BACKEND_PATH="$cpu" VK_ICD_FILENAMES="$dest/lvp_icd.json" GGML_VK_VISIBLE_DEVICES=0 "$@" \
		"$L/ld-linux-x86-64.so.2" --library-path "$L:$L/ggml" "$out" 2>/dev/null
}
rc=0
run || rc=$?
run GGML_VK_DISABLE_COOPMAT=1 || true
exit $rc
