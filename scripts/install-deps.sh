#!/usr/bin/env bash
# Installs the system packages Toki Recur needs to build and test: on
# Debian/Ubuntu with apt (as root or via sudo), on macOS with Homebrew (as
# the user: brew refuses root). Idempotent: packages already present are left
# alone. TOKI_DEPS_MINIMAL=1 installs only what the build and the demo need.
# On macOS nothing global is written: Homebrew's keg-only formulae (curl,
# libarchive, ncurses; openssl@3 on older Homebrew) are not on pkg-config's
# path, and `. scripts/macos-env.sh` puts them there for one shell (the
# script prints the line). docs/platforms.md says what runs where.
set -euo pipefail

if [ "$(uname -s)" = Darwin ]; then
  # Formulae: what CMakeLists.txt's pkg_check_modules wants (pkgconf is
  # Homebrew's pkg-config), and coreutils for nproc and timeout, which the
  # scripts use and macOS lacks.
  formulae=(cmake pkgconf libevent jansson openssl@3 curl libyaml libarchive xxhash zstd
    ncurses pcre2 cmocka coreutils)
  # Python 3.9 or newer for the demo and the tests: the Command Line Tools'
  # /usr/bin/python3 will do.
  python3 -c 'import sys; sys.exit(sys.version_info < (3, 9))' >/dev/null 2>&1 ||
    formulae+=(python)
  # Test-only extras: node for the real clients, tmux for the TUI tests,
  # llama.cpp for a Metal llama-server on PATH (the demo's and the tests';
  # scripts/provision-llama-server.sh provisions on Debian only). A node or
  # llama-server already on PATH is taken as it is.
  if [ "${TOKI_DEPS_MINIMAL:-0}" != 1 ]; then
    command -v node >/dev/null 2>&1 || formulae+=(node)
    formulae+=(tmux)
    command -v llama-server >/dev/null 2>&1 || formulae+=(llama.cpp)
  fi
  brew=$(command -v brew 2>/dev/null || true)
  if [ -z "$brew" ]; then
    for b in /opt/homebrew/bin/brew /usr/local/bin/brew; do
      if [ -x "$b" ]; then
        brew=$b
        echo "install-deps: using $b (not on PATH; add it with: eval \"\$($b shellenv)\")" >&2
        break
      fi
    done
  fi
  if [ -z "$brew" ]; then
    echo "install-deps: Homebrew is needed on macOS and was not found." >&2
    echo "  Install it as described on https://brew.sh (it installs the Xcode Command Line" >&2
    echo "  Tools too), open a new shell, and run this script again. Or install these by" >&2
    echo "  other means and put their pkg-config folders on PKG_CONFIG_PATH:" >&2
    echo "  ${formulae[*]}" >&2
    exit 1
  fi
  if [ "$(id -u)" -eq 0 ]; then
    echo "install-deps: Homebrew does not run as root; run this script as your own user." >&2
    exit 1
  fi
  installed=" $({ "$brew" list --formula -1 2>/dev/null || true; } | tr '\n' ' ') "
  missing=()
  for f in "${formulae[@]}"; do
    case "$installed" in *" $f "*) continue ;; esac
    # pkgconf was called pkg-config before Homebrew renamed it (2024).
    if [ "$f" = pkgconf ]; then
      case "$installed" in *" pkg-config "*) continue ;; esac
    fi
    missing+=("$f")
  done
  if [ ${#missing[@]} -eq 0 ]; then
    echo "install-deps: all packages present"
  else
    echo "install-deps: installing ${missing[*]}"
    "$brew" install "${missing[@]}"
  fi
  # What the build needs from the keg-only formulae, as scripts/macos-env.sh sets it.
  pcp=""
  for f in curl libarchive ncurses openssl@3; do
    d=$("$brew" --prefix "$f" 2>/dev/null) || continue
    if [ -d "$d/lib/pkgconfig" ]; then
      pcp="$pcp${pcp:+:}$d/lib/pkgconfig"
    fi
  done
  echo "install-deps: before cmake, put Homebrew's keg-only formulae on pkg-config's path:"
  echo "  . scripts/macos-env.sh"
  echo "  (that is: export PKG_CONFIG_PATH=\"$pcp\${PKG_CONFIG_PATH:+:\$PKG_CONFIG_PATH}\")"
  exit 0
fi

pkgs=(
  build-essential cmake pkg-config git ca-certificates curl
  libevent-dev libjansson-dev libcurl4-openssl-dev libyaml-dev
  libzstd-dev libssl-dev libncurses-dev libcmocka-dev libarchive-dev libxxhash-dev libpcre2-dev
  python3 xz-utils
)
# Test-only extras: tmux for the TUI tests, clang and its runtime (libFuzzer,
# sanitizers) for the fuzzers, node/npm for real clients, iproute2 for the
# fleet test's network namespaces, prometheus (with promtool) for the
# metrics test, systemd (for systemd-analyze verify) for the service test.
if [ "${TOKI_DEPS_MINIMAL:-0}" != 1 ]; then
  pkgs+=(tmux clang nodejs npm iproute2 prometheus systemd)
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
