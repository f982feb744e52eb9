#!/usr/bin/env bash
# Which lines of toki's C each test runs, and which only it runs: the basis
# for leaving a slow test out of the sanitized pass (scripts/test-sanitize.sh,
# TOKI_SANITIZE_SKIP), which is worth its minutes only where it runs C that
# no other sanitized test runs. A build with gcc's --coverage (build-cov);
# each test (the unit tests as one, then each integration test on its own)
# writes its counters under its own GCOV_PREFIX, and gcov's JSON says which
# lines ran. Prints, slowest first: seconds, lines run, lines no other test
# runs, and those lines' files. A process killed with SIGKILL (the fault
# tests kill llama-server, not toki, but a test that kills toki so) writes no
# counters: its lines count as not run.
#
#   scripts/coverage-by-test.sh [REGEX]      only the integration tests matching
#   TOKI_COV_REPORT_ONLY=1                   the table again from the last run's counters
#   TOKI_COV_BUILD_DIR=dir                   build directory (default build-cov)
#
# Takes as long as ctest's integration run (about 17 minutes on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."

build=${TOKI_COV_BUILD_DIR:-build-cov}
out=$PWD/$build/coverage-by-test
only=${1:-}
if [ -z "${TOKI_COV_REPORT_ONLY:-}" ]; then
cmake -S . -B "$build" -DTOKI_WERROR=OFF -DCMAKE_BUILD_TYPE=Debug \
	-DCMAKE_C_FLAGS=--coverage -DCMAKE_EXE_LINKER_FLAGS=--coverage >/dev/null
cmake --build "$build" -j"$(nproc)" >/dev/null
rm -rf "$out"
mkdir -p "$out"

run_one() { # $1: name, rest: ctest arguments
	local name=$1 s rc=0
	shift
	s=$(date +%s)
	GCOV_PREFIX=$out/$name/gcda ctest --test-dir "$build" "$@" >"$out/$name.log" 2>&1 || rc=$?
	echo "$(($(date +%s) - s)) $rc" >"$out/$name.time"
	echo "-- $name: rc=$rc, $(($(date +%s) - s))s"
}

run_one unit -L unit
mapfile -t tests < <(ctest --test-dir "$build" -N -L integration | sed -n 's/^ *Test *#[0-9]*: *//p')
for t in "${tests[@]}"; do
	if [ -n "$only" ] && ! grep -Eq "$only" <<<"$t"; then
		continue
	fi
	run_one "$t" -R "^${t//./\\.}\$"
done
fi

# gcov wants each .gcno beside its .gcda (not those of this script's own
# folder, which lies inside the build).
objroot=$(readlink -f "$build")
mapfile -t gcnos < <(cd "$objroot" && find . -path ./coverage-by-test -prune -o -name '*.gcno' -print)
for d in "$out"/*/gcda; do
	(cd "$objroot" && cp --parents "${gcnos[@]}" "$d/$objroot/")
done

python3 - "$out" "$objroot" <<'EOF'
import glob, gzip, json, os, subprocess, sys
out, objroot = sys.argv[1], sys.argv[2]
src = os.path.dirname(objroot)
lines = {}
for d in sorted(glob.glob(os.path.join(out, "*", "gcda"))):
    name = os.path.basename(os.path.dirname(d))
    covered = set()
    gcdas = glob.glob(os.path.join(d, "**", "*.gcda"), recursive=True)
    work = os.path.join(out, name, "json")
    os.makedirs(work, exist_ok=True)
    for i in range(0, len(gcdas), 50):
        subprocess.run(["gcov", "--json-format", "-p"] + gcdas[i:i + 50], cwd=work,
                       capture_output=True)
    for j in glob.glob(os.path.join(work, "*.gcov.json.gz")):
        with gzip.open(j) as f:
            data = json.load(f)
        for fi in data.get("files", []):
            path = os.path.relpath(os.path.join(data.get("current_working_directory", ""),
                                                fi["file"]), src)
            if not path.startswith("src/"):
                continue
            for ln in fi["lines"]:
                if ln["count"] > 0:
                    covered.add((path, ln["line_number"]))
    lines[name] = covered
times = {}
for t in glob.glob(os.path.join(out, "*.time")):
    with open(t) as f:
        times[os.path.basename(t)[:-5]] = int(f.read().split()[0])
rows = []
for name, cov in lines.items():
    others = set().union(*(c for n, c in lines.items() if n != name))
    only = cov - others
    files = sorted({p for p, _ in only})
    rows.append((times.get(name, 0), name, len(cov), len(only), files))
for s, name, n, u, files in sorted(rows, reverse=True):
    print(f"{s:5d} s  {name:45s} {n:6d} lines  {u:5d} only here  {' '.join(files)[:160]}")
EOF
