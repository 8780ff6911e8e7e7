//! `run --session-file` on the real SmolLM2 model: a restored chat session computes only the
//! new tokens and answers exactly as a run from scratch.

mod common;

use serde_json::Value;
use std::process::Command;

fn run(m: &str, prompt: &str, n: &str, session: Option<&str>) -> Value {
    let mut args = vec![
        "run", "-m", m, "--chat", "--prompt", prompt, "-n", n, "--json", "-c", "256",
    ];
    if let Some(s) = session {
        args.extend(["--session-file", s]);
    }
    let out = Command::new(env!("CARGO_BIN_EXE_edgellm"))
        .args(&args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
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
    assert_eq!(
        restored["timings"]["prompt_tokens"].as_u64().unwrap() + reused,
        fresh["timings"]["prompt_tokens"].as_u64().unwrap()
    );
}
