#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/fuzz_*.c, clang with ASan + UBSan) in
# build-fuzz and runs every one for SECONDS (default 60), after replaying the
# saved crashes in fuzz/regressions/. Fails if any target crashes, leaks,
# trips a sanitizer or an invariant, or times out; the input that did it is
# left in build-fuzz/fuzz/work/<name>/artifacts/ (make it a regression: copy
# it to fuzz/regressions/<name>/).
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]
#   scripts/fuzz.sh --coverage [TARGET...]   line coverage of the parsers by the
#                           corpora a run left (build-fuzz-cov, llvm-cov)
#   TOKI_FUZZ_JOBS=N        targets run at once (default: the number of CPUs)
#   TOKI_FUZZ_BUILD_DIR=dir build directory (default build-fuzz)
set -euo pipefail
cd "$(dirname "$0")/.."

coverage=0
if [ "${1:-}" = --coverage ]; then
	coverage=1
	shift
	set -- 0 "$@"
fi
secs=${1:-60}
shift || true
build=${TOKI_FUZZ_BUILD_DIR:-build-fuzz}
jobs=${TOKI_FUZZ_JOBS:-$(nproc)}

# The sources each target exists for (what --coverage reports on).
declare -A sources=(
	[http_head]=src/http/http_parse.c [http_chunked]=src/http/http_parse.c
	[sse]=src/http/sse.c [anthropic_stream]=src/api/anthropic.c
	[anthropic_request]=src/api/anthropic.c [responses_request]=src/api/responses.c
	[gguf]=src/model/gguf.c [registry]=src/model/registry.c
	[slot_index]="src/router/router.c src/router/radix.c"
	[chat_template]="src/template/jinja_lex.c src/template/jinja_parse.c src/template/jinja_eval.c src/template/jinja_builtins.c src/template/jinja_value.c src/prompt/chat.c"
	[tokenize]="src/tokenizer/vocab.c src/tokenizer/pretokenize.c src/tokenizer/unicode.c"
)

if ! command -v clang >/dev/null; then
	echo "fuzz.sh: clang is needed (apt-get install clang)" >&2
	exit 2
fi
rt="$(clang -print-resource-dir)/lib/linux/libclang_rt.fuzzer-$(uname -m).a"
if [ ! -f "$rt" ]; then
	ver=$(clang -dumpversion | cut -d. -f1)
	if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
		apt-get install -y "libclang-rt-$ver-dev" >/dev/null
	else
		echo "fuzz.sh: libFuzzer is missing ($rt): apt-get install libclang-rt-$ver-dev" >&2
		exit 2
	fi
fi

if [ $coverage = 1 ]; then
	cov=${build}-cov
	llvm=$(dirname "$(readlink -f "$(command -v clang)")")
	profdata=$llvm/llvm-profdata
	llvmcov=$llvm/llvm-cov
	CC=clang cmake -S . -B "$cov" -DTOKI_FUZZ=ON -DTOKI_SANITIZE=OFF -DTOKI_WERROR=OFF \
		-DCMAKE_BUILD_TYPE=Debug \
		-DCMAKE_C_FLAGS="-fprofile-instr-generate -fcoverage-mapping" >/dev/null
	cmake --build "$cov" --target fuzz -j"$(nproc)" >/dev/null
	targets=("$@")
	[ ${#targets[@]} -gt 0 ] || targets=("${!sources[@]}")
	mkdir -p "$cov/prof"
	printf '%-20s %8s  %s\n' target inputs "line coverage of its parser"
	for n in $(printf '%s\n' "${targets[@]}" | sort); do
		dirs=()
		for d in "$build/fuzz/work/$n/corpus" "fuzz/corpus/$n" "fuzz/regressions/$n"; do
			[ -d "$d" ] && dirs+=("$d")
		done
		rm -f "$cov/prof/$n".*
		LLVM_PROFILE_FILE="$cov/prof/$n.profraw" "$cov/fuzz/fuzz_$n" -runs=0 "${dirs[@]}" \
			>"$cov/prof/$n.log" 2>&1 || true
		"$profdata" merge -sparse "$cov/prof/$n.profraw" -o "$cov/prof/$n.profdata"
		inputs=$(find "${dirs[@]}" -type f | wc -l)
		line=$("$llvmcov" report "$cov/fuzz/fuzz_$n" -instr-profile="$cov/prof/$n.profdata" \
			${sources[$n]} | awk '/^TOTAL/ {print $(NF-3) " of lines (" $(NF-5) " lines), " $4 " of regions"}')
		printf '%-20s %8s  %s (%s)\n' "$n" "$inputs" "$line" "${sources[$n]}"
	done
	exit 0
fi

# Warnings are the gcc build's business; a clang-only warning must not stop fuzzing.
CC=clang cmake -S . -B "$build" -DTOKI_FUZZ=ON -DTOKI_SANITIZE=ON -DTOKI_WERROR=OFF \
	-DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" --target fuzz -j"$(nproc)"

targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
	for f in fuzz/fuzz_*.c; do
		n=${f#fuzz/fuzz_}
		targets+=("${n%.c}")
	done
fi
logs=$build/fuzz/logs
mkdir -p "$logs"
echo "fuzzing ${#targets[@]} targets for ${secs}s each, $jobs at a time (logs in $logs)"

export TOKI_FUZZ_SECONDS=$secs build logs
run_one() {
	local n=$1
	if fuzz/run_target.sh "$build/fuzz/fuzz_$n" "$n" fuzz "$build/fuzz/work" >"$logs/$n.log" 2>&1; then
		echo "ok $n"
	else
		echo "FAIL $n"
	fi
}
export -f run_one
results=$(printf '%s\n' "${targets[@]}" | xargs -P "$jobs" -I{} bash -c 'run_one {}')

failed=0
printf '%-20s %-6s %12s %9s %8s %8s\n' target result execs exec/s cov corpus
for n in "${targets[@]}"; do
	log=$logs/$n.log
	r=$(grep -qx "ok $n" <<<"$results" && echo ok || echo FAIL)
	[ "$r" = ok ] || failed=1
	execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
	rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
	last=$(grep -E '^#[0-9]+' "$log" | tail -1 || true)
	cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
	corp=$(sed -n 's/.* corp: \([0-9]*\)\/.*/\1/p' <<<"$last")
	printf '%-20s %-6s %12s %9s %8s %8s\n' "$n" "$r" "${execs:--}" "${rate:--}" "${cov:--}" "${corp:--}"
done
if [ $failed -ne 0 ]; then
	echo "fuzz.sh: a target failed; see its log in $logs and the input in $build/fuzz/work/<name>/artifacts/" >&2
	for n in "${targets[@]}"; do
		grep -qx "ok $n" <<<"$results" || { echo "--- $n"; grep -E -A25 'ERROR|invariant failed|runtime error|SUMMARY' "$logs/$n.log" | head -60; }
	done
	exit 1
fi
