#!/usr/bin/env bash
# Builds llama.cpp's llama-bench (and llama-cli tools) OUTSIDE the repo, from the source that
# PyPI's llama-cpp-python 0.3.36 vendors (llama.cpp 0c1e57098, the commit of tests/data's
# reference vectors). Idempotent; prints the build directory.
#   Env: LLAMACPP_DIR (default ~/.cache/edgellm/llama.cpp), JOBS (default: nproc)
#        LLAMACPP_TARGET=aarch64 cross-builds for aarch64 (runs under qemu-aarch64-static)
set -euo pipefail
root="${LLAMACPP_DIR:-$HOME/.cache/edgellm/llama.cpp}"
target="${LLAMACPP_TARGET:-native}"
build="$root/build-$target"
log() { echo "build-llamacpp: $*" >&2; }
if [ -x "$build/bin/llama-bench" ]; then echo "$build"; exit 0; fi
command -v cmake >/dev/null || { log "installing cmake"; apt-get install -y -qq cmake >/dev/null; }
mkdir -p "$root"
src="$root/llama-cpp-python-0.3.36/vendor/llama.cpp"
if [ ! -f "$src/CMakeLists.txt" ]; then
    log "downloading llama-cpp-python 0.3.36 sdist from PyPI"
    python3 -m pip download --quiet --no-binary :all: --no-deps -d "$root" llama-cpp-python==0.3.36 >&2
    tar -xzf "$root/llama_cpp_python-0.3.36.tar.gz" -C "$root" 2>/dev/null || tar -xzf "$root"/llama_cpp_python-0.3.36.tar.gz -C "$root"
    [ -d "$root/llama_cpp_python-0.3.36" ] && mv "$root/llama_cpp_python-0.3.36" "$root/llama-cpp-python-0.3.36"
fi
flags=(-DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF
       -DLLAMA_BUILD_SERVER=OFF -DBUILD_SHARED_LIBS=OFF)
if [ "$target" = aarch64 ]; then
    # Same rule as ours: no build-host CPU flags; armv8.2-a+dotprod matches qemu's cortex-a76.
    flags+=(-DCMAKE_SYSTEM_NAME=Linux -DCMAKE_SYSTEM_PROCESSOR=aarch64
            -DCMAKE_C_COMPILER=aarch64-linux-gnu-gcc -DCMAKE_CXX_COMPILER=aarch64-linux-gnu-g++
            -DGGML_NATIVE=OFF -DGGML_CPU_ARM_ARCH=armv8.2-a+dotprod -DGGML_OPENMP=OFF)
else
    flags+=(-DGGML_NATIVE=ON)
fi
log "configuring ($target)"
cmake -S "$src" -B "$build" "${flags[@]}" >&2
log "building llama-bench, llama-cli, llama-simple (about 15 minutes on 2 cores)"
cmake --build "$build" -j "${JOBS:-$(nproc)}" --target llama-bench llama-simple >&2
echo "$build"
