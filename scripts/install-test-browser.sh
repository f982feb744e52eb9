#!/usr/bin/env bash
# Installs what the browser test of `toki web` needs and prints the
# node_modules directory to use (as NODE_PATH) on stdout:
#   - Debian's chromium (/usr/bin/chromium), with apt-get, when it is missing;
#   - node and npm, with apt-get, when they are missing;
#   - `npm ci` of tests/web (playwright-core, pinned in its package-lock.json)
#     into a cache directory outside the source tree, redone only when the
#     lock file changes. playwright-core downloads no browser: the test
#     drives Debian's chromium.
# Everything but the final path goes to stderr.
#
# Usage: scripts/install-test-browser.sh
# Environment:
#   TOKI_CACHE_DIR   cache root (default ${XDG_CACHE_HOME:-$HOME/.cache}/tokirecur);
#                    the packages go to $TOKI_CACHE_DIR/web-test/node_modules
#   CHROMIUM         a browser to use instead of /usr/bin/chromium (not installed then)
set -euo pipefail

log() { printf 'install-test-browser: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

src="$(cd "$(dirname "$0")/.." && pwd)/tests/web"
[ -f "$src/package-lock.json" ] || die "$src/package-lock.json is missing"

apt_install() {
  local sudo=()
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || die "need root (or sudo) to apt-get install $*"
    sudo=(sudo)
  fi
  command -v apt-get >/dev/null || die "no apt-get here: install $* by hand"
  log "installing $* with apt-get"
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2 ||
    die "apt-get update failed"
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >&2 ||
    die "apt-get install $* failed"
}

need=()
browser="${CHROMIUM:-/usr/bin/chromium}"
if [ ! -x "$browser" ]; then
  [ -n "${CHROMIUM:-}" ] && die "CHROMIUM=$CHROMIUM is not executable"
  need+=(chromium fonts-dejavu-core)
fi
command -v node >/dev/null || need+=(nodejs)
command -v npm >/dev/null || need+=(npm)
[ ${#need[@]} -eq 0 ] || apt_install "${need[@]}"
[ -x "$browser" ] || die "$browser is still missing after installing chromium"
"$browser" --version >&2 || die "$browser does not run"

# playwright-core's own requirement (see its package.json "engines").
node_major="$(node -p 'process.versions.node.split(".")[0]')"
[ "$node_major" -ge 20 ] || die "node $(node --version) is too old for playwright-core: it needs node 20 or later"

if [ -z "${TOKI_CACHE_DIR:-}" ] && [ -z "${XDG_CACHE_HOME:-}" ] && [ -z "${HOME:-}" ]; then
  die "neither TOKI_CACHE_DIR, XDG_CACHE_HOME nor HOME is set; cannot choose a cache directory"
fi
dest="${TOKI_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tokirecur}/web-test"
mkdir -p "$dest"
stamp="$dest/.lock-sha256"
want="$(sha256sum "$src/package-lock.json" | cut -d' ' -f1)"
if [ ! -d "$dest/node_modules/playwright-core" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  log "npm ci of tests/web into $dest"
  cp "$src/package.json" "$src/package-lock.json" "$dest/"
  rm -f "$stamp"
  # PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD: playwright-core fetches none anyway; say so twice.
  (cd "$dest" && PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --no-audit --no-fund --loglevel=error >&2) ||
    die "npm ci failed"
  printf '%s\n' "$want" >"$stamp"
fi
printf '%s\n' "$dest/node_modules"
