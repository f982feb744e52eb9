#!/usr/bin/env bash
# Installs the system packages Toki Recur needs to build and test, on Debian/Ubuntu.
# Idempotent: packages already present are left alone. Runs apt as root or via sudo.
set -euo pipefail

pkgs=(
  build-essential cmake pkg-config git ca-certificates curl
  libevent-dev libjansson-dev libcurl4-openssl-dev libyaml-dev
  libzstd-dev libssl-dev libncurses-dev libcmocka-dev libarchive-dev libxxhash-dev libpcre2-dev
  python3 xz-utils
)
# Test-only extras: tmux for the TUI tests, clang and its runtime (libFuzzer,
# sanitizers) for the fuzzers, node/npm for real clients, iproute2 for the
# fleet test's network namespaces, prometheus (with promtool) for the
# metrics test.
if [ "${TOKI_DEPS_MINIMAL:-0}" != 1 ]; then
  pkgs+=(tmux clang nodejs npm iproute2 prometheus)
  # libclang-rt-<clang's major>-dev: 14 on Debian 12; other releases name
  # their own (clang may not be here yet: the candidate version tells).
  clang_major=$(apt-cache policy clang 2>/dev/null | sed -n 's/ *Candidate: *1:\([0-9]*\).*/\1/p' | head -1)
  [ -n "$clang_major" ] && pkgs+=("libclang-rt-$clang_major-dev")
fi

missing=()
for p in "${pkgs[@]}"; do
  # nodejs/npm may come from another source (nodesource); accept any node on PATH.
  case "$p" in
    nodejs) command -v node >/dev/null 2>&1 && continue ;;
    npm) command -v npm >/dev/null 2>&1 && continue ;;
  esac
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all packages present"
  exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo
echo "install-deps: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
