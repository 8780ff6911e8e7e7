//! The Yocto recipe builds one pinned commit: `SRCREV` in
//! `yocto/meta-edgellm/recipes-ai/edgellm/edgellm_0.1.0.bb` is a literal full hash (so the layer
//! parses wherever it is copied to), the commit is in this repository's history, and its
//! Cargo.lock lists exactly the crates `edgellm-crates.inc` fetches, or the image build
//! fails hours later on a crate it did not fetch. `yocto/scripts/bump-srcrev.sh` moves the pin.
//!
//! The recipe also records the sha256 of SRCREV's Cargo.lock. With the history, the test holds
//! that record to the commit; a clone without it (a shallow checkout) cannot see the commit,
//! and holds the working tree's Cargo.lock to the record instead: the crates file matches that
//! lock (tests/yocto_crates.rs), so it matches the pin's. `pin_problem` itself refuses a
//! shallow clone rather than pass it.

mod common;

use common::sha256_hex;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn recipe_dir() -> PathBuf {
    repo().join("yocto/meta-edgellm/recipes-ai/edgellm")
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// `git -C dir ARGS`: its stdout when it succeeds, else its stderr.
fn git(dir: &Path, args: &[&str]) -> Result<String, String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run git: {e}"));
    let text = |b: &[u8]| String::from_utf8_lossy(b).trim_end().to_owned();
    if out.status.success() {
        Ok(text(&out.stdout))
    } else {
        Err(text(&out.stderr))
    }
}

/// The recipe's lines that assign `var` (`VAR = …`, `VAR .= …`, `VAR:append …`, …), comments
/// and the flags of other variables left out.
fn assignments<'a>(recipe: &'a str, var: &str) -> Vec<&'a str> {
    recipe
        .lines()
        .filter(|l| {
            l.strip_prefix(var)
                .is_some_and(|rest| rest.starts_with([' ', ':', '[', '.', '+', '?', '=']))
        })
        .collect()
}

/// The pinned commit: the recipe's one `SRCREV = "<40 hex digits>"`.
fn srcrev_of(recipe: &str) -> Result<String, String> {
    let lines = assignments(recipe, "SRCREV");
    let [line] = lines[..] else {
        return Err(format!("want one SRCREV line, found {lines:?}"));
    };
    let hash = line
        .strip_prefix("SRCREV = \"")
        .and_then(|r| r.strip_suffix('"'))
        .ok_or_else(|| format!("SRCREV is not a plain literal: {line:?}"))?;
    if hash.len() != 40
        || !hash
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
    {
        return Err(format!(
            "SRCREV is not a full lower-case commit hash: {line:?}"
        ));
    }
    Ok(hash.to_owned())
}

/// A crate as the image build fetches it: name, version, sha256.
type Crate = (String, String, String);

/// The crates `edgellm-crates.inc` fetches: each `crate://crates.io/NAME/VERSION` with its
/// `SRC_URI[NAME-VERSION.sha256sum]`.
fn crates_of_inc(inc: &str) -> Result<BTreeSet<Crate>, String> {
    let sums: BTreeMap<&str, &str> = inc
        .lines()
        .filter_map(|l| {
            let (key, sum) = l.strip_prefix("SRC_URI[")?.split_once(".sha256sum] = \"")?;
            Some((key, sum.strip_suffix('"')?))
        })
        .collect();
    inc.lines()
        .filter_map(|l| l.trim().strip_prefix("crate://crates.io/"))
        .map(|c| {
            let (name, version) = c
                .trim_end_matches(" \\")
                .split_once('/')
                .ok_or_else(|| format!("a crate line without a version: {c:?}"))?;
            let sum = sums
                .get(format!("{name}-{version}").as_str())
                .ok_or_else(|| format!("{name} {version} has no sha256sum"))?;
            Ok((name.to_owned(), version.to_owned(), (*sum).to_owned()))
        })
        .collect()
}

/// The crates.io packages of a Cargo.lock.
fn crates_of_lock(lock: &str) -> Result<BTreeSet<Crate>, String> {
    #[derive(serde::Deserialize)]
    struct Lock {
        package: Vec<Package>,
    }
    #[derive(serde::Deserialize)]
    struct Package {
        name: String,
        version: String,
        source: Option<String>,
        checksum: Option<String>,
    }
    let lock: Lock = toml::from_str(lock).map_err(|e| format!("Cargo.lock: {e}"))?;
    Ok(lock
        .package
        .into_iter()
        .filter(|p| p.source.as_deref().is_some_and(|s| s.contains("crates.io")))
        .map(|p| (p.name, p.version, p.checksum.unwrap_or_default()))
        .collect())
}

