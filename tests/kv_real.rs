//! `run --session-file` on the real SmolLM2 model: a restored chat session computes only the
//! new tokens and answers exactly as a run from scratch.

mod common;

use serde_json::Value;
use std::process::Command;

fn run(m: &str, prompt: &str, n: &str, session: Option<&str>) -> Value {
    let mut extra = vec![];
    if let Some(s) = session {
        extra = vec!["--session-file", s];
    }
    run_with(m, prompt, n, &extra)
}

/// `edgellm run --chat … --json -c 256 EXTRA…`, which must succeed; its JSON.
fn run_with(m: &str, prompt: &str, n: &str, extra: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_edgellm"))
        .args([
            "run", "-m", m, "--chat", "--prompt", prompt, "-n", n, "--json", "-c", "256",
        ])
        .args(extra)
        .output()
        .unwrap();
    common::json_of(&out)
}

#[test]
fn a_restored_chat_session_answers_as_a_fresh_run() {
    let model = common::model_path("q4_0");
    let m = model.to_str().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("chat.kv");
    let f = f.to_str().unwrap();
    let first = run(m, "What is the boiling point of water?", "1", Some(f));
    assert_eq!(first["session"]["saved"], true, "{first}");
    let n_saved = first["session"]["tokens"].as_u64().unwrap();
    assert!(n_saved > 20);

    let q = "What is the boiling point of water? Answer in one sentence.";
    let restored = run(m, q, "12", Some(f));
    let fresh = run(m, q, "12", None);
    assert_eq!(restored["generated_ids"], fresh["generated_ids"]);
    assert_eq!(restored["prompt_ids"], fresh["prompt_ids"]);
    let reused = restored["timings"]["restored_tokens"].as_u64().unwrap();
    assert!(
        reused > 20 && reused <= n_saved,
        "restored {reused} of {n_saved}"
    );
    // The whole prompt either way, restored in part or not.
    assert_eq!(
        restored["timings"]["prompt_tokens"],
        fresh["timings"]["prompt_tokens"]
    );
}

fn run_state(m: &str, prompt: &str, dir: &str, session: &str) -> Value {
    run_with(m, prompt, "8", &["--state-dir", dir, "--session", session])
}

/// `run --state-dir`: the template's system prompt is computed by the first run only and
/// restored from flash by every later one, for any session; a session's next turn continues
/// its conversation from its file; first answers are those of runs without any state.
#[test]
fn a_state_directory_caches_the_system_prompt_and_continues_named_sessions() {
    let model = common::model_path("q4_0");
    let m = model.to_str().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let (q1, q2) = ("Name a primary color.", "Name a planet.");

    let first = run_state(m, q1, d, "plc-1");
    assert_eq!(
        first["generated_ids"],
        run(m, q1, "8", None)["generated_ids"]
    );
    let s = &first["session"];
    assert_eq!(s["source"]["from"], "new", "{s}");
    assert_eq!(s["system_prompt"]["source"]["from"], "new", "{s}");
    let sys = s["system_prompt"]["tokens"].as_u64().unwrap();
    assert!(sys > 10, "{s}");
    assert_eq!(s["prefix_tokens"].as_u64(), Some(sys));
    assert_eq!(s["saved"], true);

    // Another session: the system prompt comes from its file.
    let second = run_state(m, q2, d, "plc-2");
    let s = &second["session"];
    assert_eq!(s["system_prompt"]["source"]["from"], "file", "{s}");
    assert_eq!(s["prefix_tokens"].as_u64(), Some(sys));
    assert_eq!(second["timings"]["restored_tokens"].as_u64(), Some(sys));
    assert_eq!(
        second["generated_ids"],
        run(m, q2, "8", None)["generated_ids"]
    );
    assert!(dir.path().join("sessions/plc-1.kv").is_file());
    assert!(dir.path().join("sessions/plc-2.kv").is_file());

    // plc-1 again: the next turn of its conversation (the first question and answer, then
    // this one), whose first turn its own file holds, past the system prompt.
    let again = run_state(m, q1, d, "plc-1");
    assert_eq!(again["session"]["source"]["from"], "file", "{again}");
    assert_eq!(again["session"]["prefix_tokens"], 0);
    assert_eq!(again["session"]["turn"], 2, "{again}");
    let turn1 = first["timings"]["prompt_tokens"].as_u64().unwrap();
    assert!(again["timings"]["restored_tokens"].as_u64().unwrap() >= turn1);
    assert!(again["timings"]["prompt_tokens"].as_u64().unwrap() > turn1 + 2);

    // Names that are not plain file names are refused before anything is loaded.
    let out = Command::new(env!("CARGO_BIN_EXE_edgellm"))
        .args([
            "run",
            "-m",
            m,
            "--prompt",
            "x",
            "--state-dir",
            d,
            "--session",
            "../x",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("session name has '.' at position 0"));
}
