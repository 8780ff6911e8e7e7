#!/usr/bin/env bash
# Installs everything edgellm's tests need on a fresh Debian 12 machine (run as root).
# Idempotent: each step checks before it installs, so a second run costs seconds.
#   - the aarch64 cross toolchain: Debian's rustc-web (with the arm64 std), the cross linker, qemu-user
#   - mosquitto and its clients (the broker and mosquitto_pub/sub/rr of the MQTT tests), and
#     openssl (the TLS tests make their certificates with it)
#   - socat (serial tests: pty pairs behind link paths that vanish and return) and mbpoll (a
#     second, independent Modbus master for the Modbus tests)
#   - g++ for aarch64: bench/build-llamacpp.sh cross-builds llama.cpp (C++) for the emulated comparison
#   - packaging and the emulated board: cargo-deb (from crates.io, pinned), file, python3-venv
#     (oelint-adv and kas from PyPI, by scripts/check-yocto.sh), mmdebstrap with arch-test and
#     binfmt-support (the board's arm64 root filesystem), qemu-system-arm (the board itself)
#   - python3-jinja2: tests/chat_templates_jinja2.rs renders chat templates with Python's Jinja2 as
#     Hugging Face's apply_chat_template does. Debian's package for /usr/bin/python3 rather than
#     a venv from PyPI: no network at test time, one version per Debian release (3.1.2 on 12,
#     which transformers accepts: it needs 3.1), and nothing to rebuild when the cache is wiped
#   - python3-jsonschema: tests/constrained_corpus.rs validates every answer marked valid with
#     Python's jsonschema, an implementation independent of the grammar engine that made it
#   - the models (SmolLM2, Gemma 3, Qwen2.5-Coder, via models/fetch.sh) are fetched by the test command itself
set -euo pipefail

need_pkgs=()
have() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }

if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    dpkg --add-architecture arm64
fi
for p in rustc-web libstd-rust-web-dev:arm64 gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user-static mosquitto mosquitto-clients openssl socat mbpoll unzip \
         g++-aarch64-linux-gnu file python3-venv python3-jinja2 python3-jsonschema mmdebstrap arch-test binfmt-support qemu-system-arm e2fsprogs; do
    have "$p" || need_pkgs+=("$p")
done
if [ ${#need_pkgs[@]} -gt 0 ]; then
    echo "setup: installing ${need_pkgs[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}" >/dev/null
fi
# cargo-deb builds the .debs (scripts/build-deb.sh); pinned, so a new release cannot change them.
cargo_deb=3.8.0
if [ "$(cargo deb --version 2>/dev/null | awk '{print $2}')" != "$cargo_deb" ]; then
    echo "setup: cargo install cargo-deb $cargo_deb" >&2
    cargo install --quiet --locked cargo-deb --version "$cargo_deb"
fi
echo "setup: cross toolchain ready: $(/usr/bin/rustc --version), $(qemu-aarch64-static --version | head -n1)" >&2