/// Why `srcrev` cannot be the pin of the layer in `repo` whose crates file is `inc`, if it
/// cannot: the history is not all there, it is no commit of it, it is not behind HEAD, or its
/// Cargo.lock lists other crates than `inc`.
fn pin_problem(repo: &Path, srcrev: &str, inc: &str) -> Result<(), String> {
    if git(repo, &["rev-parse", "--is-shallow-repository"])? == "true" {
        return Err(format!(
            "{} is a shallow clone: the pinned commit cannot be checked without the history \
             (git fetch --unshallow)",
            repo.display()
        ));
    }
    git(repo, &["cat-file", "-e", &format!("{srcrev}^{{commit}}")])
        .map_err(|e| format!("SRCREV {srcrev} is not a commit of this repository: {e}"))?;
    git(repo, &["merge-base", "--is-ancestor", srcrev, "HEAD"]).map_err(|e| {
        format!("SRCREV {srcrev} is not an ancestor of HEAD: pin a commit of this branch {e}")
    })?;
    let lock = git(repo, &["show", &format!("{srcrev}:Cargo.lock")])
        .map_err(|e| format!("SRCREV {srcrev} has no Cargo.lock: {e}"))?;
    let (want, have) = (crates_of_lock(&lock)?, crates_of_inc(inc)?);
    if want != have {
        let lock_only: Vec<_> = want.difference(&have).take(5).collect();
        let inc_only: Vec<_> = have.difference(&want).take(5).collect();
        return Err(format!(
            "edgellm-crates.inc does not list the crates of the Cargo.lock of SRCREV {srcrev} \
             (in that Cargo.lock only: {lock_only:?}; in the .inc only: {inc_only:?}): pin the \
             commit the .inc was generated from (yocto/scripts/bump-srcrev.sh)"
        ));
    }
    Ok(())
}

fn recipe() -> String {
    read(&recipe_dir().join("edgellm_0.1.0.bb"))
}

fn crates_inc() -> String {
    read(&recipe_dir().join("edgellm-crates.inc"))
}

#[test]
fn the_recipe_pins_a_literal_commit_and_a_literal_version() {
    let r = recipe();
    srcrev_of(&r).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        assignments(&r, "PV"),
        ["PV = \"0.1.0+git\""],
        "PV is set once, literally"
    );
}

/// The recorded sha256 of SRCREV's Cargo.lock.
fn lock_sha_of(recipe: &str) -> Result<String, String> {
    let prefix = "# Cargo.lock of SRCREV: sha256 ";
    let lines: Vec<&str> = recipe
        .lines()
        .filter_map(|l| l.strip_prefix(prefix))
        .collect();
    match lines[..] {
        [sha] if sha.len() == 64 && sha.bytes().all(|b| b.is_ascii_hexdigit()) => Ok(sha.into()),
        _ => Err(format!(
            "want one '{prefix}<64 hex digits>' line, found {lines:?}"
        )),
    }
}

/// Whether `repo` has its whole history (a git repository, not a shallow clone).
fn has_history(repo: &Path) -> bool {
    git(repo, &["rev-parse", "--is-shallow-repository"]).is_ok_and(|s| s == "false")
}

#[test]
fn the_pinned_commit_is_in_the_history_and_its_cargo_lock_is_what_the_crates_file_fetches() {
    let r = recipe();
    let srcrev = srcrev_of(&r).unwrap_or_else(|e| panic!("{e}"));
    let recorded = lock_sha_of(&r).unwrap_or_else(|e| panic!("{e}"));
    if has_history(&repo()) {
        pin_problem(&repo(), &srcrev, &crates_inc()).unwrap_or_else(|e| panic!("{e}"));
        let lock = git(&repo(), &["show", &format!("{srcrev}:Cargo.lock")]).unwrap();
        // `git show` gives the file without its last newline.
        assert_eq!(
            sha256_hex(format!("{lock}\n").as_bytes()),
            recorded,
            "the recipe's Cargo.lock sha256 is not SRCREV's (yocto/scripts/bump-srcrev.sh records it)"
        );
    } else {
        eprintln!("no history here: the pin is checked through its recorded Cargo.lock sha256");
    }
    let lock = std::fs::read(repo().join("Cargo.lock")).unwrap();
    assert_eq!(
        sha256_hex(&lock),
        recorded,
        "Cargo.lock is not SRCREV's: regenerate edgellm-crates.inc, commit, and pin that commit \
         (yocto/scripts/bump-srcrev.sh)"
    );
}

#[test]
fn the_crates_file_and_cargo_lock_are_read_alike() {
    // The reading itself: the working tree's lock file (which update-crates.py --check, in
    // tests/yocto_crates.rs, holds to the .inc) gives the same set as the .inc.
    let lock = read(&repo().join("Cargo.lock"));
    let (lock, inc) = (
        crates_of_lock(&lock).unwrap(),
        crates_of_inc(&crates_inc()).unwrap(),
    );
    assert!(lock.len() > 100, "{} crates", lock.len());
    assert_eq!(lock, inc);
}

