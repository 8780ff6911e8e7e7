#!/usr/bin/env bash
# The project's whole test suite, as README.md gives it and .ci/run calls it:
#   1. installs what the tests need (apt: arm64 cross toolchain, qemu-user, mosquitto),
#   2. fetches the test model into the cache (~/.cache/edgellm, outside the repo),
#   3. runs every test natively (x86_64), the real-model tests included,
#   4. checks that the workspace builds with the minimum Rust version (rustup installs it), and
#      the dependency tree's licences, bans and sources (cargo deny, deny.toml),
#   5. runs the kernel and engine tests for aarch64 under qemu (every path on `max`; what the
#      cortex-a53 and cortex-a76 models change, the path detection, on those),
#   6. checks the Yocto layer and the Debian packages, and boots the emulated arm64 board
#      (scripts/board-test.sh: its root filesystem is cached outside the repo).
set -euo pipefail
cd "$(dirname "$0")/.."

# Each stage's header says how long the one before it took; the last line gives the total.
stage_start=$SECONDS
stage_name=
# CI machines differ in free disk (one ran out during this script): each stage says what the
# build trees and the cache hold and what is left.
disk() {
    local cache="${EDGELLM_CACHE:-$HOME/.cache/edgellm}" t c
    t=$(du -sh target 2>/dev/null | cut -f1 || true)
    c=$(du -sh "$cache" 2>/dev/null | cut -f1 || true)
    printf '=== disk: target %s, cache %s, %s free\n' "${t:-0}" "${c:-0}" \
        "$(df -h --output=avail . | tail -n1 | tr -d ' ')"
}
step() {
    [ -z "$stage_name" ] || printf '=== took %ds: %s\n' $((SECONDS - stage_start)) "$stage_name"
    disk
    stage_start=$SECONDS
    stage_name=$*
    printf '\n=== %s ===\n' "$*"
}
finish() {
    [ -z "$stage_name" ] || printf '=== took %ds: %s\n' $((SECONDS - stage_start)) "$stage_name"
    disk
    printf '=== all stages: %ds\n' "$SECONDS"
}
trap finish EXIT
# Each build here is built once: incremental state would only take disk.
export CARGO_INCREMENTAL=0
# A build tree no later stage uses is removed when its stages are done, so the peak is not the
# sum of five trees (EDGELLM_KEEP_BUILDS=1 keeps them, for a quicker rerun on a roomy disk).
prune() {
    [ "${EDGELLM_KEEP_BUILDS:-0}" = 1 ] || rm -rf "$@"
}

step "setup (apt packages; no-op when installed)"
if [ "$(id -u)" = 0 ]; then scripts/setup.sh; else sudo scripts/setup.sh; fi

# The emulated board's root filesystem, when it is not cached yet, is built meanwhile: mostly
# emulated dpkg work on one core, while the tests below often wait on their child processes.
rootfs_log="$PWD/target/board-rootfs.log"
mkdir -p target
setsid scripts/board-test.sh --rootfs-only >"$rootfs_log" 2>&1 &
rootfs_pid=$!
# cargo-deny (for the dependencies stage) is built meanwhile too, on the cores the tests leave.
deny_log="$PWD/target/cargo-deny-install.log"
setsid scripts/check-deps.sh --install >"$deny_log" 2>&1 &
deny_pid=$!
# A stage that fails stops the script: the builds in the background stop with it.
trap 'kill -- -"$rootfs_pid" -"$deny_pid" 2>/dev/null || true; finish' EXIT

step "model files (fetched and derived once, then verified)"
cargo build --release --quiet --bin edgellm
export EDGELLM_BIN="$PWD/target/release/edgellm"
# SmolLM2 in its three quants, and Gemma 3's shipped Q4_K_M file (~250 MB, cached like the
# rest) with its Q4_0 and Q8_0 requantizations (under a second each; the board profiles'
# estimates are checked against every file of models/models.toml).
# Qwen2.5-Coder 0.5B and 1.5B as published (~1.6 GB, cached): the boards' default models, held
# to llama.cpp's vectors; `default` is this machine's board's (tests/readme_demo.rs asks it).
models/fetch.sh q4_1 q4_0 q8_0 gemma3-270m gemma3-270m-q4_0 gemma3-270m-q8_0 \
    qwen2.5-0.5b qwen2.5-1.5b default >/dev/null
