//! Power loss during saves, approximated by SIGKILL: `edgellm run --session-file` (and
//! `--state-dir`, whose named sessions use the same files) is killed at
//! random points of many runs (appending turns, and rewriting when a new conversation starts),
//! and, as a power cut also loses unsynced writes, part of a fresh append is cut off or zeroed;
//! after every kill the snapshot is either valid and holds a prefix of the conversation, or is
//! refused; and the next run restores or recomputes, never crashes, and answers exactly as a
//! run without a session file.

mod common;

use edgellm::kv::file;
use edgellm::model::synth::SynthSpec;
use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const TRIALS: usize = 120;

/// A synthetic model with a big enough cache that a save takes a while, and whose vocabulary
/// holds the printable ASCII characters (ids 3..97).
fn model(dir: &Path) -> String {
    let spec = SynthSpec {
        n_layer: 4,
        n_embd: 256,
        n_head: 4,
        n_head_kv: 4,
        n_ff: 256,
        ..Default::default()
    };
    let p = dir.join("synth.gguf");
    std::fs::write(&p, common::ascii_synth_model_bytes(&spec)).unwrap();
    p.to_str().unwrap().to_string()
}

/// Where a run keeps its session.
#[derive(Clone, Copy)]
enum Keep<'a> {
    File(&'a Path),
    StateDir(&'a Path),
}

impl Keep<'_> {
    /// The snapshot file the run writes.
    fn file(self) -> std::path::PathBuf {
        match self {
            Keep::File(f) => f.to_path_buf(),
            Keep::StateDir(d) => d.join("sessions/default.kv"),
        }
    }
}

fn cmd(m: &str, prompt: &str, session: Option<Keep<'_>>) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_edgellm"));
    c.args([
        "run",
        "-m",
        m,
        "--prompt",
        prompt,
        "-n",
        "1",
        "--json",
        "-c",
        "256",
        "-t",
        "1",
        "--kv-type",
        "f32",
    ]);
    match session {
        Some(Keep::File(f)) => c.arg("--session-file").arg(f),
        Some(Keep::StateDir(d)) => c.arg("--state-dir").arg(d),
        None => &mut c,
    };
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    c
}

fn generated(out: &std::process::Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "edgellm failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["generated_ids"].clone()
}

/// The `k`-th prompt: conversations of growing prefixes of a per-conversation text.
fn prompt(k: usize) -> String {
    let conv = k / 24;
    let len = 8 + 8 * (k % 24);
    (0..len)
        .map(|i| char::from(b'!' + ((i * 7 + conv * 13 + i / 5) % 94) as u8))
        .collect()
}

#[test]
fn sigkill_during_saves_never_corrupts_or_changes_answers() {
    let dir = tempfile::tempdir().unwrap();
    power_loss(dir.path(), Keep::File(&dir.path().join("s.kv")), TRIALS);
}

#[test]
fn sigkill_during_saves_of_a_named_session_never_corrupts_or_changes_answers() {
    let dir = tempfile::tempdir().unwrap();
    power_loss(dir.path(), Keep::StateDir(&dir.path().join("state")), 100);
}

fn power_loss(dir: &Path, keep: Keep<'_>, trials: usize) {
    let m = model(dir);
    let f = keep.file();
    let mut fresh: HashMap<String, serde_json::Value> = HashMap::new();
    let mut expect = |p: &str| {
        fresh
            .entry(p.to_string())
            .or_insert_with(|| generated(&cmd(&m, p, None).output().unwrap()))
            .clone()
    };
    // The time of a whole run, so that kills land anywhere in it, the save included.
    let t0 = Instant::now();
    generated(&cmd(&m, &prompt(0), Some(keep)).output().unwrap());
    let span = t0.elapsed().as_micros() as u64 * 3 / 2;

    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let (mut killed, mut refused, mut torn, mut damaged) = (0, 0, 0, 0);
    let start = Instant::now();
    for trial in 0..trials {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let k = 2 * trial + 1;
        let before = std::fs::read(&f).unwrap_or_default();
        let mut child = cmd(&m, &prompt(k), Some(keep)).spawn().unwrap();
        std::thread::sleep(Duration::from_micros(x % span));
        if child.try_wait().unwrap().is_none() {
            killed += 1;
        }
        let _ = child.kill(); // SIGKILL
        let _ = child.wait();
        // A power cut also loses what was appended but not yet synced: in two trials of three
        // where the run appended, keep only part of the new record, or zero part of it (pages
        // that never reached the flash).
        let mut after = std::fs::read(&f).unwrap_or_default();
        let appended = |a: &[u8]| a.len() > before.len() && a.starts_with(&before);
        if trial % 3 != 0 && !appended(&after) {
            // Killed before its save: how often depends on this machine's speed. Let the
            // turn save, so that every third of the trials damages an append whatever the
            // timing (a loaded CI machine once got only 9 of 120).
            generated(&cmd(&m, &prompt(k), Some(keep)).output().unwrap());
            after = std::fs::read(&f).unwrap_or_default();
        }
        if appended(&after) && trial % 3 != 0 {
            let grown = (after.len() - before.len()) as u64;
            let cut = before.len() + (x >> 20) as usize % grown as usize;
            let mut b = after.clone();
            if trial % 3 == 1 {
                b.truncate(cut);
            } else {
                let end = (cut + 4096).min(b.len());
                b[cut..end].fill(0);
            }
            std::fs::write(&f, &b).unwrap();
            damaged += 1;
        }

        // The file is a valid snapshot of a prefix of this conversation's text, or refused.
        match file::read(&f) {
            Ok((_, p)) => {
                torn += p.torn.is_some() as usize;
                let text = prompt(k);
                let conv: Vec<u32> = text.bytes().map(|b| (b - b'!') as u32 + 3).collect();
                let prev: Vec<u32> = prompt(k - 1)
                    .bytes()
                    .map(|b| (b - b'!') as u32 + 3)
                    .collect();
                assert!(
                    conv.starts_with(&p.tokens) || prev.starts_with(&p.tokens),
                    "trial {trial}: the snapshot holds tokens of neither conversation"
                );
            }
            Err(e) => {
                refused += 1;
                assert!(!e.to_string().is_empty());
            }
        }
        // The next start restores or recomputes, and answers as without a session.
        let next = prompt(k + 1);
        let out = cmd(&m, &next, Some(keep)).output().unwrap();
        assert_eq!(
            generated(&out),
            expect(&next),
            "trial {trial}: answer differs"
        );
    }
    eprintln!(
        "{trials} trials in {:.1} s: {killed} killed mid-run, {damaged} appends cut or zeroed, \
         {torn} torn tails, {refused} refused",
        start.elapsed().as_secs_f64()
    );
    assert!(
        killed >= trials / 10,
        "only {killed} runs were killed before the end"
    );
    assert!(torn >= 10, "only {torn} torn tails were exercised");
}
