#!/usr/bin/env bash
# Linux aarch64 in the suite: cross-builds toki for arm64 and runs it under
# qemu-user on this x86_64 Debian machine.
#   1. installs Debian's cross compiler (gcc-aarch64-linux-gnu) and qemu-user
#      (qemu-user-static), unless there;
#   2. makes a sysroot of Debian's arm64 -dev packages (this release, the
#      mirror /etc/apt already names) and their whole Depends closure, fetched
#      with `apt-get download` under a private apt configuration for arm64 and
#      unpacked with dpkg-deb -x: the host's dpkg architectures stay as they are;
#   3. provisions Debian sid's arm64 llama-server (provision-llama-server.sh
#      --arch arm64), run under qemu-user;
#   4. builds toki and its unit tests in build-arm64/ with warnings as errors
#      (cmake/aarch64-linux-gnu.cmake);
#   5. runs every unit test under qemu-user (ctest -L unit);
#   6. runs tests/arm64/test_arm64_exact.py: the arm64 toki in exact mode in
#      front of the arm64 llama-server, three turns identical to uncached.
# Everything fetched stays under $TOKI_CACHE_DIR/arm64 (default
# ~/.cache/tokirecur/arm64), so a second run fetches nothing.
#   TOKI_ARM64_BUILD_DIR=dir   where to build (default build-arm64)
#   TOKI_ARM64_REFRESH=1       make the sysroot again from the mirror's current packages
#   TOKI_DEBIAN_MIRROR=URI     the Debian mirror (default: the one /etc/apt names)
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$PWD"
t0=$(date +%s)

