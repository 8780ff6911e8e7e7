#!/usr/bin/env bash
# The daemon's figures, side by side in one run, with the release binary on loopback: start
# to READY=1 with the default model; the daemon's overhead (client time to first chunk minus
# the daemon's queue wait and time to first token, from `edgellm ask --repeat`); streamed
# tokens/s under a steady load against `edgellm bench` tg at the same threads, alternating;
# idle CPU-seconds over IDLE_S seconds and RSS idle and under load (/proc); the stripped
# binary's size with and without the embedded-broker feature.
#
# It starts its own Mosquitto brokers on free loopback ports, with configs it writes (one with
# set_tcp_nodelay, where the figures come from; one stock, for comparison), and stops
# everything it started on exit. Bounded: every wait has a timeout, every count a default.
#
# Usage: bench/daemon.sh
# Env:   THREADS     engine threads of the daemon and of edgellm bench (default 1)
#        NG          tokens per answer under load, and bench's tg length (default 64)
#        LOAD_N      requests per load round (default 40); LOAD_C in flight (default 2: the
#                    queue never runs dry, so the worker is never idle)
#        LAT_N       requests of the overhead run, one at a time, 8 tokens each (default 60)
#        ROUNDS      load / bench alternations (default 3)
#        READY_RUNS  starts timed to READY=1 (default 5)
#        IDLE_S      seconds of idle measured (default 60)
#        SKIP_SIZE=1 leave out the second (--no-default-features) release build
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${THREADS:-1}
ng=${NG:-64}
load_n=${LOAD_N:-40}
load_c=${LOAD_C:-2}
lat_n=${LAT_N:-60}
rounds=${ROUNDS:-3}
ready_runs=${READY_RUNS:-5}
idle_s=${IDLE_S:-60}
target=${CARGO_TARGET_DIR:-$PWD/target}

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo "bench: release build" >&2
cargo build --release --quiet --bin edgellm
# A copy: a target directory shared with another checkout may be rebuilt under our feet.
cp "$target/release/edgellm" "$out/edgellm"
strip -o "$out/edgellm.stripped" "$out/edgellm"
size_nb=""
if [ "${SKIP_SIZE:-0}" != 1 ]; then
    echo "bench: release build without embedded-broker (own target dir)" >&2
    # Its own target dir, so the two feature sets do not rebuild each other's artefacts.
    CARGO_TARGET_DIR="$target/no-embedded-broker" cargo build --release --quiet \
        --no-default-features --bin edgellm
    strip -o "$out/edgellm-nb.stripped" "$target/no-embedded-broker/release/edgellm"
    size_nb=$(stat -c %s "$out/edgellm-nb.stripped")
fi
model=$(EDGELLM_BIN="$out/edgellm" models/fetch.sh q4_0 | tail -n 1)
command -v mosquitto >/dev/null || { echo "bench: needs mosquitto (Debian package mosquitto)" >&2; exit 1; }

python3 - "$out" "$model" "$threads" "$ng" "$load_n" "$load_c" "$lat_n" "$rounds" \
    "$ready_runs" "$idle_s" "$(stat -c %s "$out/edgellm.stripped")" "$size_nb" <<'PY'
import json, os, socket, statistics as st, subprocess, sys, threading, time
sys.path.insert(0, "bench")
from benchlib import ask_repeat, free_port, stop, wait_listening

(out, model, threads, ng, load_n, load_c, lat_n, rounds, ready_runs, idle_s, size, size_nb) = sys.argv[1:]
ng, load_n, load_c, lat_n, rounds, ready_runs, idle_s = map(int, (ng, load_n, load_c, lat_n, rounds, ready_runs, idle_s))
exe = f"{out}/edgellm"
tick = os.sysconf("SC_CLK_TCK")
started = []  # every process we start, stopped at the end whatever happens

def log(*a):
    print("bench:", *a, file=sys.stderr, flush=True)

