#!/usr/bin/env bash
# Runs one fuzz target: first replays every saved crash in
# fuzz/regressions/<name>/ (each must now pass), then fuzzes for
# $TOKI_FUZZ_SECONDS (default 60) from the seed corpus, with a working corpus
# under WORKDIR so that the checked-in seeds stay small. Fails on any crash,
# leak, sanitizer report or timeout; the crashing input is left in
# WORKDIR/<name>/artifacts/ (copy it to fuzz/regressions/<name>/).
#   run_target.sh BINARY NAME FUZZ_SOURCE_DIR WORKDIR
set -euo pipefail
bin=$1 name=$2 src=$3 work=$4
secs=${TOKI_FUZZ_SECONDS:-60}
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

reg=$src/regressions/$name
mkdir -p "$work"
if [ -d "$reg" ] && [ -n "$(ls -A "$reg" 2>/dev/null)" ]; then
	echo "== $name: replaying $(ls "$reg" | wc -l) regression input(s)"
	"$bin" -runs=1 "$reg"/* >"$work/replay-$name.log" 2>&1 || { cat "$work/replay-$name.log"; exit 1; }
fi

[ "$secs" -gt 0 ] || exit 0
mkdir -p "$work/$name/corpus" "$work/$name/artifacts"
# Streams are slow to check in full; 16 KB holds plenty of events.
case $name in sse | anthropic_stream) max_len=16384 ;; *) max_len=65536 ;; esac
args=(-max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len="$max_len"
	-print_final_stats=1 -artifact_prefix="$work/$name/artifacts/")
[ -f "$src/dict/$name.dict" ] && args+=(-dict="$src/dict/$name.dict")
seeds=()
[ -d "$src/corpus/$name" ] && seeds+=("$src/corpus/$name")
[ -d "$reg" ] && seeds+=("$reg")
echo "== $name: fuzzing for ${secs}s"
"$bin" "${args[@]}" "$work/$name/corpus" "${seeds[@]}"
