//! `edgellm run --session-file` and `edgellm kv inspect|verify` on a tiny synthetic model.

mod common;

use common::json_of;
use edgellm::model::synth::SynthSpec;
use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output};

fn edgellm(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_edgellm"))
        .args(args)
        .output()
        .expect("spawn edgellm")
}

fn model(dir: &Path) -> String {
    let p = dir.join("synth.gguf");
    std::fs::write(&p, common::ascii_synth_model_bytes(&SynthSpec::default())).unwrap();
    p.to_str().unwrap().to_string()
}

fn run_json(m: &str, prompt: &str, n: usize, session: Option<&Path>) -> Value {
    json_of(&run(m, prompt, n, session))
}

fn run(m: &str, prompt: &str, n: usize, session: Option<&Path>) -> Output {
    let n = n.to_string();
    let mut args = vec![
        "run", "-m", m, "--prompt", prompt, "-n", &n, "--json", "-c", "64", "-t", "1", "--temp",
        "0.9", "--seed", "3",
    ];
    let s;
    if let Some(p) = session {
        s = p.to_str().unwrap().to_string();
        args.extend(["--session-file", &s]);
    }
    edgellm(&args)
}

fn kv(args: &[&str]) -> (bool, String) {
    let mut a = vec!["kv"];
    a.extend(args);
    let out = edgellm(&a);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

const P1: &str = "abcdefgh";
const P2: &str = "abcdefghijkl";

#[test]
fn a_restored_session_computes_only_the_rest_and_answers_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let m = model(dir.path());
    let f = dir.path().join("s.kv");
    let fresh = run_json(&m, P2, 4, None);

    let a = run_json(&m, P1, 1, Some(&f));
    assert_eq!(a["timings"]["restored_tokens"], 0);
    assert_eq!(a["session"]["saved"], true, "{a}");
    assert_eq!(a["session"]["write"], "rewritten");
    assert_eq!(a["session"]["tokens"], 8);

    let b = run_json(&m, P2, 4, Some(&f));
    assert_eq!(
        b["generated_ids"], fresh["generated_ids"],
        "restored != fresh"
    );
    assert_eq!(b["timings"]["restored_tokens"], 8);
    // The whole prompt, 8 of its tokens restored, 4 computed.
    assert_eq!(b["timings"]["prompt_tokens"], 12);
    assert!(b["timings"]["prompt_ms"].is_number());
    assert_eq!(b["session"]["write"], "appended", "{b}");
    assert_eq!(b["session"]["positions_written"], 7);

    let fs = f.to_str().unwrap();
    let (ok, text) = kv(&["verify", fs, "-m", &m, "--ctx", "64"]);
    assert!(ok && text.contains("ok (15 tokens in 2 records)"), "{text}");
    let (ok, text) = kv(&["inspect", fs, "-m", &m]);
    assert!(
        ok && text.contains("records:      2") && text.contains("model:        matches"),
        "{text}"
    );
    let (ok, text) = kv(&["verify", fs, "-m", &m, "--ctx", "128"]);
    assert!(
        !ok && text.contains("context (n_ctx) is 64 but this engine has 128"),
        "{text}"
    );

    // A prompt that diverges from the saved tokens: the common prefix is reused and the file
    // is rewritten (compacted) to the new conversation.
    let c = run_json(&m, "abcdXYZ", 3, Some(&f));
    assert_eq!(
        c["generated_ids"],
        run_json(&m, "abcdXYZ", 3, None)["generated_ids"]
    );
    assert_eq!(c["timings"]["restored_tokens"], 4);
    assert_eq!(c["session"]["write"], "rewritten");
    let (ok, text) = kv(&["verify", fs]);
    assert!(ok && text.contains("ok (9 tokens in 1 records)"), "{text}");
}

fn moved_aside(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .contains(".corrupt-")
        })
        .count()
}