# llama.cpp's vocabulary-only GGUF files and their cases (tests/tokenizer_llama_vocabs.rs).
bench/build-llamacpp.sh --source-only >/dev/null
EDGELLM_MODEL_DIR="${EDGELLM_CACHE:-$HOME/.cache/edgellm}/models"
export EDGELLM_MODEL_DIR

step "native tests ($(uname -m))"
# The real-model greedy ids of this run are kept for the aarch64 run to compare against.
ids_x86="$PWD/target/greedy-ids-$(uname -m).json"
gemma_ids_x86="$PWD/target/greedy-ids-gemma3-$(uname -m).json"
qwen_ids_x86="$PWD/target/greedy-ids-qwen2-$(uname -m).json"
format_ids_x86="$PWD/target/format-ids-$(uname -m).json"
# So is a session snapshot, for the aarch64 run to restore and continue.
kv_x86="$PWD/target/kv-snapshot-$(uname -m)"
rm -rf "$kv_x86"
# The kernel paths this CPU must offer, from its flags, so that a detection bug cannot turn
# the native kernel tests into a walk of the reference path only.
expect=
if [ "$(uname -m)" = x86_64 ]; then
    flags=$(grep -m1 '^flags' /proc/cpuinfo)
    has() { for f in "$@"; do [[ " $flags " == *" $f "* ]] || return 1; done; }
    has avx2 fma f16c && expect=avx2
    has avx2 fma f16c avx512_vnni avx512vl && expect=avx2,avx512vnni
fi
echo "native kernel paths expected: ${expect:-(none beyond reference/portable)}"
EDGELLM_EXPECT_PATHS=$expect \
EDGELLM_IDS_OUT="$ids_x86" EDGELLM_GEMMA_IDS_OUT="$gemma_ids_x86" EDGELLM_QWEN_IDS_OUT="$qwen_ids_x86" \
EDGELLM_FORMAT_IDS_OUT="$format_ids_x86" \
EDGELLM_KV_OUT="$kv_x86" \
    cargo test --workspace

# Cargo.toml declares rust-version = "1.88" for Yocto's own Rust (wrynose ships >= 1.90): the
# code and every crate Cargo.lock pins must build with it, not only with the newest rustc.
# --all-targets: the benches too, type-checked and not built (a bench build is a release build
# with LTO of criterion and every bench, five CI minutes; the benches are run by hand: bench/,
# docs/performance.md). A check of them with the newest rustc as well cost two more minutes.
step "minimum Rust version: the workspace and its benches check with 1.88 and the committed Cargo.lock"
msrv=$(sed -n 's/^rust-version = "\(.*\)"/\1/p' Cargo.toml)
rustup toolchain install "$msrv" --profile minimal >/dev/null 2>&1 || rustup toolchain install "$msrv" --profile minimal
CARGO_TARGET_DIR="$PWD/target/msrv" cargo "+$msrv" check --locked --workspace --all-targets --quiet
echo "rust $msrv: the workspace checks (locked)"
# The native tests' tree (target/debug) and the check's: no later stage builds in them.
prune target/msrv target/debug

step "dependencies: cargo deny (licences, bans, sources; offline)"
wait "$deny_pid" || { cat "$deny_log"; echo "cargo-deny could not be installed (above)" >&2; exit 1; }
scripts/check-deps.sh

step "aarch64 tests under qemu (every kernel and engine path: max; path detection: cortex-a53, cortex-a76)"
# qemu's TCG executes an instruction the same whichever -cpu model is named: the model decides
# only which features the CPU reports, so which kernel paths exist. Every test walks every path
# available (Path::available()), and on `max` that is all of them: neon, dotprod and i8mm, with
# the portable path. Walking them again on cortex-a53 (neon) and cortex-a76 (neon, dotprod)
# computed the same instructions twice more; there the detection is what differs, so that is
# what runs: the paths each CPU must offer and must not offer, and forcing a missing one.
EDGELLM_QEMU_CPUS=max scripts/test-aarch64.sh -p kernels_neon --tests
EDGELLM_QEMU_CPUS="cortex-a53 cortex-a76" scripts/test-aarch64.sh -p kernels_neon --test dispatch_walk \
    -- expected_paths_are_detected_on_this_cpu forcing_an_unknown_or_unavailable_path_is_a_clear_error
