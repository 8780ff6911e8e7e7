//! The Yocto recipe fetches every crate Cargo.lock names from
//! `yocto/meta-edgellm/recipes-ai/edgellm/edgellm-crates.inc`; a lock file changed without
//! regenerating it breaks the image build hours later, on someone else's machine. These tests
//! run the generator's `--check` (yocto/scripts/update-crates.py) so `cargo test` catches it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn crates_inc() -> PathBuf {
    repo().join("yocto/meta-edgellm/recipes-ai/edgellm/edgellm-crates.inc")
}

/// Runs the generator with `args`; a missing python3 fails the test, it does not skip it.
fn update_crates(args: &[&str]) -> Output {
    Command::new("python3")
        .arg(repo().join("yocto/scripts/update-crates.py"))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run python3 (scripts/setup.sh installs it): {e}"))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn git(dir: &Path, args: &[&str]) {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run git: {e}"));
    assert!(out.status.success(), "git {args:?}: {}", text(&out.stderr));
}

/// A scratch source tree holding `lock` as its tracked Cargo.lock (the generator asks git
/// which lock files the tree holds, as bitbake sees a git checkout).
fn scratch_tree(lock: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("Cargo.lock"), lock).expect("write Cargo.lock");
    git(dir.path(), &["init", "-q"]);
    git(dir.path(), &["add", "Cargo.lock"]);
    dir
}

#[test]
fn the_yocto_crates_file_matches_cargo_lock() {
    let out = update_crates(&["--check"]);
    assert!(
        out.status.success(),
        "{}\n{}run yocto/scripts/update-crates.py and commit the .inc",
        text(&out.stdout),
        text(&out.stderr)
    );
    // Every crates.io package of the lock file is fetched, and none other.
    let lock = std::fs::read_to_string(repo().join("Cargo.lock")).expect("Cargo.lock");
    let registry = lock.matches("source = \"registry+").count();
    let inc = std::fs::read_to_string(crates_inc()).expect("edgellm-crates.inc");
    assert_eq!(inc.matches("crate://crates.io/").count(), registry);
    assert_eq!(inc.matches(".sha256sum] = \"").count(), registry);
    assert!(
        !inc.contains("crate://crates.io/kernels_neon/"),
        "a path dependency is not on crates.io"
    );
}

#[test]
fn a_lock_file_with_a_changed_checksum_makes_the_crates_file_stale() {
    let lock = std::fs::read_to_string(repo().join("Cargo.lock")).expect("Cargo.lock");
    let first = lock
        .find("checksum = \"")
        .expect("a checksum in Cargo.lock")
        + 12;
    let mut changed = lock.clone();
    let flipped = if &lock[first..first + 1] == "0" {
        "1"
    } else {
        "0"
    };
    changed.replace_range(first..first + 1, flipped);
    let tree = scratch_tree(&changed);
    let inc = crates_inc();
    let out = update_crates(&[
        "--check",
        "--root",
        tree.path().to_str().unwrap(),
        "--output",
        inc.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("is stale against Cargo.lock"), "{stderr}");
    assert!(
        stderr.contains("sha256sum"),
        "the message names the line: {stderr}"
    );

    // The same tree with the lock file unchanged is in sync: only the change made it stale.
    let same = scratch_tree(&lock);
    let out = update_crates(&[
        "--check",
        "--root",
        same.path().to_str().unwrap(),
        "--output",
        inc.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
}
