#!/usr/bin/env bash
# Builds llama.cpp's llama-bench, llama-simple, llama-completion, llama-perplexity and
# llama-tokenize OUTSIDE the repo, from the source that PyPI's llama-cpp-python 0.3.36 vendors
# (llama.cpp 0c1e57098, the commit of tests/data's reference vectors; bench/llamacpp-vectors.sh
# links its libraries). Idempotent; prints the build directory.
# Usage: bench/build-llamacpp.sh [--source-only | --server]
#   --source-only: only download and unpack the source (seconds, no cmake), print its directory:
#        what tests/tokenizer_llama_vocabs.rs needs (llama.cpp's models/ggml-vocab-* files)
#   --server: llama-server instead (bench/vs-llama-server.sh), without its web UI (no npm,
#        no download of prebuilt assets)
#   Env: LLAMACPP_DIR (default ~/.cache/edgellm/llama.cpp), JOBS (default: nproc)
#        LLAMACPP_TARGET=aarch64 cross-builds for aarch64 (static binaries, run under
#        qemu-aarch64-static; needs g++-aarch64-linux-gnu, see scripts/setup.sh)
set -euo pipefail
source_only=0
server=0
case "${1:-}" in
    "") ;;
    --source-only) source_only=1 ;;
    --server) server=1 ;;
    *) echo "usage: $0 [--source-only | --server]" >&2; exit 2 ;;
esac
root="${LLAMACPP_DIR:-$HOME/.cache/edgellm/llama.cpp}"
target="${LLAMACPP_TARGET:-native}"
build="$root/build-$target"
log() { echo "build-llamacpp: $*" >&2; }
src="$root/llama-cpp-python-0.3.36/vendor/llama.cpp"
# The source is fetched once; both modes share it.
fetch_source() {
    mkdir -p "$root"
    if [ ! -f "$src/CMakeLists.txt" ]; then
        log "downloading llama-cpp-python 0.3.36 sdist from PyPI"
        # The file itself, checked against its pinned sha256: `pip download` of an sdist first
        # prepares its metadata, which builds its build dependencies (cmake) from source.
        python3 - "$root" <<'PY' >&2
import hashlib, os, sys, urllib.request
url = ("https://files.pythonhosted.org/packages/ec/e9/"
       "e7de2b0463ea3ffbf0ede6cb21b58c1258a8f6521aae45ca773a59fe7cf3/llama_cpp_python-0.3.36.tar.gz")
want = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
dest = os.path.join(sys.argv[1], "llama_cpp_python-0.3.36.tar.gz")
data = urllib.request.urlopen(url, timeout=300).read()
got = hashlib.sha256(data).hexdigest()
if got != want:
    sys.exit(f"build-llamacpp: {url}: sha256 {got}, want {want}")
with open(dest + ".part", "wb") as f:
    f.write(data)
os.replace(dest + ".part", dest)
PY
        tar -xzf "$root/llama_cpp_python-0.3.36.tar.gz" -C "$root" 2>/dev/null || tar -xzf "$root"/llama_cpp_python-0.3.36.tar.gz -C "$root"
        # An `a && b` as a function's last command would make it fail under set -e.
        if [ -d "$root/llama_cpp_python-0.3.36" ]; then
            mv "$root/llama_cpp_python-0.3.36" "$root/llama-cpp-python-0.3.36"
        fi
    fi
}
if [ "$source_only" = 1 ]; then fetch_source; echo "$src"; exit 0; fi
targets=(llama-bench llama-simple llama-completion llama-perplexity llama-tokenize)
[ "$server" = 0 ] || targets=(llama-server)
missing=()
for t in "${targets[@]}"; do [ -x "$build/bin/$t" ] || missing+=("$t"); done
if [ ${#missing[@]} -eq 0 ]; then echo "$build"; exit 0; fi
command -v cmake >/dev/null || { log "installing cmake"; apt-get install -y -qq cmake >/dev/null; }
fetch_source
server_flag=OFF
[ "$server" = 0 ] || server_flag=ON
flags=(-DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF
       -DLLAMA_BUILD_SERVER=$server_flag -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF
       -DBUILD_SHARED_LIBS=OFF)
if [ "$target" = aarch64 ]; then
    # Same rule as ours: no build-host CPU flags; armv8.2-a+dotprod matches qemu's cortex-a76.
    # Static: the cross libc (/usr/aarch64-linux-gnu) is not the arm64 one qemu finds in /lib
    # without -L, so a static binary is the one that runs the same everywhere. No OpenMP
    # (ggml's own thread pool instead; libgomp does not link statically everywhere).
    command -v aarch64-linux-gnu-g++ >/dev/null || { log "aarch64-linux-gnu-g++ missing: run scripts/setup.sh"; exit 1; }
    flags+=(-DCMAKE_SYSTEM_NAME=Linux -DCMAKE_SYSTEM_PROCESSOR=aarch64
            -DCMAKE_C_COMPILER=aarch64-linux-gnu-gcc -DCMAKE_CXX_COMPILER=aarch64-linux-gnu-g++
            -DCMAKE_FIND_ROOT_PATH=/usr/aarch64-linux-gnu
            -DCMAKE_FIND_ROOT_PATH_MODE_PROGRAM=NEVER -DCMAKE_FIND_ROOT_PATH_MODE_LIBRARY=ONLY
            -DCMAKE_FIND_ROOT_PATH_MODE_INCLUDE=ONLY
            -DCMAKE_EXE_LINKER_FLAGS=-static
            -DGGML_NATIVE=OFF -DGGML_CPU_ARM_ARCH=armv8.2-a+dotprod -DGGML_OPENMP=OFF)
else
    flags+=(-DGGML_NATIVE=ON)
fi
# A tree configured without the server is configured again for it (the other targets keep
# their objects).
if [ ! -f "$build/CMakeCache.txt" ] ||
   { [ "$server" = 1 ] && ! grep -q '^LLAMA_BUILD_SERVER:BOOL=ON' "$build/CMakeCache.txt"; }; then
    log "configuring ($target)"
    cmake -S "$src" -B "$build" "${flags[@]}" >&2
fi
log "building ${missing[*]} (about 15 minutes on 2 cores)"
nice -n 10 cmake --build "$build" -j "${JOBS:-$(nproc)}" --target "${missing[@]}" >&2
echo "$build"
