# Sourced by the benches that talk to the daemon through a Mosquitto of their own (after `cd` to
# the repository root, with `name` set to the bench's name and the model argument in $1):
# checks for mosquitto, makes the work directory `work` (removed on exit) and `out` (OUT, or a
# directory in `work`), builds the release binary and copies it to `$work/edgellm` (a target
# directory shared with another checkout may be rebuilt under our feet), and sets `model` to
# $1 or to SmolLM2 Q4_0 from models/fetch.sh.
target=${CARGO_TARGET_DIR:-$PWD/target}
command -v mosquitto >/dev/null || { echo "$name: needs mosquitto (scripts/setup.sh)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
out=${OUT:-$work/raw}
mkdir -p "$out"
echo "$name: release build" >&2
cargo build --release --quiet --bin edgellm
cp "$target/release/edgellm" "$work/edgellm"
model=${1:-$(EDGELLM_BIN="$work/edgellm" models/fetch.sh q4_0 | tail -n 1)}
[ -f "$model" ] || { echo "$name: no model file $model" >&2; exit 1; }
