#!/usr/bin/env bash
# Side-by-side speed of edgellm and llama.cpp on the same model files, in one run: the two
# engines alternate (ROUNDS times) so that machine noise hits both alike, and the table
# reports ratios, never lone absolute numbers.
#
# Usage: bench/vs-llamacpp.sh [quant …]      (default: q4_0 q4_1 q8_0)
# Env:   THREADS (default 1,2)  PP (128)  NG (64)  REPS (3)  ROUNDS (2)
#        LLAMA_BENCH  path to llama-bench (default: built by bench/build-llamacpp.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
quants=("$@"); [ ${#quants[@]} -gt 0 ] || quants=(q4_0 q4_1 q8_0)
threads=${THREADS:-1,2}; pp=${PP:-128}; ng=${NG:-64}; reps=${REPS:-3}; rounds=${ROUNDS:-2}

cargo build --release --quiet --bin edgellm
export EDGELLM_BIN="$PWD/target/release/edgellm"
llama_bench=${LLAMA_BENCH:-"$(bench/build-llamacpp.sh)/bin/llama-bench"}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

for q in "${quants[@]}"; do
    model=$(models/fetch.sh "$q" | tail -n 1)
    for r in $(seq "$rounds"); do
        echo "bench: $q round $r/$rounds" >&2
        "$EDGELLM_BIN" bench -m "$model" -p "$pp" -n "$ng" -t "$threads" -r "$reps" --json > "$out/edgellm-$q-$r.json"
        "$llama_bench" -m "$model" -t "$threads" -p "$pp" -n "$ng" -r "$reps" -o json 2>/dev/null > "$out/llama-$q-$r.json"
    done
done

python3 - "$out" "$pp" "$ng" "${quants[@]}" <<'PY'
import json, sys, glob, statistics as st
out, pp, ng, quants = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
print(f"| quant | test | threads | edgellm t/s | llama.cpp t/s | ratio |")
print(f"|---|---|---:|---:|---:|---:|")
for q in quants:
    ours, theirs = {}, {}
    for f in sorted(glob.glob(f"{out}/edgellm-{q}-*.json")):
        for row in json.load(open(f)):
            ours.setdefault(("pp", row["threads"]), []).append(row["pp_tps"])
            ours.setdefault(("tg", row["threads"]), []).append(row["tg_tps"])
    for f in sorted(glob.glob(f"{out}/llama-{q}-*.json")):
        for row in json.load(open(f)):
            test = "pp" if row["n_prompt"] > 0 else "tg"
            theirs.setdefault((test, row["n_threads"]), []).append(row["avg_ts"])
    for key in sorted(ours):
        if key not in theirs:
            continue
        a, b = st.mean(ours[key]), st.mean(theirs[key])
        n = pp if key[0] == "pp" else ng
        print(f"| {q.upper()} | {key[0]}{n} | {key[1]} | {a:.1f} | {b:.1f} | {a / b:.2f}x |")
PY
