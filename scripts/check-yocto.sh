#!/usr/bin/env bash
# Checks yocto/meta-edgellm as far as this machine can without a Yocto build (which needs the
# network and hours):
#   1. oelint-adv --release wrynose on every .bb/.bbappend/.inc/.conf: no findings at all
#   2. the kas files against kas's own JSON schema
#   3. edgellm-crates.inc in sync with Cargo.lock (yocto/scripts/update-crates.py --check)
#   4. the aarch64 release binary built the way the recipe builds it: cargo build --release
#      --frozen --target aarch64-unknown-linux-gnu --no-default-features --features
#      embedded-broker, no target-cpu (Debian's rustc, as scripts/test-aarch64.sh sets it up)
# The tools come from PyPI, pinned, into a venv cached outside the repo.
# Env: EDGELLM_CACHE  cache root (default ~/.cache/edgellm); the venv is $EDGELLM_CACHE/venv-yocto
set -euo pipefail
cd "$(dirname "$0")/.."

OELINT_ADV_VERSION=9.11.2
KAS_VERSION=5.5
venv="${EDGELLM_CACHE:-$HOME/.cache/edgellm}/venv-yocto"
stamp="$venv/.edgellm-pins"
pins="oelint-adv==$OELINT_ADV_VERSION kas==$KAS_VERSION"
if [ "$(cat "$stamp" 2>/dev/null)" != "$pins" ]; then
    echo "check-yocto: installing $pins into $venv"
    rm -rf "$venv"
    python3 -m venv "$venv" || { echo "check-yocto: python3 -m venv failed (Debian: apt-get install python3-venv)" >&2; exit 1; }
    # shellcheck disable=SC2086
    "$venv/bin/pip" install --quiet --disable-pip-version-check $pins
    echo "$pins" > "$stamp"
fi

# --- 1. oelint-adv ------------------------------------------------------------------------
echo "check-yocto: oelint-adv $OELINT_ADV_VERSION --release wrynose on yocto/meta-edgellm"
mapfile -t files < <(find yocto/meta-edgellm \( -name '*.bb' -o -name '*.bbappend' -o -name '*.inc' -o -name '*.conf' \) | sort)
[ ${#files[@]} -gt 0 ] || { echo "check-yocto: no recipes found under yocto/meta-edgellm" >&2; exit 1; }
printf '  %s\n' "${files[@]}"
# Every finding fails, info included. The one exception is scoped to one file and two rules:
# edgellm-crates.inc is written exactly as oe-core's cargo-update-recipe-crates class writes
# it (`SRC_URI += " \` opening a list of continuation lines), so `bitbake -c update_crates`
# gives no diff; oelint's inconspaces/notneededspace rules object to that opening space.
# Other suppressions are inline `# nooelint:` comments, each with its reason beside it.
generated=yocto/meta-edgellm/recipes-ai/edgellm/edgellm-crates.inc
findings=$("$venv/bin/oelint-adv" --release wrynose --quiet --relpaths "${files[@]}" 2>&1 \
    | grep -v -E "^${generated}:[0-9]+:[a-z]+:oelint\.vars\.(inconspaces|notneededspace):" || true)
if [ -n "$findings" ]; then
    echo "$findings" >&2
    echo "check-yocto: oelint-adv has findings (above)" >&2
    exit 1
fi
echo "check-yocto: oelint-adv: no findings in ${#files[@]} files"

# --- 2. kas schema ------------------------------------------------------------------------
echo "check-yocto: kas $KAS_VERSION schema on yocto/kas/*.yml"
"$venv/bin/python" - yocto/kas/*.yml <<'PY'
import json, os, sys
import jsonschema, kas, yaml
schema_path = os.path.join(os.path.dirname(kas.__file__), "schema-kas.json")
with open(schema_path) as f:
    schema = json.load(f)
bad = 0
for path in sys.argv[1:]:
    with open(path) as f:
        doc = yaml.safe_load(f)
    errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(doc), key=lambda e: list(e.path))
    for e in errors:
        print(f"  {path}: {'/'.join(map(str, e.path)) or '(top)'}: {e.message}", file=sys.stderr)
    bad += bool(errors)
    print(f"  {path}: {'INVALID' if errors else 'valid'}")
sys.exit(1 if bad else 0)
PY

# --- 3. crates file -----------------------------------------------------------------------
echo "check-yocto: edgellm-crates.inc against Cargo.lock"
python3 yocto/scripts/update-crates.py --check

# --- 4. the recipe's build ----------------------------------------------------------------
# cargo.bbclass: `cargo build -v --frozen --target <triple> --release` plus the recipe's
# --no-default-features and PACKAGECONFIG's --features; no RUSTFLAGS with target-cpu, so the
# binary runs on any ARMv8.0 core and picks its kernels at run time.
echo "check-yocto: aarch64 release build as the recipe does it (--frozen, no target-cpu)"
. scripts/aarch64-env.sh
unset RUSTFLAGS CARGO_ENCODED_RUSTFLAGS CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUSTFLAGS
if grep -rn '^[^#]*target-cpu' .cargo/ 2>/dev/null; then
    echo "check-yocto: .cargo/ sets target-cpu (above); the recipe's build has none" >&2
    exit 1
fi
aarch64_release_build
bin="$CARGO_TARGET_DIR/aarch64-unknown-linux-gnu/release/edgellm"
machine=$(aarch64-linux-gnu-readelf -h "$bin" | sed -n 's/^ *Machine: *//p')
[ "$machine" = AArch64 ] || { echo "check-yocto: $bin is not an aarch64 binary (ELF machine: ${machine:-none})" >&2; exit 1; }
echo "check-yocto: $bin: ELF $machine, $(du -h "$bin" | cut -f1)"
