//! The audit trail of the running daemon: every answer and refusal over a real pty recorded
//! (a session name the port refused included), chained and verified; an edited, a removed and
//! a cut entry found by `audit verify`; every answer replayed bit for bit on one and two
//! threads, a restored session turn, a sampled answer and a sampled one under a choice
//! constraint included; the chain continued across a restart; an entry without its texts
//! refused by `replay` with the reason.

mod common;

use common::mqtt::{Daemon, edgellm, model_arg};
use common::serial::{Pty, unescape};
use serde_json::Value;
use std::path::Path;
use std::time::Duration;

const T: Duration = Duration::from_secs(60);

/// The daemon serving `p` in line mode, MQTT off, with `state` and the configuration `toml`.
fn daemon(p: &Pty, state: &Path, toml: &str) -> Daemon {
    let cfg = state.with_extension("toml");
    std::fs::write(&cfg, toml).unwrap();
    let m = model_arg(&common::model_path("q4_0"));
    let spec = format!("{}:115200:line", p.path);
    let args = [
        "--config",
        cfg.to_str().unwrap(),
        "-m",
        &m,
        "--mqtt",
        "off",
        "-c",
        "256",
        "-t",
        "2",
        "--serial",
        &spec,
        "--state-dir",
        state.to_str().unwrap(),
    ];
    let d = Daemon::start(&args, &[("EDGELLM_LOG", "info")]);
    let log = d.wait_log(T, |l| l.contains("serial port open"));
    assert!(log.contains("serial port open"), "port not open: {log}");
    d
}

fn audit(args: &[&str], state: &Path) -> std::process::Output {
    let mut a = vec!["audit"];
    a.extend_from_slice(args);
    a.extend(["--state-dir", state.to_str().unwrap()]);
    edgellm(&a)
}

