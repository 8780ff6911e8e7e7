# Sourced (not run) by the scripts that build for aarch64 with Debian's rustc and its arm64
# std (scripts/setup.sh installs them): test-aarch64.sh, check-yocto.sh, build-deb.sh.
export RUSTC=/usr/bin/rustc
export CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
# A target dir of its own: Debian's rustc must not share artefacts with rustup's.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR_AARCH64:-target/aarch64-debian}"

# The release binary as yocto/meta-edgellm's recipe builds it (cargo.bbclass: --frozen
# --release --target, the recipe's --no-default-features and PACKAGECONFIG's --features; no
# target-cpu). check-yocto.sh checks it, build-deb.sh packages the same build.
aarch64_release_build() {
    cargo build --release --frozen --quiet --target aarch64-unknown-linux-gnu \
        --no-default-features --features embedded-broker
}