log() { printf 'test-arm64: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
elapsed() { echo $(( $(date +%s) - $1 )); }

KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
FALLBACK_MIRROR=http://deb.debian.org/debian
# What toki links (CMakeLists.txt's pkg_check_modules) and its tests need;
# libc6-dev and linux-libc-dev for the C library's headers and crt files.
SYSROOT_PKGS=(libc6-dev linux-libc-dev libevent-dev libjansson-dev libssl-dev
  libcurl4-openssl-dev libyaml-dev libarchive-dev libxxhash-dev libzstd-dev
  libncurses-dev libpcre2-dev libcmocka-dev)

build="${TOKI_ARM64_BUILD_DIR:-build-arm64}"
case "$build" in /*) ;; *) build="$repo/$build" ;; esac
cache_root="${TOKI_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tokirecur}"
case "$cache_root" in /*) ;; *) cache_root="$PWD/$cache_root" ;; esac
arm_cache="$cache_root/arm64"
sysroot="$arm_cache/sysroot"

[ "$(uname -m)" = x86_64 ] || die "this script cross-builds on x86_64; this is $(uname -m)"
[ -f /etc/debian_version ] || die "this script needs Debian (apt, dpkg)"

# Each step's outcome, for the summary.
steps=()
failed=0
step() { # $1: name, $2: seconds, $3: ok|FAILED, rest: detail
  steps+=("$(printf '%-38s %-7s %5ss  %s' "$1" "$3" "$2" "${*:4}")")
  [ "$3" = ok ] || failed=$((failed + 1))
}
summary() {
  echo
  echo "== test-arm64 summary (aarch64 under $(basename "${qemu:-qemu}"))"
  printf '%s\n' "${steps[@]}"
  echo "total: $(elapsed "$t0")s; $([ "$failed" = 0 ] && echo 'all passed' || echo "$failed failed")"
}
abort() { # a step the later ones need failed: summarise and stop
  step "$1" "$2" FAILED "${*:3}"
  summary
  exit 1
}

# --- 1. host packages ---------------------------------------------------------
t=$(date +%s)
host_pkgs=(gcc-aarch64-linux-gnu cmake make pkg-config python3 debian-archive-keyring)
# Either qemu-user package provides qemu-aarch64; -static has the fewest
# dependencies. Only the binary is used (binfmt_misc is not needed: every
# aarch64 program is started through it explicitly).
qemu="$(command -v qemu-aarch64 || command -v qemu-aarch64-static || true)"
[ -n "$qemu" ] || host_pkgs+=(qemu-user-static)
missing=()
for p in "${host_pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  log "installing ${missing[*]}"
  mkdir -p "$arm_cache"
  { $SUDO apt-get update -qq &&
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"; } \
    >"$arm_cache/apt-install.log" 2>&1 || {
    tail -n 20 "$arm_cache/apt-install.log" >&2
    abort "host packages" "$(elapsed "$t")" "apt-get install ${missing[*]} failed (see $arm_cache/apt-install.log)"
  }
fi
qemu="$(command -v qemu-aarch64 || command -v qemu-aarch64-static || true)"
[ -n "$qemu" ] || abort "host packages" "$(elapsed "$t")" "no qemu-aarch64 after installing qemu-user-static"
step "host packages" "$(elapsed "$t")" ok "${missing[*]:-all present}"

# --- 2. the arm64 sysroot -----------------------------------------------------
# The release the host runs (bookworm on Debian 12): its arm64 libraries match
# the cross compiler's glibc and headers.
codename="$(sed -n 's/^VERSION_CODENAME="\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' /etc/os-release)"
[ -n "$codename" ] || die "no VERSION_CODENAME in /etc/os-release"
# Every URI the host's apt sources name (deb822 .sources and one-line .list).
host_uris() {
  local f
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -r "$f" ] || continue
    sed -n 's/^[[:space:]]*URIs:[[:space:]]*//p' "$f" | tr -s '[:blank:]' '\n'
  done
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -r "$f" ] || continue
    sed -n 's/^[[:space:]]*deb[[:space:]]\{1,\}\(\[[^]]*\][[:space:]]\{1,\}\)\{0,1\}\([^[:space:]]\{1,\}\).*/\2/p' "$f"
  done
}
first_uri() { # $1: the path the URI ends in (debian, debian-security)
  host_uris | sed 's:/*$::' | grep -m1 -E "^https?://.*/$1\$" || true
}
# The stamp names what the sysroot was made of: another release or package
# list makes it again.
want_stamp="$codename ${SYSROOT_PKGS[*]}"
t=$(date +%s)
if [ "${TOKI_ARM64_REFRESH:-0}" != 1 ] && [ -f "$sysroot/.toki-sysroot" ] &&
   [ "$(head -n 1 "$sysroot/.toki-sysroot")" = "$want_stamp" ]; then
  step "sysroot (arm64 $codename)" "$(elapsed "$t")" ok "cached: $(($(wc -l <"$sysroot/.toki-sysroot") - 1)) packages in $sysroot"
