#!/usr/bin/env bash
# Whole-process side-by-side of edgellm and llama.cpp (start-up time, memory and CPU
# per token): each engine is run as a fresh process, the two alternate (and swap who goes first
# each run) so that machine noise hits both alike, and every row is a ratio measured in the
# same run. Called by bench/vs-llamacpp.sh; runs on its own too.
#
# Usage: bench/vs-llamacpp-process.sh [quant …]      (default: q4_0 q4_1 q8_0)
# Env:   THREADS      thread counts, comma-separated (default 1,2)
#        CTX          --ctx / -c for both engines; sizes the KV of the RSS bound (default 2048)
#        TTFT_RUNS    timed runs per engine for time-to-first-token (default 5, plus 1 warm-up)
#        CPU_RUNS     runs per engine for CPU-seconds/token and peak RSS (default 3)
#        CPU_NG       tokens generated in those runs (default 128)
#        PROMPT5      the 5-token prompt of the TTFT runs (default 'The capital of France is')
#        CPU_PROMPT   the prompt of the CPU runs (default 'Once upon a time'; greedy SmolLM2
#                     does not stop on it before 128 tokens, and the count is checked anyway)
#        SKIP_TTFT=1, SKIP_CPU=1   leave a section out (SKIP_CPU also drops peak RSS)
#        EDGELLM_BIN  edgellm binary (default: cargo build --release)
#        LLAMA_CLI    llama.cpp's CLI (default: llama-completion from bench/build-llamacpp.sh)
#
# What is measured (printed with the tables):
#   ttft      wall time from fork/exec to exit of a process that loads the model, tokenizes
#             the 5-token prompt, processes it and generates exactly 1 token (-n 1), warm page
#             cache; median of TTFT_RUNS. llama.cpp's default warm-up run is included: it is
#             part of what its start-up costs.
#   cpu/tok   (user+sys CPU seconds of the whole process) / generated tokens, for a run of
#             CPU_NG tokens (llama.cpp with --ignore-eos); median of CPU_RUNS.
#   peak RSS  ru_maxrss of those same runs (median), against weight bytes (tensor data, from
#             `edgellm inspect --json`) + f16 KV bytes for CTX + 16 MiB.
# Resource usage comes from wait4(2) on the child (what GNU time reports too, at µs resolution
# for CPU time). Both engines run greedy (--temp 0), f16 KV, mmapped weights, CTX context.
set -euo pipefail
cd "$(dirname "$0")/.."
quants=("$@"); [ ${#quants[@]} -gt 0 ] || quants=(q4_0 q4_1 q8_0)

if [ -z "${EDGELLM_BIN:-}" ]; then
    cargo build --release --quiet --bin edgellm
    EDGELLM_BIN="${CARGO_TARGET_DIR:-$PWD/target}/release/edgellm"
fi
LLAMA_CLI=${LLAMA_CLI:-"$(bench/build-llamacpp.sh)/bin/llama-completion"}
models=()
for q in "${quants[@]}"; do models+=("$q=$(models/fetch.sh "$q" | tail -n 1)"); done

python3 - "$EDGELLM_BIN" "$LLAMA_CLI" "${models[@]}" <<'PY'
import json, os, subprocess, sys, tempfile, time, statistics as st

edgellm, llama = sys.argv[1], sys.argv[2]
models = [m.split("=", 1) for m in sys.argv[3:]]
env = os.environ.get
threads = [int(t) for t in env("THREADS", "1,2").split(",")]
ctx = int(env("CTX", "2048"))
ttft_runs, cpu_runs, cpu_ng = int(env("TTFT_RUNS", "5")), int(env("CPU_RUNS", "3")), int(env("CPU_NG", "128"))
prompt5 = env("PROMPT5", "The capital of France is")
cpu_prompt = env("CPU_PROMPT", "Once upon a time")
skip_ttft, skip_cpu = env("SKIP_TTFT") == "1", env("SKIP_CPU") == "1"
tmp = tempfile.mkdtemp(prefix="vs-llamacpp-process.")
MiB = 1024 * 1024
load_start = open("/proc/loadavg").read().split()[:3]

def run(argv):
    """Runs argv to completion; returns (wall s, user+sys s, max RSS bytes, stdout, stderr)."""
    out, err = open(f"{tmp}/out", "w+"), open(f"{tmp}/err", "w+")
    t0 = time.perf_counter()
    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err)
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    out.seek(0); err.seek(0)
    o, e = out.read(), err.read()
    out.close(); err.close()
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(argv)}\n{e[-2000:]}")
    return wall, ru.ru_utime + ru.ru_stime, ru.ru_maxrss * 1024, o, e

def ours(model, prompt, n, t):
    return [edgellm, "run", "-m", model, "--prompt", prompt, "-n", str(n), "-t", str(t),
            "-c", str(ctx), "--json"]

def theirs(model, prompt, n, t, ignore_eos=False):
    a = [llama, "-m", model, "-p", prompt, "-n", str(n), "-t", str(t), "-c", str(ctx),
         "--temp", "0", "-no-cnv", "--no-display-prompt"]
    return a + (["--ignore-eos"] if ignore_eos else [])