#[test]
fn a_bad_or_foreign_file_is_reported_moved_aside_and_recomputed() {
    let dir = tempfile::tempdir().unwrap();
    let m = model(dir.path());
    let f = dir.path().join("s.kv");
    let fs = f.to_str().unwrap();
    let fresh = run_json(&m, P2, 4, None);
    run_json(&m, P1, 1, Some(&f));

    // A flipped bit in the middle of the file, in the K/V rows of its only record: a rewrite
    // wrote that record whole, so no power cut explains it. Corruption, not a torn tail:
    // refused, moved aside, recomputed.
    let good = std::fs::read(&f).unwrap();
    let mut bad = good.clone();
    bad[good.len() / 2] ^= 0x10;
    std::fs::write(&f, &bad).unwrap();
    let (ok, text) = kv(&["verify", fs]);
    assert!(
        !ok && text.contains("record K/V rows") && text.contains("checksum"),
        "{text}"
    );
    assert!(!text.contains("incomplete last record"), "{text}");
    let out = run(&m, P2, 4, Some(&f));
    let v = json_of(&out);
    assert_eq!(v["generated_ids"], fresh["generated_ids"]);
    assert_eq!(v["timings"]["restored_tokens"], 0);
    let load = &v["session"]["load"];
    assert!(
        load["error"].as_str().unwrap().contains("record K/V rows") && load["torn_tail"].is_null(),
        "{v}"
    );
    assert_eq!(moved_aside(dir.path()), 1);
    assert!(kv(&["verify", fs]).0, "the next save wrote a good file");

    // A torn append: the second turn's record cut short by a power cut. An incomplete last
    // record, dropped: the first turn is restored.
    let t = dir.path().join("t.kv");
    let ts = t.to_str().unwrap();
    run_json(&m, P1, 1, Some(&t));
    let b = run_json(&m, P2, 4, Some(&t));
    assert_eq!(b["session"]["write"], "appended", "{b}");
    let two = std::fs::read(&t).unwrap();
    std::fs::write(&t, &two[..two.len() - 5]).unwrap();
    let (ok, text) = kv(&["verify", ts]);
    assert!(!ok && text.contains("incomplete last record"), "{text}");
    assert!(
        text.contains("a load recovers the first 8 tokens"),
        "{text}"
    );
    let v = run_json(&m, P2, 4, Some(&t));
    assert_eq!(v["generated_ids"], fresh["generated_ids"]);
    assert_eq!(v["timings"]["restored_tokens"], 8, "{v}");
    assert!(
        v["session"]["load"]["torn_tail"]
            .as_str()
            .unwrap()
            .contains("incomplete last record"),
        "{v}"
    );
    assert!(kv(&["verify", ts]).0, "the next save cut the torn tail off");
    assert_eq!(moved_aside(dir.path()), 1, "a torn tail is not moved aside");

    // Garbage: refused, moved aside, recomputed, and a good file saved in its place.
    std::fs::write(&f, b"not a snapshot at all, no no").unwrap();
    let out = run(&m, P2, 4, Some(&f));
    let v = json_of(&out);
    assert_eq!(v["generated_ids"], fresh["generated_ids"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("bad magic") && err.contains("moved aside"),
        "{err}"
    );
    assert!(
        v["session"]["load"]["error"]
            .as_str()
            .unwrap()
            .contains("bad magic")
    );
    assert!(
        v["session"]["load"]["moved_to"]
            .as_str()
            .unwrap()
            .contains(".corrupt-")
    );
    assert_eq!(v["session"]["saved"], true);
    assert_eq!(moved_aside(dir.path()), 2);
    assert!(kv(&["verify", fs]).0);

    // Another model (other weights, same metadata).
    let other = dir.path().join("other.gguf");
    std::fs::write(
        &other,
        common::ascii_synth_model_bytes(&SynthSpec {
            seed: 9,
            ..Default::default()
        }),
    )
    .unwrap();
    let o = other.to_str().unwrap();
    let (ok, text) = kv(&["verify", fs, "-m", o]);
    assert!(!ok && text.contains("another model"), "{text}");
    let out = run(o, P2, 4, Some(&f));
    let v = json_of(&out);
    assert_eq!(v["timings"]["restored_tokens"], 0);
    assert!(String::from_utf8_lossy(&out.stderr).contains("another model or quantization"));
    assert_eq!(moved_aside(dir.path()), 3);
}

/// Disk full (simulated by RLIMIT_FSIZE, so that it runs unprivileged: writes past the limit
/// fail with EFBIG part-way, as with ENOSPC) and a read-only state directory: the answer is
/// given, the failure is logged and reported, exit status 0, the saved file undamaged.
#[test]
fn disk_full_or_read_only_state_still_answers_and_damages_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let m = model(dir.path());
    let f = dir.path().join("s.kv");
    let fs = f.to_str().unwrap();
    let fresh = run_json(&m, P2, 4, None);
    run_json(&m, P1, 1, Some(&f));
    let saved = std::fs::read(&f).unwrap();
    assert!(saved.len() < 5 * 512);

    // 5 blocks of 512 bytes: the append of 7 positions (~1.9 KB) fails part-way.
    let script = format!(
        "trap '' XFSZ; ulimit -f 5; exec '{}' run -m '{m}' --prompt {P2} -n 4 --json -c 64 -t 1 --temp 0.9 --seed 3 --session-file '{fs}'",
        env!("CARGO_BIN_EXE_edgellm")
    );
    let out = Command::new("sh").args(["-c", &script]).output().unwrap();
    let v = json_of(&out);
    assert_eq!(v["generated_ids"], fresh["generated_ids"]);
    assert_eq!(v["session"]["saved"], false, "{v}");
    let err = v["session"]["error"].as_str().unwrap();
    assert!(
        err.contains("too large") || err.contains("No space"),
        "{err}"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("session not saved"));
    assert_eq!(std::fs::read(&f).unwrap(), saved, "the saved file changed");

    // A state directory we cannot write to: not writable for an unprivileged user, and /sys
    // (no file may be created there) for root, who ignores permission bits.
    let ro = dir.path().join("ro");
    std::fs::create_dir(&ro).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o555)).unwrap();
    let root = std::fs::write(ro.join("probe"), b"").is_ok();
    let target = if root {
        Path::new("/sys/edgellm-kv-test.kv").to_path_buf()
    } else {
        ro.join("s.kv")
    };
    // A session file that cannot be read (here: a directory) is reported, left alone and not
    // saved to.
    let unreadable = dir.path().join("adir");
    std::fs::create_dir(&unreadable).unwrap();
    let v = run_json(&m, P2, 4, Some(&unreadable));
    assert_eq!(v["generated_ids"], fresh["generated_ids"]);
    assert_eq!(v["session"]["saved"], false, "{v}");
    assert!(
        v["session"]["load"]["error"]
            .as_str()
            .unwrap()
            .contains("adir"),
        "{v}"
    );
    assert!(unreadable.is_dir() && moved_aside(dir.path()) == 0);

    let v = run_json(&m, P2, 4, Some(&target));
    assert_eq!(v["generated_ids"], fresh["generated_ids"]);
    assert_eq!(v["session"]["saved"], false, "{v}");
    assert!(!target.exists());
}

