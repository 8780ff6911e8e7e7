#!/usr/bin/env bash
# Checks that a daemon binary carries no test hooks: the `test-hooks` feature, which `cargo
# test` turns on so that the tests can stall the engine or SIGKILL the daemon at an exact point
# (EDGELLM_TEST_HOOK), must never reach a device. Without the feature the code that reads the
# variable is not compiled, so its name is nowhere in the binary: nothing in it can read it,
# whatever the environment says. scripts/check-package.sh runs this on every packaged binary.
# Usage: scripts/check-no-test-hooks.sh BINARY...
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: $0 BINARY..." >&2; exit 2; }
for bin in "$@"; do
    [ -f "$bin" ] || { echo "check-no-test-hooks: $bin: no such file" >&2; exit 1; }
    if grep -qaF EDGELLM_TEST_HOOK "$bin"; then
        echo "check-no-test-hooks: FAIL: $bin has the test hooks (built with the test-hooks feature)" >&2
        exit 1
    fi
    echo "check-no-test-hooks: $bin: none"
done
