#!/usr/bin/env bash
# Pins the commit yocto/meta-edgellm builds: sets SRCREV in recipes-ai/edgellm/edgellm_0.1.0.bb
# to COMMIT (default HEAD), as a full 40-digit hash. Refuses a commit whose Cargo.lock lists
# other crates than edgellm-crates.inc (yocto/scripts/update-crates.py --check --rev COMMIT):
# the image build would fetch the wrong crates and fail hours later. It edits the recipe only
# (SRCREV, and on the line below it the sha256 of that commit's Cargo.lock, which lets a clone
# without the history check the pin too); commit the change yourself.
#
# Usage: yocto/scripts/bump-srcrev.sh [COMMIT]
# After a Cargo.lock change: regenerate and commit the .inc with the lock file, then pin that
# commit (or any later one with the same Cargo.lock) and commit the recipe.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
recipe="$root/yocto/meta-edgellm/recipes-ai/edgellm/edgellm_0.1.0.bb"
want=${1:-HEAD}

commit=$(git -C "$root" rev-parse --verify --quiet "$want^{commit}") \
    || { echo "bump-srcrev: $want is not a commit of $root" >&2; exit 1; }
if ! python3 "$here/update-crates.py" --check --rev "$commit" >/dev/null; then
    echo "bump-srcrev: refused: edgellm-crates.inc does not list the crates of $commit's Cargo.lock" >&2
    echo "bump-srcrev: pin a commit whose Cargo.lock it was generated from, or regenerate it" >&2
    echo "bump-srcrev: (yocto/scripts/update-crates.py), commit, and pin that commit" >&2
    exit 1
fi
if ! git -C "$root" merge-base --is-ancestor "$commit" HEAD; then
    echo "bump-srcrev: note: $commit is not an ancestor of HEAD (tests/yocto_recipe.rs wants one)" >&2
fi

old=$(sed -n 's/^SRCREV = "\([0-9a-f]*\)"$/\1/p' "$recipe")
[ "$(printf '%s\n' "$old" | grep -c .)" = 1 ] \
    || { echo "bump-srcrev: $recipe has no single 'SRCREV = \"<hash>\"' line" >&2; exit 1; }
grep -q '^# Cargo.lock of SRCREV: sha256 ' "$recipe" \
    || { echo "bump-srcrev: $recipe has no '# Cargo.lock of SRCREV: sha256' line" >&2; exit 1; }
if [ "$old" = "$commit" ]; then
    echo "bump-srcrev: SRCREV is already $commit ($(git -C "$root" log -1 --format=%s "$commit"))"
    exit 0
fi
lock_sha=$(git -C "$root" show "$commit:Cargo.lock" | sha256sum | cut -d' ' -f1)
sed -i -e "s/^SRCREV = \"$old\"\$/SRCREV = \"$commit\"/" \
    -e "s/^# Cargo.lock of SRCREV: sha256 [0-9a-f]*\$/# Cargo.lock of SRCREV: sha256 $lock_sha/" "$recipe"
echo "bump-srcrev: SRCREV $old -> $commit ($(git -C "$root" log -1 --format=%s "$commit"))"
echo "bump-srcrev: edgellm-crates.inc lists its Cargo.lock; commit ${recipe#"$root"/}"
