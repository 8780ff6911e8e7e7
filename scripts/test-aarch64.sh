#!/usr/bin/env bash
# Builds the tests for aarch64 with Debian's rustc and runs them under qemu-user on three CPU
# models, so that each ARM kernel path really executes:
#   cortex-a53  ARMv8.0, base NEON only (Raspberry Pi 3/4 class)
#   cortex-a76  + dotprod (sdot)           (RK3588, Raspberry Pi 5)
#   max         + dotprod + i8mm (smmla)
# Usage: scripts/test-aarch64.sh [cargo test args…] [-- test filters…]
#        (default: the kernels_neon tests)
# Env:   EDGELLM_QEMU_CPUS  the CPU models to run on (default: "cortex-a53 cortex-a76 max")
# qemu runs WITHOUT -L /usr/aarch64-linux-gnu: that cross libc differs from the arm64 libc the
# Rust std links against (/lib/aarch64-linux-gnu, installed with libstd-rust-web-dev:arm64), and
# with it every thread spawn hangs.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/aarch64-env.sh
args=() filters=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do args+=("$1"); shift; done
[ $# -eq 0 ] || { shift; filters=("$@"); }
# --tests: doctests would need a rustdoc for the target, and test nothing ARM-specific.
[ ${#args[@]} -gt 0 ] || args=(-p kernels_neon --tests)

log=$(mktemp)
trap 'rm -f "$log"' EXIT
for cpu in ${EDGELLM_QEMU_CPUS:-cortex-a53 cortex-a76 max}; do
    case $cpu in
        cortex-a53) expect=neon;              expect_not=dotprod,i8mm ;;
        cortex-a76) expect=neon,dotprod;      expect_not=i8mm ;;
        max)        expect=neon,dotprod,i8mm; expect_not= ;;
    esac
    echo "=== aarch64 tests under qemu -cpu $cpu (expect paths: $expect) ==="
    CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64-static -cpu $cpu" \
    EDGELLM_EXPECT_PATHS=$expect EDGELLM_EXPECT_NOT_PATHS=$expect_not \
        cargo test --target aarch64-unknown-linux-gnu "${args[@]}" -- --nocapture "${filters[@]}" 2>&1 \
        | grep -v '^\s*Compiling\|^\s*Fresh' | tee "$log" || exit 1
    # A filter that matches nothing would make a pass of nothing run.
    if [ ${#filters[@]} -gt 0 ] && ! grep -q '^test result: ok\. [1-9]' "$log"; then
        echo "test-aarch64: no test matched ${filters[*]} on $cpu" >&2
        exit 1
    fi
done
