#!/usr/bin/env bash
# The dependency tree against deny.toml: licences, bans (one version of each crate but the
# older copies deny.toml names, with the crate that holds on to each), sources (crates.io only).
# Offline: the crates are fetched first (from crates.io, as any build does); the check itself
# reaches nothing. Advisories are not checked here: their database is a git repository on
# GitHub, which the offline CI does not reach (docs/dependencies.md, Advisories).
#
#   scripts/check-deps.sh            install cargo-deny if needed, then check
#   scripts/check-deps.sh --install  only install it (scripts/test.sh does this in the
#                                    background, while the native tests mostly wait)
set -euo pipefail
cd "$(dirname "$0")/.."
# Pinned, so that a new release cannot change what CI allows.
cargo_deny=0.20.2
if [ "$(cargo deny --version 2>/dev/null | awk '{print $2}')" != "$cargo_deny" ]; then
    echo "check-deps: cargo install cargo-deny $cargo_deny" >&2
    cargo install --quiet --locked cargo-deny --version "$cargo_deny"
fi
[ "${1:-}" = --install ] && exit 0
cargo fetch --locked --quiet
cargo deny --offline --log-level error check licenses bans sources
echo "check-deps: licences, bans and sources as deny.toml allows ($(grep -c '^name = ' Cargo.lock) crates in Cargo.lock)"
