#!/usr/bin/env bash
# Side-by-side speed of edgellm and llama.cpp on the same model files, in one run: the two
# engines alternate (ROUNDS times) so that machine noise hits both alike, and the table
# reports ratios, never lone absolute numbers. Then bench/vs-llamacpp-process.sh adds the
# whole-process rows (time to first token, peak RSS, CPU-seconds per token).
#
# Usage: bench/vs-llamacpp.sh [quant …]      (default: q4_0 q4_1 q8_0)
# Env:   THREADS (default 1,2)  PP (128)  NG (64)  REPS (3)  ROUNDS (2)
#        DEPTH  tokens already cached when pp and tg start (llama-bench -d; default 0): the
#               cost of attention over a long system prompt or conversation
#        LLAMA_BENCH  path to llama-bench (default: built by bench/build-llamacpp.sh)
#        SKIP_PROCESS=1  leave out the whole-process section (its own knobs: see that script)
#        RESULTS_DIR  where the raw outputs, the machine's description and the tables are kept
#               (default bench/results/<UTC date>[-aarch64]): a table in docs/performance.md
#               names its directory, so anyone can read the runs it was computed from
#        ARCH=aarch64  cross-build both engines for aarch64 and run both under
#                      `qemu-aarch64-static -cpu $QEMU_CPU` (default cortex-a76): an EMULATED
#                      ratio, labelled so; defaults then THREADS=1 PP=16 NG=16 REPS=2 ROUNDS=2,
#                      and no process section (start-up and RSS under qemu mean nothing).
#                      Needs scripts/setup.sh's cross toolchain; llama.cpp's build takes ~20 min.
set -euo pipefail
cd "$(dirname "$0")/.."
quants=("$@"); [ ${#quants[@]} -gt 0 ] || quants=(q4_0 q4_1 q8_0)
arch=${ARCH:-native}
runner=()
if [ "$arch" = aarch64 ]; then
    threads=${THREADS:-1}; pp=${PP:-16}; ng=${NG:-16}; reps=${REPS:-2}; rounds=${ROUNDS:-2}
    qemu_cpu=${QEMU_CPU:-cortex-a76}
    # Debian's rustc with the arm64 std, as scripts/test-aarch64.sh; a target dir of its own.
    a64_target="${CARGO_TARGET_DIR_AARCH64:-$PWD/target/aarch64-debian}"
    RUSTC=/usr/bin/rustc CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc \
    CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc CARGO_TARGET_DIR="$a64_target" \
        cargo build --release --quiet --target aarch64-unknown-linux-gnu --bin edgellm
    export EDGELLM_BIN="$a64_target/aarch64-unknown-linux-gnu/release/edgellm"
    llama_bench=${LLAMA_BENCH:-"$(LLAMACPP_TARGET=aarch64 bench/build-llamacpp.sh)/bin/llama-bench"}
    # No -L: edgellm links the arm64 libc in /lib/aarch64-linux-gnu (see scripts/test-aarch64.sh);
    # llama.cpp's aarch64 build is static.
    runner=(qemu-aarch64-static -cpu "$qemu_cpu")
else
    threads=${THREADS:-1,2}; pp=${PP:-128}; ng=${NG:-64}; reps=${REPS:-3}; rounds=${ROUNDS:-2}
    cargo build --release --quiet --bin edgellm
    export EDGELLM_BIN="${CARGO_TARGET_DIR:-$PWD/target}/release/edgellm"
    llama_bench=${LLAMA_BENCH:-"$(bench/build-llamacpp.sh)/bin/llama-bench"}
fi
# The read bandwidth (and so the bound of decoding) is measured by edgellm bench in the same
# rounds; under an emulator it would measure the emulator.
bw_flag=(); [ "$arch" = native ] && bw_flag=(--bandwidth)
depth=${DEPTH:-0}
suffix=""; [ "$arch" = native ] || suffix="-$arch"
out=${RESULTS_DIR:-bench/results/$(date -u +%F)$suffix}
mkdir -p "$out"
# What a reader needs to reproduce the numbers: the machine, its kernel and page settings, the
# compilers and the commits. llama.cpp's own build and flags come from its JSON, below.
{
    echo "- date: $(date -u +%FT%TZ)"
    echo "- edgellm: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD -- src kernels_neon Cargo.toml Cargo.lock 2>/dev/null || echo ' (with uncommitted changes to the engine)')"
    echo "- CPU: $(lscpu | sed -n 's/^Model name: *//p' | head -n1), $(nproc) CPUs online; flags: $(grep -o -w 'avx2\|avx512_vnni\|avx512f' /proc/cpuinfo | sort -u | tr '\n' ' ')"
    echo "- memory: $(awk '/MemTotal/ {printf "%.1f GiB", $2 / 1048576}' /proc/meminfo)"
    echo "- kernel: $(uname -sr)"
    echo "- transparent huge pages: $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null || echo unknown)"
    echo "- rustc: $(rustc --version)"
    echo "- gcc: $(gcc --version | head -n1)"
    echo "- load average at the start: $(cut -d' ' -f1-3 /proc/loadavg)"
    [ -n "${runner[*]}" ] && echo "- runner: ${runner[*]}"
    echo "- command: THREADS=$threads PP=$pp NG=$ng REPS=$reps ROUNDS=$rounds DEPTH=$depth ARCH=$arch bench/vs-llamacpp.sh $*"
} > "$out/environment.md"

for q in "${quants[@]}"; do
    model=$(models/fetch.sh "$q" | tail -n 1)
    rm -f "$out/edgellm@$q@"*.json "$out/llama@$q@"*.json   # an earlier run's, in the same directory
    for r in $(seq "$rounds"); do
        echo "bench: $q round $r/$rounds" >&2
        "${runner[@]}" "$EDGELLM_BIN" bench -m "$model" -p "$pp" -n "$ng" -d "$depth" -t "$threads" -r "$reps" "${bw_flag[@]}" --json > "$out/edgellm@$q@$r.json"
        "${runner[@]}" "$llama_bench" -m "$model" -t "$threads" -p "$pp" -n "$ng" -d "$depth" -r "$reps" -o json 2>/dev/null > "$out/llama@$q@$r.json"
    done
done

emulated=""; [ "$arch" = native ] || emulated="${runner[*]}"
python3 - "$out" "$pp" "$ng" "$depth" "$emulated" "${quants[@]}" <<'PY' | tee "$out/table.md"
import json, sys, glob, statistics as st
out, pp, ng, depth, emulated, quants = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6:]
at = f" @ d{depth}" if depth else ""
print("".join(open(f"{out}/environment.md").readlines()))
llama_rows = [row for f in sorted(glob.glob(f"{out}/llama@*.json")) for row in json.load(open(f))]
if llama_rows:
    r = llama_rows[0]
    print(f"llama.cpp {r.get('build_commit', '?')} (build {r.get('build_number', '?')}), llama-bench defaults: "
          f"n_batch {r.get('n_batch')}, n_ubatch {r.get('n_ubatch')}, flash_attn {r.get('flash_attn')}, "
          f"KV {r.get('type_k')}/{r.get('type_v')}, mmap {r.get('use_mmap')}; raw outputs: {out}/")
    print()
if emulated:
    print(f"EMULATED: both engines' aarch64 builds under `{emulated}` on this host; the ratio says")
    print("how the two aarch64 code paths compare under the emulator, not real-hardware speed.")
    print()
print(f"| quant | test | threads | edgellm t/s | llama.cpp t/s | ratio | per round: min / median / max |")
print(f"|---|---|---:|---:|---:|---:|---|")
targets = []
bounds = []
ratio = {}
for q in quants:
    ours, theirs, bw = {}, {}, {}
    # Each round's mean, per engine: the spread of the ratio over rounds.
    by_round = {}
    for f in sorted(glob.glob(f"{out}/edgellm@{q}@*.json")):
        rnd = f.rsplit("@", 1)[1]
        for row in json.load(open(f)):
            ours.setdefault(("pp", row["threads"]), []).append(row["pp_tps"])
            ours.setdefault(("tg", row["threads"]), []).append(row["tg_tps"])
            by_round.setdefault((("pp", row["threads"]), rnd), [[], []])[0].append(row["pp_tps"])
            by_round.setdefault((("tg", row["threads"]), rnd), [[], []])[0].append(row["tg_tps"])
            if "tg_bound_tps" in row:
                bw.setdefault(row["threads"], []).append(
                    (row["bw_gbps"], row["tg_bound_tps"], row["tg_of_bound"],
                     row.get("tg_paired_shares", [])))
    for f in sorted(glob.glob(f"{out}/llama@{q}@*.json")):
        rnd = f.rsplit("@", 1)[1]
        for row in json.load(open(f)):
            test = "pp" if row["n_prompt"] > 0 else "tg"
            theirs.setdefault((test, row["n_threads"]), []).append(row["avg_ts"])
            by_round.setdefault(((test, row["n_threads"]), rnd), [[], []])[1].append(row["avg_ts"])
    for key in sorted(ours):
        if key not in theirs:
            continue
        a, b = st.mean(ours[key]), st.mean(theirs[key])
        n = pp if key[0] == "pp" else ng
        label = " (emulated)" if emulated else ""
        per = sorted(st.mean(v[0]) / st.mean(v[1]) for (k, _), v in by_round.items() if k == key and v[0] and v[1])
        spread = f"{per[0]:.2f}x / {st.median(per):.2f}x / {per[-1]:.2f}x" if per else "—"
        print(f"| {q.upper()} | {key[0]}{n}{at}{label} | {key[1]} | {a:.1f} | {b:.1f} | {a / b:.2f}x{label} | {spread} |")
        ratio[(q, key[0], key[1])] = a / b
        if emulated and key[0] == "tg":
            met = "met" if a >= b else "NOT met"
            targets.append(f"- {q.upper()} tg{n} t={key[1]}: {a / b:.2f}x, target >= 1.00x (emulated): {met}")
        if key[0] == "tg" and key[1] in bw:
            g = st.mean(x[0] for x in bw[key[1]])
            bound = st.mean(x[1] for x in bw[key[1]])
            rounds = [x[2] for x in bw[key[1]]]
            paired = [s for x in bw[key[1]] for s in x[3]]
            bounds.append((q, key[1], g, bound, a, b, rounds, paired))
if bounds and not depth:
    print()
    print("Bound of decoding: read bandwidth (probe on huge pages, in the same rounds) / weight bytes per token.")
    print()
    print("Two shares. 'Mean / best': edgellm's mean tg against the best probe pass of the round")
    print("(passes before, between and after the runs): conservative, as the probe keeps the machine's")
    print("quietest moment and tg averages over its noisy ones. 'Paired': each tg run against the")
    print("better of the probes just before and after it (2 passes each), the median over all runs of")
    print("all rounds: the share under the load of the moment. The last columns give each round's")
    print("mean / best share and every paired one, so the spread on this machine is in view.")
    print()
    print("| quant | threads | read GB/s | bound t/s | edgellm tg | % of bound (mean / best) | % of bound (paired, median) | llama.cpp tg | % of bound (mean / best) | per round (mean / best) | each run (paired) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|")
    for q, t, g, bound, a, b, rounds, paired in bounds:
        per = ", ".join(f"{100 * r:.1f}%" for r in rounds)
        each = ", ".join(f"{100 * r:.0f}" for r in paired)
        pm = f"{100 * st.median(paired):.1f}%" if paired else "—"
        print(f"| {q.upper()} | {t} | {g:.1f} | {bound:.0f} | {a:.1f} | {100 * a / bound:.1f}% | {pm} | {b:.1f} | {100 * b / bound:.1f}% | {per} | {each} |")
        ratio[(q, "bound", t)] = a / bound
        if paired:
            ratio[(q, "paired", t)] = st.median(paired)
# The targets and the bound (weights only, no KV reads) are defined from an empty cache.
if not emulated and not depth:
    def target(name, key, want):
        if key in ratio:
            v = ratio[key]
            share = key[1] in ("bound", "paired")
            shown = f"{100 * v:.1f}%" if share else f"{v:.2f}x"
            want_s = f"{100 * want:.0f}%" if share else f"{want:.2f}x"
            targets.append(f"- {name}: {shown}, target >= {want_s}: {'met' if v >= want else 'NOT met'}")
    for t in (1, 2):
        target(f"Q4_0 tg t={t} vs llama.cpp", ("q4_0", "tg", t), 1.0)
        target(f"Q4_0 pp t={t} vs llama.cpp", ("q4_0", "pp", t), 0.8)
        target(f"Q4_1 tg t={t} vs llama.cpp", ("q4_1", "tg", t), 1.5)
    target("Q4_0 tg t=1, share of the bandwidth bound (mean / best)", ("q4_0", "bound", 1), 0.85)
    target("Q4_0 tg t=1, share of the bandwidth bound (paired, median)", ("q4_0", "paired", 1), 0.85)
if targets:
    print()
    print("\n".join(targets))
PY

if [ "$arch" = native ] && [ "${SKIP_PROCESS:-0}" != 1 ]; then
    echo
    THREADS="$threads" bench/vs-llamacpp-process.sh "${quants[@]}" | tee "$out/process.md"
fi
echo "vs-llamacpp: raw outputs and tables in $out/" >&2
