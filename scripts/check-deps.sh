#!/usr/bin/env bash
# The dependency tree against deny.toml: licences, bans (one version of each crate but the
# older copies deny.toml names, with the crate that holds on to each), sources (crates.io only).
# Offline: the crates are fetched first (from crates.io, as any build does); the check itself
# reaches nothing. Advisories are not checked here: their database is a git repository on
# GitHub, which this workplace does not reach (docs/dependencies.md, Advisories).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo fetch --locked --quiet
cargo deny --offline --log-level error check licenses bans sources
echo "check-deps: licences, bans and sources as deny.toml allows ($(grep -c '^name = ' Cargo.lock) crates in Cargo.lock)"