else
  mirror="${TOKI_DEBIAN_MIRROR:-$(first_uri debian)}"
  mirror="${mirror:-$FALLBACK_MIRROR}"
  security="$(first_uri debian-security)"
  mkdir -p "$arm_cache"
  # One run at a time makes the sysroot; a second waits, then uses it.
  exec 8>"$arm_cache/.sysroot.lock"
  flock 8
  work="$(mktemp -d "$arm_cache/.sysroot.tmp.XXXXXX")"
  trap 'rm -rf "$work"' EXIT
  mkdir -p "$arm_cache/apt/lists/partial" "$arm_cache/apt/cache/archives/partial" "$work/debs" "$work/root"
  {
    printf 'deb [signed-by=%s] %s %s main\n' "$KEYRING" "$mirror" "$codename"
    printf 'deb [signed-by=%s] %s %s-updates main\n' "$KEYRING" "$mirror" "$codename"
    [ -z "$security" ] || printf 'deb [signed-by=%s] %s %s-security main\n' "$KEYRING" "$security" "$codename"
  } >"$arm_cache/apt/sources.list"
  : >"$arm_cache/apt/status"
  apt_opts=(
    -o "Dir::Etc::SourceList=$arm_cache/apt/sources.list"
    -o "Dir::Etc::SourceParts=/dev/null"
    -o "Dir::Etc::Preferences=/dev/null"
    -o "Dir::Etc::PreferencesParts=/dev/null"
    -o "Dir::State::Lists=$arm_cache/apt/lists"
    -o "Dir::Cache=$arm_cache/apt/cache"
    -o "Dir::Cache::pkgcache=pkgcache.bin"
    -o "Dir::Cache::srcpkgcache=srcpkgcache.bin"
    # An empty dpkg status: the host's amd64 packages say nothing about arm64.
    -o "Dir::State::status=$arm_cache/apt/status"
    -o "APT::Architecture=arm64"
    -o "APT::Architectures=arm64"
    -o "Acquire::Languages=none"
  )
  # As root apt downloads as user _apt, which cannot write into root's cache.
  [ "$(id -u)" -eq 0 ] && apt_opts+=(-o "APT::Sandbox::User=root")
  aptlog="$arm_cache/apt.log"
  log "sysroot: arm64 $codename from $mirror${security:+ and $security}"
  apt-get "${apt_opts[@]}" -q update >"$aptlog" 2>&1 ||
    abort "sysroot (arm64 $codename)" "$(elapsed "$t")" "apt-get update failed (see $aptlog)"
  # The whole Depends/Pre-Depends closure: every library a -dev package's
  # .so links against must be there for the linker (and for qemu at run
  # time). Virtual names (<...>) are left out; apt lists their providers.
  mapfile -t pkgs < <(apt-cache "${apt_opts[@]}" depends --recurse --no-recommends --no-suggests \
      --no-conflicts --no-breaks --no-replaces --no-enhances "${SYSROOT_PKGS[@]}" 2>>"$aptlog" |
    grep -v '^[[:space:]<]' | sort -u)
  for p in "${SYSROOT_PKGS[@]}"; do
    case " ${pkgs[*]} " in *" $p "*) continue ;; esac
    abort "sysroot (arm64 $codename)" "$(elapsed "$t")" "no arm64 package $p in $codename"
  done
  log "sysroot: downloading ${#pkgs[@]} packages"
  (cd "$work/debs" && apt-get "${apt_opts[@]}" -q download "${pkgs[@]}") >>"$aptlog" 2>&1 ||
    abort "sysroot (arm64 $codename)" "$(elapsed "$t")" "apt-get download failed (see $aptlog)"
  for deb in "$work/debs"/*.deb; do
    dpkg-deb -x "$deb" "$work/root" ||
      abort "sysroot (arm64 $codename)" "$(elapsed "$t")" "dpkg-deb -x $deb failed"
  done
  # Absolute symlinks (libm.so -> /lib/aarch64-linux-gnu/libm.so.6) point
  # at the host's files; made relative they point inside the sysroot, where
  # the cross linker and qemu -L look.
  while IFS= read -r -d '' link; do
    target="$(readlink "$link")"
    ln -sfn "$(realpath -m -s --relative-to="$(dirname "$link")" "$work/root$target")" "$link"
  done < <(find "$work/root" -type l -lname '/*' -print0)
  {
    printf '%s\n' "$want_stamp"
    (cd "$work/debs" && for deb in *.deb; do dpkg-deb -f "$deb" Package Version | sed 's/^[^:]*: //' | paste -sd' '; done)
  } >"$work/root/.toki-sysroot"
  # Into place whole: a run stopped half-way leaves the old sysroot or none.
  rm -rf "$sysroot.old"
  [ ! -e "$sysroot" ] || mv -T "$sysroot" "$sysroot.old"
  mv -T "$work/root" "$sysroot"
  rm -rf "$sysroot.old" "$work"
  # apt's binary caches (~80 MB) are made again from the lists on a refresh.
  rm -f "$arm_cache"/apt/cache/*.bin
  trap - EXIT
  flock -u 8
  step "sysroot (arm64 $codename)" "$(elapsed "$t")" ok "${#pkgs[@]} packages fetched into $sysroot"
fi

# --- 3. Debian sid's arm64 llama-server ---------------------------------------
t=$(date +%s)
if llama="$(scripts/provision-llama-server.sh --arch arm64)"; then
  version="$(sed -n 's/^llama-server: //p' "$(dirname "$(dirname "$llama")")/INFO" 2>/dev/null || true)"
  step "llama-server (sid arm64)" "$(elapsed "$t")" ok "${version:-$llama}"
else
  abort "llama-server (sid arm64)" "$(elapsed "$t")" "scripts/provision-llama-server.sh --arch arm64 failed"
fi

# --- 4. build -------------------------------------------------------------------
t=$(date +%s)
if cmake -S . -B "$build" -DCMAKE_TOOLCHAIN_FILE="$repo/cmake/aarch64-linux-gnu.cmake" \
     -DTOKI_SYSROOT="$sysroot" -DTOKI_WERROR=ON >"$arm_cache/cmake.log" 2>&1 &&
   cmake --build "$build" -j"$(nproc)"; then
  step "build (aarch64, -Werror)" "$(elapsed "$t")" ok "$build"
else
  [ -s "$arm_cache/cmake.log" ] && tail -n 30 "$arm_cache/cmake.log" >&2
  abort "build (aarch64, -Werror)" "$(elapsed "$t")" "see the output above"
fi
machine="$(od -An -tx1 -j18 -N2 "$build/toki" | tr -d ' ')"
# e_machine 0xb7 (little-endian b7 00): EM_AARCH64.
[ "$machine" = b700 ] || abort "build (aarch64, -Werror)" "$(elapsed "$t")" "$build/toki is not an aarch64 ELF"

# --- 5. unit tests under qemu-user --------------------------------------------
t=$(date +%s)
ulog="$arm_cache/ctest-unit.log"
if ctest --test-dir "$build" -L unit --output-on-failure -j"$(nproc)" 2>&1 | tee "$ulog"; then
  result=ok
else
  result=FAILED
fi
counts="$(grep -E '^[0-9]+% tests passed' "$ulog" | tail -n 1 || true)"
bad="$(sed -n 's/^[[:space:]]*[0-9]* - \(unit\.[^ ]*\).*/\1/p' "$ulog" | paste -sd' ')"
step "unit tests under qemu" "$(elapsed "$t")" "$result" "${counts:-no ctest summary}${bad:+; failed: $bad}"