/// `run --state-dir` on a full disk (RLIMIT_FSIZE, as above): the answer is given, the failed
/// save is reported with the store's counters, and the session's saved file is intact.
#[test]
fn a_full_disk_under_a_state_directory_still_answers_and_reports_it() {
    let dir = tempfile::tempdir().unwrap();
    let m = model(dir.path());
    let state = dir.path().join("state");
    let st = state.to_str().unwrap();
    let fresh = run_json(&m, P2, 4, None);
    let cmd = |prompt: &str, limit: &str| {
        format!(
            "trap '' XFSZ; {limit} exec '{}' run -m '{m}' --prompt {prompt} -n 4 --json -c 64 -t 1 --temp 0.9 --seed 3 --state-dir '{st}' --session plc",
            env!("CARGO_BIN_EXE_edgellm")
        )
    };
    let sh = |script: String| Command::new("sh").args(["-c", &script]).output().unwrap();
    let v = json_of(&sh(cmd(P1, "")));
    assert_eq!(v["session"]["saved"], true, "{v}");
    let file = state.join("sessions/plc.kv");
    let saved = std::fs::read(&file).unwrap();

    let out = sh(cmd(P2, "ulimit -f 5;"));
    let v = json_of(&out);
    assert_eq!(v["generated_ids"], fresh["generated_ids"]);
    let s = &v["session"];
    assert_eq!(s["saved"], false, "{s}");
    assert_eq!(s["source"]["from"], "file", "{s}");
    assert_eq!(s["status"]["save_failures"], 1, "{s}");
    assert!(
        s["status"]["last_error"]
            .as_str()
            .unwrap()
            .contains("too large"),
        "{s}"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("session not saved"));
    assert_eq!(
        std::fs::read(&file).unwrap(),
        saved,
        "the saved file changed"
    );
}

