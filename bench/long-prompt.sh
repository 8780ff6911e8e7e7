#!/usr/bin/env bash
# What a long prompt does to the answers already streaming: STREAMS concurrent greedy streams of
# NG tokens through the daemon (continuous batching, `edgellm ask --repeat STREAMS --concurrency
# STREAMS` through a Mosquitto on loopback), alone and then with a prompt of PROMPT tokens
# arriving DELAY seconds after them, alternating ROUNDS times. Per run: the p50/p99 time between
# two streamed chunks of one answer, as the client sees it; for the long prompt, its time to
# first token. Prints a markdown table (median of the rounds, min–max beside it) and keeps the
# raw figures in OUT (default: a temporary directory, removed).
#
# The long prompt differs in every round (its first line names the round), so no round reuses
# the previous one's positions; the streams' short question is the same every time.
#
# Usage: bench/long-prompt.sh [MODEL.gguf]   (default: models/fetch.sh q4_0)
# Env:   THREADS (default 1), STREAMS (default 3), NG (default 256), PROMPT (tokens, default
#        1000), DELAY (seconds, default 0.5), ROUNDS (default 3), CHUNK (model.chunk, default
#        64), OUT (a directory to keep the raw JSON in)
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${THREADS:-1}
streams=${STREAMS:-3}
ng=${NG:-256}
prompt=${PROMPT:-1000}
delay=${DELAY:-0.5}
rounds=${ROUNDS:-3}
chunk=${CHUNK:-64}
name=long-prompt
. bench/daemon-prep.sh

python3 - "$work" "$out" "$model" "$threads" "$streams" "$ng" "$prompt" "$delay" "$rounds" "$chunk" <<'PY'
import json, os, statistics as st, subprocess, sys, threading, time
sys.path.insert(0, "bench")
from benchlib import ask_repeat, mosquitto, stop

work, out, model, threads, streams, ng, prompt, delay, rounds, chunk = sys.argv[1:]
streams, ng, prompt, rounds, chunk, delay = int(streams), int(ng), int(prompt), int(rounds), int(chunk), float(delay)
exe = f"{work}/edgellm"
QUESTION = "Write a long story about a robot who learns to paint."
started = []

def log(*a):
    print("long-prompt:", *a, file=sys.stderr, flush=True)

def tokens(text):
    r = subprocess.run([exe, "tokenize", "-m", model], input=text, capture_output=True,
                       text=True, timeout=60, check=True)
    return len(r.stdout.split())

def long_text(rnd):
    """A plant log of about PROMPT tokens (the question around it included)."""
    head = f"Shift report {rnd}. Summarise the faults in this log in one sentence.\n"
    line = lambda i: f"Line {i}: pump {i % 7} pressure {i * 0.1:.1f} bar, valve open, temperature {20 + i % 9} C.\n"
    per_line = tokens(line(12))
    n = max(1, (prompt - tokens(head)) // per_line)
    text = head + "".join(line(i) for i in range(n))
    while tokens(text) < prompt:
        n += 1
        text += line(n)
    return text

def ask(port, question, n, c, tokens_each):
    return ask_repeat(exe, port, "lp", question, n, c, tokens_each, "long-prompt")

def streams_run(port):
    return ask(port, QUESTION, streams, streams, ng)

def with_long(port, rnd):
    text = long_text(rnd)
    res = {}
    def run_streams():
        res["streams"] = streams_run(port)
    t = threading.Thread(target=run_streams)
    t.start()
    time.sleep(delay)
    t0 = time.monotonic()
    res["long"] = ask(port, text, 1, 1, 8)
    res["long_done_s"] = time.monotonic() - t0 + delay
    res["long_prompt_tokens"] = tokens(text)
    t.join(900)
    if "streams" not in res:
        raise SystemExit("long-prompt: the streams did not finish")
    return res

try:
    port = mosquitto(work, "mosquitto", started)
    conf = f"{work}/edgellm.toml"
    with open(conf, "w") as f:
        f.write(f"[model]\nmax_batch = {streams + 1}\nchunk = {chunk}\n")
    env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "EDGELLM_CONFIG")}
    ctx = prompt + 256 if prompt + 256 > ng + 128 else ng + 128
    d = subprocess.Popen([exe, "serve", "--config", conf, "-m", model, "--mqtt", f"127.0.0.1:{port}",
                          "--device", "lp", "-t", threads, "--ctx", str(ctx)],
                         env=env, stdout=subprocess.DEVNULL, stderr=open(f"{work}/daemon.log", "w"))
    started.append(d)
    streams_run(port)  # not measured: the first answers map what they touch
    runs = {"alone": [], "with_prompt": []}
    for i in range(rounds):
        runs["alone"].append(streams_run(port))
        runs["with_prompt"].append(with_long(port, i))
        a, w = runs["alone"][-1], runs["with_prompt"][-1]
        log(f"round {i + 1}: p99 between chunks {a['inter_chunk_ms']['p99']} ms alone, "
            f"{w['streams']['inter_chunk_ms']['p99']} ms with a {w['long_prompt_tokens']}-token prompt "
            f"(its first token after {w['long']['client_ttfc_ms']['p50']} ms; streams {w['streams']['wall_s']} s, "
            f"finish {w['streams']['finish_reasons']})")
    meta = {"model": os.path.basename(model), "threads": int(threads), "streams": streams, "ng": ng,
            "prompt_tokens": prompt, "delay_s": delay, "rounds": rounds, "chunk": chunk, "ctx": ctx}
    with open(f"{out}/long-prompt.json", "w") as f:
        json.dump({"meta": meta, "runs": runs}, f, indent=1)
    def cell(xs):
        return f"{st.median(xs):.1f} ({min(xs):.1f}-{max(xs):.1f})"
    alone = lambda k: [r["inter_chunk_ms"][k] for r in runs["alone"]]
    withp = lambda k: [r["streams"]["inter_chunk_ms"][k] for r in runs["with_prompt"]]
    ratio = [w / a for w, a in zip(withp("p99"), alone("p99"))]
    print(f"{streams} streams x {ng} tokens, {threads} threads, {os.path.basename(model)}, a "
          f"{prompt}-token prompt after {delay} s, chunk {chunk}, {rounds} rounds (median, min-max)\n")
    print("| | streams alone | with the prompt | ratio |\n|---|---:|---:|---:|")
    print(f"| time between chunks p50 (ms) | {cell(alone('p50'))} | {cell(withp('p50'))} | |")
    print(f"| time between chunks p99 (ms) | {cell(alone('p99'))} | {cell(withp('p99'))} | "
          f"{st.median(ratio):.2f}x ({min(ratio):.2f}-{max(ratio):.2f}) |")
    ttfc = [r["long"]["client_ttfc_ms"]["p50"] for r in runs["with_prompt"]]
    print(f"\nThe long prompt's first chunk after {cell(ttfc)} ms.")
finally:
    for p in reversed(started):
        stop(p)
PY