# --- 6. integration: exact mode on arm64 --------------------------------------
# toki under qemu: a wrapper stands in as TOKI_BIN for the harness. -L makes
# the sysroot the root for toki's loader and libraries.
wrapper="$build/toki-qemu"
printf '#!/bin/sh\n# the aarch64 toki under qemu-user (scripts/test-arm64.sh)\nexec %q -L %q %q "$@"\n' \
  "$qemu" "$sysroot" "$build/toki" >"$wrapper"
chmod 0755 "$wrapper"
t=$(date +%s)
# This run's logs only (the servers' and tokis', for a failure's post-mortem).
rm -rf "$arm_cache/test"
model="$repo/../shared/models/stories260K.gguf"
env_model=()
[ -f "$model" ] && env_model=(TOKI_TEST_MODEL="$(realpath "$model")")
if env TOKI_ARM64=1 TOKI_BIN="$wrapper" TOKI_LLAMA_SERVER="$llama" TOKI_SOURCE_DIR="$repo" \
     TOKI_TEST_WORK="$arm_cache/test" "${env_model[@]+"${env_model[@]}"}" \
     python3 -u tests/arm64/test_arm64_exact.py 2>&1 | tee "$arm_cache/integration.log"; then
  result=ok
else
  result=FAILED
fi
turns="$(grep -o 'turn [0-9]*: identical' "$arm_cache/integration.log" | wc -l || true)"
skipped="$(grep -c 'skipped' "$arm_cache/integration.log" || true)"
[ "$skipped" = 0 ] || result=FAILED
step "exact mode, arm64 toki + llama-server" "$(elapsed "$t")" "$result" "$turns/3 turns identical to uncached"

summary
[ "$failed" = 0 ]
