//! The test hooks are a test build's only: the binary `cargo test` runs has them (the daemon
//! tests stall and kill it with `EDGELLM_TEST_HOOK`), and the check that every packaged binary
//! runs through (scripts/check-no-test-hooks.sh, from scripts/check-package.sh) finds them
//! there, so it cannot pass a firmware built with them.

mod common;

use std::process::Command;

fn check(bin: &std::path::Path) -> std::process::Output {
    Command::new("bash")
        .arg(common::repo_root().join("scripts/check-no-test-hooks.sh"))
        .arg(bin)
        .output()
        .expect("run scripts/check-no-test-hooks.sh")
}

#[test]
fn the_package_check_refuses_a_binary_built_with_the_test_hooks() {
    let out = check(std::path::Path::new(env!("CARGO_BIN_EXE_edgellm")));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("has the test hooks"),
        "the test build's daemon passed the check: {}{stderr}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn the_package_check_passes_a_binary_without_them() {
    // Any executable that never names the variable: what a release build of the daemon is.
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("edgellm");
    std::fs::copy("/bin/true", &bin).unwrap();
    let out = check(&bin);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