/// Two processes must not write one session file: the second is refused while the first
/// holds `F.lock`, and runs once it is released.
#[test]
fn a_session_file_in_use_by_another_process_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let m = model(dir.path());
    let f = dir.path().join("s.kv");
    let held = edgellm::kv::file::try_lock(&dir.path().join("s.kv.lock"))
        .unwrap()
        .unwrap();
    let out = run(&m, P1, 2, Some(&f));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("in use by another edgellm process"), "{err}");
    assert!(!f.exists());
    drop(held);
    assert_eq!(run_json(&m, P1, 2, Some(&f))["session"]["saved"], true);
}

#[test]
fn verify_checks_every_file_given_and_fails_if_any_is_faulty() {
    let dir = tempfile::tempdir().unwrap();
    let m = model(dir.path());
    let (a, b, c) = (
        dir.path().join("a.kv"),
        dir.path().join("b.kv"),
        dir.path().join("c.kv"),
    );
    run_json(&m, P1, 1, Some(&a));
    run_json(&m, P2, 1, Some(&b));
    std::fs::copy(&a, &c).unwrap();
    let mut bad = std::fs::read(&c).unwrap();
    let mid = bad.len() / 2;
    bad[mid] ^= 0x10;
    std::fs::write(&c, &bad).unwrap();
    let (a, b, c) = (
        a.to_str().unwrap(),
        b.to_str().unwrap(),
        c.to_str().unwrap(),
    );

    let (ok, text) = kv(&["verify", a, b, "-m", &m, "--ctx", "64"]);
    assert!(ok, "{text}");
    assert!(text.contains(&format!("{a}: ok (")), "{text}");
    assert!(text.contains(&format!("{b}: ok (")), "{text}");

    // The faulty file in the middle: every file still gets its line, and the exit says so.
    let (ok, text) = kv(&["verify", a, c, b, "-m", &m, "--ctx", "64"]);
    assert!(!ok, "{text}");
    assert!(text.contains(&format!("{a}: ok (")), "{text}");
    assert!(
        text.contains(&format!("{c}: ")) && text.contains("checksum"),
        "{text}"
    );
    assert!(text.contains(&format!("{b}: ok (")), "{text}");
    assert!(text.contains("1 of 3 snapshot files are faulty"), "{text}");

    // A file that is not there is a fault of its own, not the end of the check.
    let gone = dir.path().join("gone.kv");
    let (ok, text) = kv(&["verify", gone.to_str().unwrap(), a]);
    assert!(!ok && text.contains(&format!("{a}: ok (")), "{text}");
    assert!(text.contains("1 of 2 snapshot files are faulty"), "{text}");
}

/// As llama.cpp's tools take it, a model typed on its own where a snapshot goes is told where
/// it belongs, and the model given with -m still checks the snapshot.
#[test]
fn a_model_given_as_the_snapshot_is_told_to_come_with_m() {
    let dir = tempfile::tempdir().unwrap();
    let m = model(dir.path());
    let f = dir.path().join("s.kv");
    run_json(&m, P1, 1, Some(&f));
    for cmd in ["inspect", "verify"] {
        let (ok, text) = kv(&[cmd, &m]);
        assert!(!ok, "{cmd}: {text}");
        assert!(
            text.contains(&format!(
                "{m} is a GGUF model, not a KV snapshot: give the model with -m"
            )),
            "{cmd}: {text}"
        );
    }
    let (ok, text) = kv(&["verify", f.to_str().unwrap(), "-m", &m]);
    assert!(ok, "{text}");
    let (_, help) = kv(&["--help"]);
    assert!(
        help.contains("the model, when one is checked, comes with -m"),
        "{help}"
    );
}