def broker(name, extra):
    port = free_port()
    with open(f"{out}/{name}.conf", "w") as f:
        f.write(f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n{extra}")
    started.append(subprocess.Popen(["mosquitto", "-c", f"{out}/{name}.conf"],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    return port

# Two brokers. The figures come from one whose sockets do not delay small packets (Nagle):
# that delay is the broker's, not the daemon's (EMQX turns Nagle off by default, Mosquitto
# does not). The stock Mosquitto, beside it, shows what its default costs.
port = broker("mosquitto-nodelay", "set_tcp_nodelay true\n")
stock_port = broker("mosquitto-stock", "")

def serve(device, port=port):
    """Starts the daemon on the default model (no --model: the models/ cache), listening for
    its READY=1 ourselves; returns the process and the ms from spawn to READY=1."""
    path = f"{out}/notify-{device}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    env = {k: v for k, v in os.environ.items() if k not in ("WATCHDOG_USEC", "EDGELLM_CONFIG")}
    env["NOTIFY_SOCKET"] = path
    t0 = time.monotonic()
    p = subprocess.Popen([exe, "serve", "--mqtt", f"127.0.0.1:{port}", "--device", device,
                          "-t", threads], env=env, stdout=subprocess.DEVNULL,
                         stderr=open(f"{out}/{device}.log", "w"))
    started.append(p)
    until = t0 + 60
    while True:
        left = until - time.monotonic()
        if left <= 0 or p.poll() is not None:
            sys.exit(f"bench: no READY=1 from {device}:\n" + open(f"{out}/{device}.log").read())
        sock.settimeout(left)
        try:
            msg = sock.recv(4096)
        except socket.timeout:
            continue
        if b"READY=1" in msg.split(b"\n"):
            ms = (time.monotonic() - t0) * 1000
            sock.close()
            return p, ms

def proc(pid):
    """CPU-seconds (user + system, all threads) and VmRSS / VmHWM in MiB."""
    stat = open(f"/proc/{pid}/stat").read()
    fields = stat[stat.rindex(")") + 2:].split()
    cpu = (int(fields[11]) + int(fields[12])) / tick
    mem = {}
    for line in open(f"/proc/{pid}/status"):
        k, _, v = line.partition(":")
        if k in ("VmRSS", "VmHWM"):
            mem[k] = int(v.split()[0]) / 1024
    return cpu, mem["VmRSS"], mem["VmHWM"]

def load(device, n, c, tokens, port=port):
    return ask_repeat(exe, port, device, "Tell me about the sea.", n, c, tokens, "bench",
                      ask_timeout=120, within=600)

def bench_tg():
    r = subprocess.run([exe, "bench", "-m", model, "-p", "0", "-n", str(ng), "-t", threads,
                        "-r", "3", "--json"], capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        sys.exit(f"bench: edgellm bench failed: {r.stderr}")
    return json.loads(r.stdout)[0]["tg_tps"]

try:
    for p in (port, stock_port):
        if not wait_listening(p):
            sys.exit(f"bench: nothing listens on {p} after 20 s")
    load_before = os.getloadavg()
    # Start to READY=1: the model mapped and packed, the MQTT subscriptions in place.
    ready = []
    for i in range(ready_runs):
        p, ms = serve(f"ready-{i}")
        ready.append(ms)
        stop(p)
    log("READY=1 in", ", ".join(f"{x:.0f}" for x in ready), "ms")

    # The same overhead run through the stock Mosquitto.
    p, _ = serve("stock", stock_port)
    stock = load("stock", lat_n, 1, 8, stock_port)
    stop(p)
    log("overhead through a stock Mosquitto p50/p99", stock["overhead_ms"]["p50"], stock["overhead_ms"]["p99"], "ms")

    d, _ = serve("bench")
    pid = d.pid
    # Overhead, one request at a time (no queue): what MQTT and the daemon's I/O add to the
    # engine's own time to first token.
    lat = load("bench", lat_n, 1, 8)
    log("overhead p50/p99", lat["overhead_ms"]["p50"], lat["overhead_ms"]["p99"], "ms")

    # Idle, after it has answered (a daemon that never answered is not the interesting idle).
    time.sleep(2)
    cpu0, _, _ = proc(pid)
    time.sleep(idle_s)
    cpu1, rss_idle, _ = proc(pid)
    log(f"idle: {cpu1 - cpu0:.3f} CPU-s over {idle_s} s, RSS {rss_idle:.1f} MiB")

    # Steady load vs edgellm bench tg, alternating, RSS sampled under load.
    peak = [0.0]
    sampling = threading.Event()
    def sample():
        while not sampling.is_set():
            peak[0] = max(peak[0], proc(pid)[1])
            time.sleep(0.1)
    loads, tgs = [], []
    for r in range(rounds):
        log(f"round {r + 1}/{rounds}: load, then bench tg")
        sampling.clear()
        th = threading.Thread(target=sample)
        th.start()
        loads.append(load("bench", load_n, load_c, ng))
        sampling.set()
        th.join()
        tgs.append(bench_tg())
    _, rss_after, hwm = proc(pid)
    stop(d)
    load_after = os.getloadavg()

    inspect = json.loads(subprocess.run([exe, "inspect", "-m", model, "--ctx", "2048", "--json"],
                                        capture_output=True, text=True, check=True).stdout)
    mem = inspect["memory"]
    bound = (mem["weights"] + mem["kv_cache"]) / 2**20 + 16
    decode = st.mean(s["mean_decode_tps"] for s in loads)
    agg = st.mean(s["aggregate_tps"] for s in loads)
    tg = st.mean(tgs)
    med = lambda key, p: st.median(s[key][p] for s in loads)
    mib = lambda b: f"{int(b) / 2**20:.2f} MiB"

    print(f"edgellm daemon, {threads} thread(s); model {os.path.basename(model)}, ctx 2048;")
    print(f"load average {load_before[0]:.2f} before, {load_after[0]:.2f} after")
    print()
    print("| metric | value | target |")
    print("|---|---:|---|")
    print(f"| start to READY=1, median of {ready_runs} (ms) | {st.median(ready):.0f} (min {min(ready):.0f}, max {max(ready):.0f}) | |")
    for p in ("p50", "p99"):
        print(f"| overhead {p}, 1 in flight, {lat_n} requests (ms) | {lat['overhead_ms'][p]:.2f} | {'≤ 3 ms' if p == 'p50' else ''} |")
    for p in ("p50", "p99"):
        print(f"| overhead {p}, 1 in flight, stock Mosquitto (Nagle on) (ms) | {stock['overhead_ms'][p]:.2f} | |")
    for p in ("p50", "p99"):
        print(f"| overhead {p} under load, {load_c} in flight (ms, median of rounds) | {med('overhead_ms', p):.2f} | |")
    print(f"| client time to first chunk p50 / p99, 1 in flight (ms) | {lat['client_ttfc_ms']['p50']:.2f} / {lat['client_ttfc_ms']['p99']:.2f} | |")
    print(f"| daemon ttft_ms p50 / p99, 1 in flight (ms) | {lat['ttft_ms']['p50']:.2f} / {lat['ttft_ms']['p99']:.2f} | |")
    print(f"| streamed decode t/s under load / bench tg{ng} | {decode:.1f} / {tg:.1f} = {decode / tg:.2f}x | ≥ 0.95x |")
    print(f"| aggregate streamed t/s (completion tokens / wall, prompts included) / bench tg{ng} | {agg:.1f} / {tg:.1f} = {agg / tg:.2f}x | |")
    print(f"| idle CPU-seconds over {idle_s} s | {cpu1 - cpu0:.3f} | ≤ 0.05 |")
    print(f"| RSS idle (MiB) | {rss_idle:.1f} | ≤ {bound:.1f} |")
    print(f"| RSS under load, peak sampled every 100 ms (MiB) | {peak[0]:.1f} | ≤ {bound:.1f} |")
    print(f"| VmHWM at the end, start-up included (MiB) | {hwm:.1f} | |")
    print(f"| stripped release binary, embedded-broker (default) | {mib(size)} | |")
    if size_nb:
        print(f"| stripped release binary, --no-default-features | {mib(size_nb)} | |")
    print()
    print("each load round (decode t/s mean, aggregate t/s, overhead p50 / p99 ms):",
          "; ".join(f"{s['mean_decode_tps']:.1f}, {s['aggregate_tps']:.1f}, {s['overhead_ms']['p50']:.2f} / {s['overhead_ms']['p99']:.2f}" for s in loads))
    print("each bench tg round (t/s):", ", ".join(f"{x:.1f}" for x in tgs))
    print(f"READY=1 runs (ms): {', '.join(f'{x:.0f}' for x in ready)}")
finally:
    for p in reversed(started):
        stop(p, 5)
PY
