#!/usr/bin/env bash
# Many clients at once, side by side in one run: STREAMS concurrent greedy streams of NG tokens,
# answered by the daemon (continuous batching, `edgellm ask --repeat STREAMS --concurrency
# STREAMS` through a Mosquitto on loopback) and by llama.cpp's llama-server (--parallel STREAMS,
# continuous batching, its OpenAI-style chat endpoint, streamed), on the same model file and
# threads, alternating ROUNDS times. Per round: aggregate tokens/s (completion tokens of every
# stream / wall time from the first request to the last answer) and the p50/p99 time between
# two streamed chunks of one answer, as each client sees it. Prints a markdown table (median of
# the rounds, min–max beside it) and keeps the raw figures in OUT (default: a temporary
# directory, removed).
#
# Both sides stream one chunk per token unless their reader falls behind; both keep a prompt's
# cache between requests (llama-server's cache_prompt, the daemon's restored prefix), so the
# rounds after the first measure decoding more than the short prompt.
#
# Usage: bench/vs-llama-server.sh [MODEL.gguf]   (default: models/fetch.sh q4_0)
# Env:   THREADS (default 2), STREAMS (default 4), NG (default 64), ROUNDS (default 3),
#        CTX per stream (default 512), OUT (a directory to keep the raw JSON in)
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${THREADS:-2}
streams=${STREAMS:-4}
ng=${NG:-64}
rounds=${ROUNDS:-3}
ctx=${CTX:-512}
name=vs-llama-server
. bench/daemon-prep.sh
server="$(bench/build-llamacpp.sh --server)/bin/llama-server"

python3 - "$work" "$out" "$model" "$server" "$threads" "$streams" "$ng" "$rounds" "$ctx" <<'PY'
import http.client, json, os, statistics as st, subprocess, sys, threading, time
sys.path.insert(0, "bench")
from benchlib import ask_repeat, free_port, mosquitto, pct, stop

work, out, model, server, threads, streams, ng, rounds, ctx = sys.argv[1:]
streams, ng, rounds, ctx = int(streams), int(ng), int(rounds), int(ctx)
exe = f"{work}/edgellm"
QUESTION = "Write a long story about a robot who learns to paint."
started = []

def log(*a):
    print("vs-llama-server:", *a, file=sys.stderr, flush=True)

def llama_round(port):
    """STREAMS streamed chat requests at once; aggregate t/s and the gaps between chunks."""
    res = [None] * streams
    def one(i):
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        body = {"messages": [{"role": "user", "content": QUESTION}], "max_tokens": ng,
                "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
        c.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            raise SystemExit(f"vs-llama-server: llama-server answered {r.status}: {r.read()[:300]}")
        last, gaps, tokens, chunks = None, [], None, 0
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if ev.get("usage"):
                tokens = ev["usage"]["completion_tokens"]
            ch = ev.get("choices") or []
            if ch and ch[0].get("delta", {}).get("content"):
                now = time.monotonic()
                if last is not None:
                    gaps.append((now - last) * 1000)
                last = now
                chunks += 1
        res[i] = (tokens if tokens is not None else chunks, gaps, time.monotonic())
        c.close()
    t0 = time.monotonic()
    ts = [threading.Thread(target=one, args=(i,)) for i in range(streams)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(600)
    if any(r is None for r in res):
        raise SystemExit("vs-llama-server: a llama-server stream did not finish")
    wall = max(r[2] for r in res) - t0
    gaps = [g for r in res for g in r[1]]
    tokens = sum(r[0] for r in res)
    return {"aggregate_tps": tokens / wall, "completion_tokens": tokens, "wall_s": wall,
            "inter_chunk_ms": {"n": len(gaps), "p50": pct(gaps, 50), "p99": pct(gaps, 99)}}

def edgellm_round(port):
    return ask_repeat(exe, port, "vs", QUESTION, streams, streams, ng, "vs-llama-server")

try:
    bport = mosquitto(work, "mosquitto", started)
    conf = f"{work}/edgellm.toml"
    with open(conf, "w") as f:
        f.write(f"[model]\nmax_batch = {streams}\n")
    env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "EDGELLM_CONFIG")}
    d = subprocess.Popen([exe, "serve", "--config", conf, "-m", model, "--mqtt", f"127.0.0.1:{bport}",
                          "--device", "vs", "-t", threads, "--ctx", str(ctx)],
                         env=env, stdout=subprocess.DEVNULL, stderr=open(f"{work}/daemon.log", "w"))
    started.append(d)
    lport = free_port()
    ls = subprocess.Popen([server, "-m", model, "--host", "127.0.0.1", "--port", str(lport),
                           "-t", threads, "-tb", threads, "--parallel", str(streams),
                           "-c", str(ctx * streams), "--cont-batching"],
                          stdout=open(f"{work}/llama-server.log", "w"), stderr=subprocess.STDOUT)
    started.append(ls)
    until = time.monotonic() + 120
    while True:
        try:
            c = http.client.HTTPConnection("127.0.0.1", lport, timeout=2)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                break
        except OSError:
            pass
        if time.monotonic() > until or ls.poll() is not None:
            raise SystemExit("vs-llama-server: llama-server not healthy:\n" + open(f"{work}/llama-server.log").read()[-2000:])
        time.sleep(0.2)
    # A first request each, not measured: both load lazily what they can.
    edgellm_round(bport)
    llama_round(lport)
    runs = {"edgellm": [], "llama-server": []}
    for i in range(rounds):
        runs["edgellm"].append(edgellm_round(bport))
        runs["llama-server"].append(llama_round(lport))
        e, l = runs["edgellm"][-1], runs["llama-server"][-1]
        log(f"round {i + 1}: edgellm {e['aggregate_tps']:.1f} t/s p99 {e['inter_chunk_ms']['p99']} ms; "
            f"llama-server {l['aggregate_tps']:.1f} t/s p99 {l['inter_chunk_ms']['p99']:.1f} ms")
    meta = {"model": os.path.basename(model), "threads": int(threads), "streams": streams, "ng": ng,
            "rounds": rounds, "ctx_per_stream": ctx,
            "llama_server_flags": f"-t {threads} -tb {threads} --parallel {streams} -c {ctx * streams} --cont-batching"}
    with open(f"{out}/vs-llama-server.json", "w") as f:
        json.dump({"meta": meta, "runs": runs}, f, indent=1)
    def cell(name, f):
        xs = [f(r) for r in runs[name]]
        return st.median(xs), min(xs), max(xs)
    print(f"{streams} streams x {ng} tokens, {threads} threads, {os.path.basename(model)}, "
          f"{rounds} rounds (median, min-max)\n")
    print("| | edgellm | llama-server | ratio |\n|---|---:|---:|---:|")
    for label, f, better in [("aggregate tokens/s", lambda r: r["aggregate_tps"], "x"),
                             ("time between chunks p50 (ms)", lambda r: r["inter_chunk_ms"]["p50"], "/"),
                             ("time between chunks p99 (ms)", lambda r: r["inter_chunk_ms"]["p99"], "/")]:
        e, l = cell("edgellm", f), cell("llama-server", f)
        ratio = e[0] / l[0] if better == "x" else l[0] / e[0]
        print(f"| {label} | {e[0]:.1f} ({e[1]:.1f}-{e[2]:.1f}) | {l[0]:.1f} ({l[1]:.1f}-{l[2]:.1f}) | "
              f"{ratio:.2f}x{' (llama-server / edgellm)' if better == '/' else ''} |")
finally:
    for p in reversed(started):
        stop(p)
PY