# The engine's tests for aarch64 build edgellm's whole dependency tree (tokio, rustls, the
# embedded broker, ...) a second time: half an hour of a loaded 2-core CI machine at opt-level 2.
# Under qemu they run our own code (kernels, forward pass, snapshots, at the test profile's
# opt-level 2), so the dependencies are built unoptimized: one tree for all the stages below.
a64_edgellm=(-p edgellm --config 'profile.test.package."*".opt-level=0')
# The synthetic engine and the packed dotprod and i8mm engines (the file layout's bits) on every
# path (max, as above); the allocation-free decode on the best path of max (i8mm) and of a
# cortex-a53 (neon).
EDGELLM_QEMU_CPUS=max scripts/test-aarch64.sh "${a64_edgellm[@]}" --test engine_synth --test engine_packed --test no_alloc
EDGELLM_QEMU_CPUS=cortex-a53 scripts/test-aarch64.sh "${a64_edgellm[@]}" --test no_alloc
# Batch invariance in the engine on every path (max): a session's logits decoded beside others,
# its prompt fed in pieces between steps, are its logits alone.
EDGELLM_QEMU_CPUS=max scripts/test-aarch64.sh "${a64_edgellm[@]}" --test engine_batch -- synthetic_
# Batch invariance through the service's continuous batching: answers decoded together, in
# shuffled orders and batch sizes, scratch and named sessions, are the answers alone (the
# dotprod path of a cortex-a76).
EDGELLM_QEMU_CPUS=cortex-a76 scripts/test-aarch64.sh "${a64_edgellm[@]}" --test service_batch -- \
    synthetic_answers_decoded_together_are_the_answers_alone \
    synthetic_named_sessions_decoded_together_are_the_sessions_alone
step "aarch64 restores the $(uname -m) session snapshot and continues identically (qemu cortex-a76)"
EDGELLM_QEMU_CPUS=cortex-a76 EDGELLM_KV_IN="$kv_x86" \
    scripts/test-aarch64.sh "${a64_edgellm[@]}" --test session_store another_architecture
step "aarch64 vs $(uname -m): greedy ids on the real model (qemu cortex-a76)"
EDGELLM_QEMU_CPUS=cortex-a76 EDGELLM_IDS_EXPECT="$ids_x86" \
    scripts/test-aarch64.sh "${a64_edgellm[@]}" --test engine_real greedy_ids_are_identical
step "aarch64 vs $(uname -m): Gemma 3 greedy ids (qemu cortex-a76)"
EDGELLM_QEMU_CPUS=cortex-a76 EDGELLM_GEMMA_IDS_EXPECT="$gemma_ids_x86" \
    scripts/test-aarch64.sh "${a64_edgellm[@]}" --test engine_gemma3 greedy_ids_are_identical_across
step "aarch64 vs $(uname -m): Qwen2.5-Coder 0.5B greedy ids (qemu cortex-a76)"
EDGELLM_QEMU_CPUS=cortex-a76 EDGELLM_QWEN_IDS_EXPECT="$qwen_ids_x86" \
    scripts/test-aarch64.sh "${a64_edgellm[@]}" --test engine_qwen2 greedy_ids_are_identical_across
step "aarch64 vs $(uname -m): constrained greedy ids, a JSON schema and a choice (qemu cortex-a76)"
EDGELLM_QEMU_CPUS=cortex-a76 EDGELLM_FORMAT_IDS_EXPECT="$format_ids_x86" \
    scripts/test-aarch64.sh "${a64_edgellm[@]}" --test constrained constrained_greedy_ids_are_identical_across
# The aarch64 test builds (target and host parts); the release build below has its own.
a64="${CARGO_TARGET_DIR_AARCH64:-target/aarch64-debian}"
prune "$a64/aarch64-unknown-linux-gnu/debug" "$a64/debug"

# Firmware packaging. The aarch64 release binary is built once, the way the Yocto
# recipe builds it, and then packaged and booted.
step "Yocto layer: oelint-adv wrynose, kas schema, crates file, the recipe's aarch64 release build"
scripts/check-yocto.sh
step "Debian packages (amd64, arm64): contents, systemd-analyze verify and security"
scripts/check-package.sh
step "emulated board (qemu-system-aarch64 cortex-a72): boot, UART, MQTT, watchdog, exit 78, start limit, reboot, ${EDGELLM_POWER_CUTS:-20} power cuts"
rootfs_ok=0
wait "$rootfs_pid" || rootfs_ok=$?
cat "$rootfs_log"
[ "$rootfs_ok" = 0 ] || { echo "the board's root filesystem could not be built (above)" >&2; exit 1; }
scripts/board-test.sh
