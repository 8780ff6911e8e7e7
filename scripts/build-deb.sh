#!/usr/bin/env bash
# Builds edgellm's Debian packages with `cargo deb` (metadata: [package.metadata.deb] in
# Cargo.toml) and prints each .deb's path on stdout.
#   amd64: rustup's cargo, a release build.
#   arm64: Debian's rustc for aarch64, the way yocto/meta-edgellm builds it (--frozen, no
#          target-cpu: one binary for every ARMv8 board, the kernels pick their path at run
#          time), into target/aarch64-debian as scripts/test-aarch64.sh.
# Usage: scripts/build-deb.sh [amd64] [arm64]        (default: both)
# Needs: cargo-deb (`cargo install cargo-deb --locked`; scripts/setup.sh installs the pinned one).
set -euo pipefail
cd "$(dirname "$0")/.."
arches=("$@")
[ ${#arches[@]} -gt 0 ] || arches=(amd64 arm64)
for arch in "${arches[@]}"; do
    case $arch in
        amd64)
            cargo build --release --frozen --quiet --bin edgellm
            cargo deb --no-build --strip --output target/debian/ 2>/dev/null
            ;;
        arm64)
            (
                . scripts/aarch64-env.sh
                # The build check-yocto.sh makes (the recipe's): CI builds it once.
                aarch64_release_build
                cargo deb --no-build --strip --target aarch64-unknown-linux-gnu --output target/debian/ 2>/dev/null
            )
            ;;
        *) echo "build-deb: unknown architecture $arch (amd64 or arm64)" >&2; exit 2 ;;
    esac
done
