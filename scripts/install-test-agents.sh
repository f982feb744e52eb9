#!/usr/bin/env bash
# Installs the coding agents and SDKs the integration tests drive through toki
# (tests/agents/package.json, versions pinned by its package-lock.json) into a
# cache directory outside the source tree, and prints the directory of their
# binaries (node_modules/.bin) as its last line.
#
#   TOKI_AGENTS_DIR   where to install (default ${XDG_CACHE_HOME:-~/.cache}/tokirecur/agents)
#   TOKI_AGENTS_FORCE=1  reinstall even when the lock file has not changed
#
# It installs only when package.json or the lock file differ from the ones
# installed last (kept as copies next to node_modules), so a second run costs
# nothing. It uses `npm install` on the copied lock rather than `npm ci`: npm
# (11.19) leaves other platforms' optional packages (opencode-darwin-arm64,
# ...) out of a lock it writes on Linux, and `npm ci` then refuses that lock as
# out of sync. Every version is pinned exactly in package.json, and each
# installed version is checked against it afterwards. Each CLI is then run with
# --version, so a package that installs but does not run on this Node fails
# here rather than in a test.
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)/tests/agents"
dest=${TOKI_AGENTS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tokirecur/agents}

for tool in node npm; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "install-test-agents: $tool is not installed (scripts/install-deps.sh installs nodejs and npm)" >&2
    exit 1
  fi
done

mkdir -p "$dest"
if [ "${TOKI_AGENTS_FORCE:-0}" = 1 ] || [ ! -d "$dest/node_modules/.bin" ] ||
   ! cmp -s "$src/package-lock.json" "$dest/package-lock.json" ||
   ! cmp -s "$src/package.json" "$dest/package.json"; then
  echo "install-test-agents: installing into $dest (node $(node --version), npm $(npm --version))" >&2
  rm -f "$dest/package.json" "$dest/package-lock.json"
  start=$(date +%s)
  cp "$src/package.json" "$src/package-lock.json" "$dest/"
  # Some of these declare node >=22 but run on 20; engine-strict stays off.
  if ! (cd "$dest" && npm install --no-audit --no-fund --loglevel=error >&2); then
    rm -f "$dest/package-lock.json" # so that the next run tries again
    echo "install-test-agents: npm install failed" >&2
    exit 1
  fi
  cp "$src/package-lock.json" "$dest/package-lock.json" # the stamp: what was installed
  echo "install-test-agents: installed in $(( $(date +%s) - start )) s" >&2
else
  echo "install-test-agents: up to date in $dest" >&2
fi

# The installed versions are the pinned ones.
(cd "$dest" && node -e '
const want = require("./package.json").dependencies;
let bad = 0;
for (const [name, v] of Object.entries(want)) {
  const got = require("./node_modules/" + name + "/package.json").version;
  if (got !== v) { console.error(`install-test-agents: ${name} is ${got}, not ${v}`); bad = 1; }
}
process.exit(bad);') || exit 1

bin="$dest/node_modules/.bin"
for cli in claude codex opencode qwen cline droid copilot; do
  if ! out=$(cd "$dest" && HOME="$dest/.home" timeout 120 "$bin/$cli" --version 2>&1); then
    echo "install-test-agents: $cli --version failed:" >&2
    echo "$out" >&2
    exit 1
  fi
  echo "install-test-agents: $cli $(echo "$out" | tail -1)" >&2
done
for lib in openai @anthropic-ai/sdk; do
  (cd "$dest" && node -e "import('$lib').then(() => {}, e => { console.error(e.message); process.exit(1) })") ||
    { echo "install-test-agents: the $lib package does not load" >&2; exit 1; }
done
echo "$bin"