def generated(o):
    v = json.loads(o.strip().splitlines()[-1])
    return v, len([g for g in v["generated_ids"]])

def alternate(a, b, n, warm):
    """Runs a and b n times each, alternating and swapping who goes first; `warm` untimed
    runs of each first (page cache)."""
    for _ in range(warm):
        run(a); run(b)
    ra, rb = [], []
    for i in range(n):
        if i % 2 == 0:
            ra.append(run(a)); rb.append(run(b))
        else:
            rb.append(run(b)); ra.append(run(a))
    return ra, rb

rows = []
notes = []
def row(q, metric, t, a, b, target, met, fmt):
    ratio = a / b if b else float("nan")
    rows.append(f"| {q.upper()} | {metric} | {t} | {fmt(a)} | {fmt(b)} | {ratio:.2f}x | {target} | {'yes' if met(a, b) else 'NO'} |")

for q, model in models:
    info = json.loads(subprocess.run([edgellm, "inspect", "-m", model, "--json", "--ctx", str(ctx)],
                                     check=True, capture_output=True, text=True).stdout)
    h = info["hparams"]
    kv_dim = h["n_head_kv"] * h["head_dim"]
    kv_bytes = h["n_layer"] * ctx * 2 * kv_dim * 2
    bound = info["tensor_bytes"] + kv_bytes + 16 * MiB
    notes.append(f"{q.upper()}: weights {info['tensor_bytes'] / MiB:.1f} MiB (tensor data; file "
                 f"{info['file_bytes'] / MiB:.1f} MiB) + KV {kv_bytes / MiB:.1f} MiB "
                 f"({h['n_layer']} layers x {ctx} ctx x 2 x {kv_dim} x 2 B) + 16 MiB = {bound / MiB:.1f} MiB")
    for t in threads:
        if not skip_ttft:
            print(f"process: {q} ttft t={t}", file=sys.stderr)
            ra, rb = alternate(ours(model, prompt5, 1, t), theirs(model, prompt5, 1, t), ttft_runs, 1)
            v, n = generated(ra[0][3])
            if v["timings"]["prompt_tokens"] != 5 or n != 1:
                notes.append(f"{q.upper()} ttft: edgellm saw {v['timings']['prompt_tokens']} prompt tokens, generated {n}")
            a, b = st.median(r[0] for r in ra) * 1000, st.median(r[0] for r in rb) * 1000
            row(q, "ttft (ms, process)", t, a, b, "≤ 0.50x", lambda a, b: a <= 0.5 * b, lambda x: f"{x:.0f}")
        if not skip_cpu:
            print(f"process: {q} cpu t={t}", file=sys.stderr)
            ra, rb = alternate(ours(model, cpu_prompt, cpu_ng, t),
                               theirs(model, cpu_prompt, cpu_ng, t, ignore_eos=True), cpu_runs, 0)
            counts = [generated(r[3])[1] for r in ra]
            if min(counts) != cpu_ng:
                notes.append(f"{q.upper()} cpu t={t}: edgellm generated {counts} tokens (divided by each)")
            a = st.median(r[1] / c for r, c in zip(ra, counts)) * 1000
            b = st.median(r[1] for r in rb) / cpu_ng * 1000
            row(q, f"cpu ms/token (user+sys, n={cpu_ng})", t, a, b, "≤ 1.00x", lambda a, b: a <= b, lambda x: f"{x:.2f}")
            a, b = st.median(r[2] for r in ra) / MiB, st.median(r[2] for r in rb) / MiB
            row(q, f"peak RSS (MiB, ctx {ctx})", t, a, b, f"≤ {bound / MiB:.1f} MiB",
                lambda a, b: a <= bound / MiB, lambda x: f"{x:.1f}")

print()
print(f"| quant | metric | threads | edgellm | llama.cpp | ratio | target | met? |")
print(f"|---|---|---:|---:|---:|---:|---|---|")
print("\n".join(rows))
print()
if not skip_ttft:
    print(f"- ttft: wall time of a whole process (fork/exec to exit) that loads the model, processes the "
          f"5-token prompt {prompt5!r} and generates 1 token, warm page cache, median of {ttft_runs}; "
          f"edgellm `run -n 1` vs `{os.path.basename(llama)} -n 1` (its warm-up run included).")
if not skip_cpu:
    print(f"- cpu ms/token: (user+sys) of the whole process / generated tokens, {cpu_ng} tokens after "
          f"{cpu_prompt!r} (llama.cpp: --ignore-eos), median of {cpu_runs}; load and prompt included.")
    print(f"- peak RSS: ru_maxrss of the cpu runs (median); bound = weights + f16 KV for ctx {ctx} + 16 MiB:")
for n in notes:
    if not skip_cpu or " ttft" in n:
        print(f"  - {n}")
load_end = open("/proc/loadavg").read().split()[:3]
print(f"- load average (1/5/15 min) at start {' '.join(load_start)}, at end {' '.join(load_end)}, "
      f"on {os.cpu_count()} CPUs: rows with more threads than idle cores measure contention.")
PY