/// A scratch repository with two commits on two branches, each with its own Cargo.lock.
fn scratch_repo() -> (tempfile::TempDir, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let run = |args: &[&str]| git(d, args).unwrap_or_else(|e| panic!("git {args:?}: {e}"));
    run(&["init", "-q", "-b", "main"]);
    run(&["config", "user.email", "ci@localhost"]);
    run(&["config", "user.name", "ci"]);
    let lock = read(&repo().join("Cargo.lock"));
    std::fs::write(d.join("Cargo.lock"), &lock).unwrap();
    run(&["add", "Cargo.lock"]);
    run(&["commit", "-q", "-m", "the lock"]);
    let same = run(&["rev-parse", "HEAD"]);
    // A branch whose lock file has one crate more: not behind main, and not what the .inc lists.
    run(&["checkout", "-q", "-b", "other"]);
    let more = format!(
        "{lock}\n[[package]]\nname = \"zz-extra\"\nversion = \"1.0.0\"\n\
         source = \"registry+https://github.com/rust-lang/crates.io-index\"\n\
         checksum = \"{}\"\n",
        "0".repeat(64)
    );
    std::fs::write(d.join("Cargo.lock"), more).unwrap();
    run(&["commit", "-q", "-am", "one crate more"]);
    let other = run(&["rev-parse", "HEAD"]);
    run(&["checkout", "-q", "main"]);
    (dir, same, other)
}

#[test]
fn a_bogus_foreign_or_mismatched_srcrev_is_refused() {
    let inc = crates_inc();
    for bad in [
        "SRCREV = \"${@bb.process.run('git rev-parse HEAD')[0].strip()}\"",
        "SRCREV = \"ea42aac\"",
        "SRCREV = \"EA42AACB07CF28F71D0548519FF90DDE2FB89CF3\"",
        "SRCREV ?= \"ea42aacb07cf28f71d0548519ff90dde2fb89cf3\"",
    ] {
        assert!(srcrev_of(bad).is_err(), "{bad}");
    }
    let (dir, same, other) = scratch_repo();
    pin_problem(dir.path(), &same, &inc).expect("a commit behind HEAD with the same lock");
    let e = pin_problem(dir.path(), &"0".repeat(40), &inc).unwrap_err();
    assert!(e.contains("not a commit"), "{e}");
    let e = pin_problem(dir.path(), &other, &inc).unwrap_err();
    assert!(e.contains("not an ancestor"), "{e}");
    git(dir.path(), &["merge", "-q", "--ff-only", "other"]).unwrap();
    let e = pin_problem(dir.path(), &other, &inc).unwrap_err();
    assert!(e.contains("zz-extra"), "{e}");
}

#[test]
fn a_shallow_clone_fails_the_check_instead_of_passing_it() {
    let (dir, same, _) = scratch_repo();
    let shallow = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().display());
    let clone = Command::new("git")
        .args(["clone", "-q", "--depth", "1", "-b", "main", &url])
        .arg(shallow.path().join("c"))
        .output()
        .unwrap();
    assert!(
        clone.status.success(),
        "{}",
        String::from_utf8_lossy(&clone.stderr)
    );
    let e = pin_problem(&shallow.path().join("c"), &same, &crates_inc()).unwrap_err();
    assert!(e.contains("shallow"), "{e}");
}

/// `KEY = "value"` lines of a kas file's `local_conf_header`, in order.
fn conf_lines(kas: &str) -> Vec<(String, String)> {
    kas.lines()
        .filter_map(|l| {
            let (k, v) = l.trim().split_once(" = ")?;
            let v = v.strip_prefix('"')?.strip_suffix('"')?;
            Some((k.to_owned(), v.to_owned()))
        })
        .collect()
}

/// The Raspberry Pi image gives the PLC its UART: the PL011 on GPIO 14/15, with neither the
/// kernel console nor a login prompt on it (meta-raspberrypi puts `console=serial0,115200`
/// on the kernel command line when `ENABLE_UART` is 1, unless `CMDLINE_SERIAL` says
/// otherwise; the machine's `SERIAL_CONSOLES` starts a getty).
#[test]
fn the_pi_image_leaves_the_plcs_uart_to_the_daemon() {
    let kas = read(&repo().join("yocto/kas/edgellm-rpi4.yml"));
    let conf = conf_lines(&kas);
    let value = |k: &str| {
        let v: Vec<&str> = conf
            .iter()
            .filter(|(key, _)| key == k)
            .map(|(_, v)| v.as_str())
            .collect();
        assert_eq!(v.len(), 1, "{k} set once in the Pi's kas file: {conf:?}");
        v[0].to_owned()
    };
    assert_eq!(value("ENABLE_UART"), "1");
    assert_eq!(value("RPI_EXTRA_CONFIG"), "dtoverlay=disable-bt");
    assert_eq!(
        value("CMDLINE_SERIAL"),
        "",
        "the kernel console would be on serial0"
    );
    assert_eq!(
        value("SERIAL_CONSOLES"),
        "",
        "a getty would read the PLC's line"
    );
    // The layer's README tells how to reach the board instead.
    let readme = read(&repo().join("yocto/meta-edgellm/README.md"));
    for step in ["EXTRA_USERS_PARAMS", "ssh-server-dropbear", "/proc/cmdline"] {
        assert!(readme.contains(step), "the README lacks {step}");
    }
}
