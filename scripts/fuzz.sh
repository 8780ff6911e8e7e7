#!/usr/bin/env bash
# Fuzzing campaign: runs each libFuzzer target of tests/fuzz/ for a while on the
# nightly toolchain, prints one summary table, and keeps whatever it found.
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]      (default: 600 s, every target)
#
# A crash, timeout, out-of-memory or leak artefact is copied to tests/fuzz/regressions/<target>/
# and the script exits 1: minimise it (`cargo +nightly fuzz tmin --fuzz-dir tests/fuzz T FILE`),
# fix the library, and commit the file; tests/fuzz_regressions.rs then replays it on stable in
# every `cargo test`. Build jobs follow CARGO_BUILD_JOBS, the build tree CARGO_TARGET_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."

secs=${1:-600}
[[ $secs =~ ^[0-9]+$ ]] || { echo "usage: $0 [SECONDS_PER_TARGET] [TARGET...]" >&2; exit 2; }
shift $(($# > 0 ? 1 : 0))
fuzz_dir=tests/fuzz
mapfile -t all < <(sed -n 's/^name = "\(.*\)"$/\1/p' "$fuzz_dir/Cargo.toml" | grep -vx edgellm-fuzz)
targets=("${@:-${all[@]}}")

# cargo-fuzz is built with stable (it is an ordinary binary); only the targets need nightly for
# the sanitizer and coverage flags. Pinned, so that every machine fuzzes the same way.
cargo_fuzz_version=0.13.1
if ! cargo fuzz --version 2>/dev/null | grep -q " $cargo_fuzz_version\$"; then
    cargo +stable install --locked cargo-fuzz --version "$cargo_fuzz_version"
fi
rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal

# The targets' lock file is committed: a build that would change it is an error, not an update
# (cargo fuzz has no --locked of its own).
cargo +nightly metadata --locked --format-version 1 --manifest-path "$fuzz_dir/Cargo.toml" >/dev/null
cargo +nightly fuzz build --fuzz-dir "$fuzz_dir"

# New inputs libFuzzer finds go to a scratch copy: the committed corpus stays a small seed set.
scratch=$(mktemp -d "${TMPDIR:-/tmp}/edgellm-fuzz.XXXXXX")
trap 'rm -rf "$scratch"' EXIT

found=0
rows=()
for t in "${targets[@]}"; do
    mkdir -p "$scratch/$t/corpus" "$scratch/$t/artifacts"
    cp "$fuzz_dir/corpus/$t/"* "$scratch/$t/corpus/" 2>/dev/null || true
    # Earlier findings seed the run too: their neighbourhood is where bugs were.
    cp "$fuzz_dir/regressions/$t/"* "$scratch/$t/corpus/" 2>/dev/null || true
    log="$scratch/$t/log"
    echo "=== $t: ${secs}s" >&2
    # -timeout: one input taking over 10 s is a hang; -malloc_limit_mb: a single allocation
    # that large from inputs of a few KiB is unbounded, well before the RSS limit is reached.
    rc=0
    cargo +nightly fuzz run --fuzz-dir "$fuzz_dir" "$t" "$scratch/$t/corpus" -- \
        -max_total_time="$secs" -rss_limit_mb=2048 -malloc_limit_mb=512 -timeout=10 \
        -print_final_stats=1 -artifact_prefix="$scratch/$t/artifacts/" >"$log" 2>&1 || rc=$?
    # libFuzzer's last status line ("#N ... cov: C ft: F ...") and its final stats.
    last=$(grep -E '^#[0-9]+' "$log" | tail -n1 || true)
    cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
    ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n1)
    shopt -s nullglob
    artefacts=("$scratch/$t/artifacts/"{crash,timeout,oom,leak}-*)
    shopt -u nullglob
    result=ok
    if ((${#artefacts[@]} > 0)); then
        result="FOUND ${#artefacts[@]}"
        found=1
        mkdir -p "$fuzz_dir/regressions/$t"
        cp "${artefacts[@]}" "$fuzz_dir/regressions/$t/"
        tail -n 40 "$log" >&2
    elif ((rc != 0)); then
        # Neither a finding nor a clean end (a build or setup failure): show why.
        result="failed rc=$rc"
        found=1
        tail -n 20 "$log" >&2
    fi
    rows+=("$(printf '%-14s %-12s %12s %10s %7s %8s' "$t" "$result" "${execs:--}" "${rate:--}" "${cov:--}" "${ft:--}")")
done

printf '\n%-14s %-12s %12s %10s %7s %8s\n' target result execs 'exec/s' cov ft
printf '%s\n' "${rows[@]}"
if ((found)); then
    echo "findings copied to $fuzz_dir/regressions/<target>/: minimise, fix, commit" >&2
    exit 1
fi