fn text(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn entries(state: &Path) -> Vec<Value> {
    let out = audit(&["list", "--json"], state);
    assert!(out.status.success(), "{}", text(&out));
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn show(state: &Path, seq: u64) -> Value {
    let out = audit(&["show", &seq.to_string()], state);
    assert!(out.status.success(), "{}", text(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The answer's text in an `OK …` reply.
fn ok_text(reply: &str) -> String {
    unescape(
        reply
            .strip_prefix("OK ")
            .unwrap_or_else(|| panic!("{reply}")),
    )
}

#[test]
fn every_answer_is_recorded_chained_verified_and_replays_bit_for_bit() {
    let mut p = Pty::open();
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let mut d = daemon(&p, &state, "[audit]\ntexts = true\n");

    assert_eq!(p.ask("SET max_tokens=12", T), "OK max_tokens=12");
    let greedy = ok_text(&p.ask("GEN The capital of France is", T));
    let turn1 = ok_text(&p.ask("CHAT session=pump-3 Hello, who are you?", T));
    let turn2 = ok_text(&p.ask("CHAT session=pump-3 And what can you do?", T));
    assert_eq!(p.ask("SET temperature=0.8", T), "OK temperature=0.8");
    assert_eq!(p.ask("SET seed=7", T), "OK seed=7");
    let sampled = ok_text(&p.ask("GEN Once upon a time", T));
    // A sampled answer under a constraint: the replay must constrain the same way.
    assert_eq!(
        p.ask("SET choice=pump|valve|motor|sensor", T),
        "OK choice=pump|valve|motor|sensor"
    );
    let chosen = ok_text(&p.ask("GEN Which part failed first?", T));
    assert!(
        ["pump", "valve", "motor", "sensor"].contains(&chosen.as_str()),
        "{chosen}"
    );
    // Over the context of 256: refused by the worker, and recorded as refused.
    let long = format!("GEN {}", "many words ".repeat(300));
    let refused = p.ask(&long, T);
    assert!(refused.starts_with("ERR context_full "), "{refused}");
    assert_eq!(d.terminate(T).code(), Some(0), "{}", d.log_text());

    let list = entries(&state);
    assert_eq!(list.len(), 6, "{list:?}");
    let source = format!("serial:{}", p.path);
    for (i, e) in list.iter().enumerate() {
        assert_eq!(e["seq"], i as u64 + 1);
        assert_eq!(e["source"], source.as_str());
    }
    let kinds: Vec<&str> = list.iter().map(|e| e["kind"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        ["answer", "answer", "answer", "answer", "answer", "refused"]
    );
    assert_eq!(list[5]["error"], "context_full");
    assert!(show(&state, 4)["format"].is_null());
    assert_eq!(
        show(&state, 5)["format"],
        serde_json::json!({"type": "choice", "options": ["pump", "valve", "motor", "sensor"]})
    );
    assert_eq!(list[2]["session"], "pump-3");
    // The conversation's turns, in order: the second turn answered the whole conversation.
    assert_eq!(
        (&list[1]["turn"], &list[2]["turn"]),
        (&1.into(), &2.into()),
        "{list:?}"
    );
    let restored = list[2]["usage"]["restored_tokens"].as_u64().unwrap();
    assert!(
        restored > 0,
        "the second turn restored nothing: {:?}",
        list[2]
    );

    // What was recorded is what was sent, and names the model by its file's hash.
    let model_sha = common::sha256_hex(&std::fs::read(common::model_path("q4_0")).unwrap());
    for (seq, sent) in [
        (1, &greedy),
        (2, &turn1),
        (3, &turn2),
        (4, &sampled),
        (5, &chosen),
    ] {
        let e = show(&state, seq);
        assert_eq!(e["answer"].as_str(), Some(sent.as_str()), "entry {seq}");
        assert_eq!(
            e["answer_sha256"].as_str(),
            Some(common::sha256_hex(sent.as_bytes()).as_str())
        );
        assert_eq!(e["model"]["sha256"], model_sha.as_str());
        assert_eq!(e["engine"]["ctx"], 256);
    }
    assert_eq!(show(&state, 4)["sampling"]["seed"], 7);
    let prompt = show(&state, 1)["prompt_sha256"].clone();
    let want = common::sha256_hex(br#"{"prompt":"The capital of France is"}"#);
    assert_eq!(
        prompt,
        want.as_str(),
        "a client cannot recompute the prompt hash"
    );

    let v = audit(&["verify"], &state);
    assert!(v.status.success(), "{}", text(&v));
    assert!(text(&v).contains("entries 1 to 6 verify"), "{}", text(&v));

    // Replays: each answer again from an empty cache, on 1 and 2 threads.
    let m = model_arg(&common::model_path("q4_0"));
    for seq in ["1", "2", "3", "4", "5"] {
        for threads in ["1", "2"] {
            let out = audit(&["replay", seq, "-m", &m, "-t", threads, "--json"], &state);
            assert!(
                out.status.success(),
                "replay {seq} on {threads}: {}",
                text(&out)
            );
            let r: Value = serde_json::from_slice(&out.stdout).unwrap();
            assert_eq!(r["matches"], true, "{r}");
        }
    }
    let out = audit(&["replay", "6", "-m", &m], &state);
    assert!(!out.status.success());
    assert!(text(&out).contains("refused request"), "{}", text(&out));
    // Another model file is refused by its hash.
    let other = model_arg(&common::model_path("q4_1"));
    let out = audit(&["replay", "1", "-m", &other], &state);
    assert!(!out.status.success());
    assert!(
        text(&out).contains("this model file's sha256"),
        "{}",
        text(&out)
    );

    // The chain goes on after a restart; with the texts off an entry keeps only hashes.
    let mut d = daemon(&p, &state, "");
    assert_eq!(p.ask("SET max_tokens=4", T), "OK max_tokens=4");
    ok_text(&p.ask("GEN Water boils at", T));
    // Refused by the port before any queue: on the record with the name as sent.
    let bad = p.ask("CHAT session=../etc hi", T);
    assert!(bad.starts_with("ERR bad_request "), "{bad}");
    assert_eq!(d.terminate(T).code(), Some(0));
    let e8 = show(&state, 8);
    assert_eq!(
        (&e8["kind"], &e8["session"], &e8["error"]["code"]),
        (&"refused".into(), &"../etc".into(), &"bad_request".into()),
        "{e8}"
    );
    assert_eq!(e8["source"], source.as_str());
    let e7 = show(&state, 7);
    assert!(e7["answer"].is_null() && e7["prompt_ids"].is_null(), "{e7}");
    assert!(e7["answer_sha256"].is_string());
    let v = audit(&["verify"], &state);
    assert!(text(&v).contains("entries 1 to 8 verify"), "{}", text(&v));
    let out = audit(&["replay", "7", "-m", &m], &state);
    assert!(!out.status.success());
    assert!(text(&out).contains("keeps only hashes"), "{}", text(&out));

    // Tampering: each kind is named by verify, which exits 1.
    let seg = state.join("audit/00000001.jsonl");
    let orig = std::fs::read_to_string(&seg).unwrap();
    let lines: Vec<&str> = orig.lines().collect();
    let check = |content: String, want: &str| {
        std::fs::write(&seg, content).unwrap();
        let v = audit(&["verify"], &state);
        assert!(!v.status.success(), "verify passed a trail with {want}");
        assert!(text(&v).contains(want), "{}", text(&v));
    };
    let needle = serde_json::to_string(&greedy).unwrap();
    let edited = orig.replacen(&needle, "\"Paris, of course.\"", 1);
    assert_ne!(edited, orig);
    check(edited, "entry 1 (");
    let mut removed = lines.clone();
    removed.remove(2);
    check(removed.join("\n") + "\n", "entries 3 to 3 are missing");
    check(orig[..orig.len() - 40].to_owned(), "incomplete line");
    std::fs::write(&seg, &orig).unwrap();
    assert!(audit(&["verify"], &state).status.success());
}

#[test]
fn a_missing_state_directory_or_trail_is_said_so_with_a_failing_status() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("no-such-state");
    for args in [
        &["list"][..],
        &["verify"],
        &["show", "1"],
        &["list", "--json"],
    ] {
        let out = audit(args, &missing);
        let t = text(&out);
        assert!(!out.status.success(), "{args:?}: {t}");
        assert!(
            out.stdout.is_empty() && t.contains("no such state directory"),
            "{args:?}: {t}"
        );
    }
    // A state directory without a trail: the daemon never ran with the audit on.
    let state = tmp.path().join("state");
    std::fs::create_dir(&state).unwrap();
    for args in [&["list"][..], &["verify"]] {
        let out = audit(args, &state);
        let t = text(&out);
        assert!(!out.status.success(), "{args:?}: {t}");
        assert!(t.contains("holds no audit trail"), "{args:?}: {t}");
    }
    // A trail with no entries yet is no fault.
    std::fs::create_dir(state.join("audit")).unwrap();
    let out = audit(&["verify"], &state);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("no entries"), "{}", text(&out));
    let out = audit(&["list"], &state);
    assert!(
        out.status.success() && out.stdout.is_empty(),
        "{}",
        text(&out)
    );
}
