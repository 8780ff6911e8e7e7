//! The fuzz targets' inputs replayed on stable: every file of
//! `tests/fuzz/corpus/<target>/` (the seeds) and `tests/fuzz/regressions/<target>/` (each crash,
//! hang or huge allocation a fuzz run found, kept after its fix) goes through the same harness
//! the libFuzzer targets call, so `cargo test` keeps them fixed without nightly.

#[path = "fuzz/harness.rs"]
mod harness;
#[path = "fuzz/make_corpus.rs"]
mod make_corpus;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz")
}

/// The files of `dir`, sorted; none when it does not exist.
fn inputs(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .map(|e| e.expect("readable directory entry").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

/// Replays `files` through target `name`; returns the inputs that panic (their messages are
/// above) or take longer than libFuzzer's `-timeout=10`.
fn replay(name: &str, files: &[PathBuf]) -> Vec<String> {
    let mut failed = Vec::new();
    for f in files {
        let data = std::fs::read(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        let start = Instant::now();
        if std::panic::catch_unwind(|| harness::run(name, &data)).is_err() {
            failed.push(format!("{name}: {} fails (above)", f.display()));
        } else if start.elapsed() > Duration::from_secs(10) {
            failed.push(format!(
                "{name}: {} took {:?}",
                f.display(),
                start.elapsed()
            ));
        }
    }
    failed
}

#[test]
fn every_corpus_and_regression_input_passes_its_target() {
    let dir = fuzz_dir();
    let (mut summary, mut failed) = (Vec::new(), Vec::new());
    for name in harness::TARGETS {
        let corpus = inputs(&dir.join("corpus").join(name));
        let regressions = inputs(&dir.join("regressions").join(name));
        // An empty or missing corpus would make this test pass on nothing.
        assert!(
            !corpus.is_empty(),
            "tests/fuzz/corpus/{name}/ is missing or empty"
        );
        failed.extend(replay(name, &corpus));
        failed.extend(replay(name, &regressions));
        summary.push(format!(
            "{name}: {} corpus + {} regression inputs",
            corpus.len(),
            regressions.len()
        ));
    }
    // Straight to stderr, past libtest's capture: the count shows in every run's log.
    let mut err = std::io::stderr();
    for line in &summary {
        writeln!(err, "fuzz_regressions: replayed {line}").expect("stderr");
    }
    assert!(
        failed.is_empty(),
        "{} inputs fail:\n{}",
        failed.len(),
        failed.join("\n")
    );
}

#[test]
fn every_target_has_a_fuzz_target_file() {
    for name in harness::TARGETS {
        let f = fuzz_dir().join("fuzz_targets").join(format!("{name}.rs"));
        let src = std::fs::read_to_string(&f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        assert!(
            src.contains(&format!("harness::{name}(data)")),
            "{}",
            f.display()
        );
    }
}

#[test]
fn the_harness_renders_smollm2s_own_template() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/model.json");
    let model: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("model.json")).expect("JSON");
    assert_eq!(
        model["metadata"]["chat_template"].as_str(),
        Some(harness::SMOLLM2_TEMPLATE)
    );
}

/// The committed seeds are what `make_corpus` makes (`EDGELLM_WRITE_CORPUS=1` rewrites them),
/// and small: a corpus is a starting point, not a data set.
#[test]
fn the_corpus_holds_the_generated_seeds() {
    let write = std::env::var_os("EDGELLM_WRITE_CORPUS").is_some_and(|v| v == "1");
    let mut total = 0;
    for (target, name, bytes) in make_corpus::seeds() {
        assert!(harness::TARGETS.contains(&target), "{target}");
        assert!(
            bytes.len() <= 64 * 1024,
            "{target}/{name}: {} bytes",
            bytes.len()
        );
        total += bytes.len();
        let path = fuzz_dir().join("corpus").join(target).join(name);
        if write {
            std::fs::create_dir_all(path.parent().expect("a directory")).expect("mkdir");
            std::fs::write(&path, &bytes).expect("write seed");
        }
        let committed = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(
            committed == bytes,
            "{} differs from make_corpus's (EDGELLM_WRITE_CORPUS=1)",
            path.display()
        );
    }
    assert!(total <= 1 << 20, "the seeds take {total} bytes");
}
