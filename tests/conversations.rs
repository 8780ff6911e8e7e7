//! A named session remembers its conversation: over the serial line protocol (one message per
//! request), across a SIGKILL and restart, and until RESET; over MQTT (`prompt` continues,
//! `reset` forgets). Greedy Qwen2.5-Coder 0.5B, the daemon as a child process.

mod common;

use common::json_of;
use common::mqtt::{Daemon, Mosquitto, ask, collect, model_arg, publish, subscribe};
use common::serial::{Pty, unescape, until};
use serde_json::{Value, json};
use std::time::Duration;

const DEVICE: &str = "conv-dev";

const T: Duration = Duration::from_secs(120);

/// A fact only the first turn holds.
const FACT: &str = "My name is Ana and I look after pump seven. Please remember my name.";
const QUESTION: &str = "What is my name? Answer with the name only.";

fn qwen() -> String {
    model_arg(&common::model_path(common::QWEN_05B))
}

/// The daemon on `pty` in `mode` (line, console), MQTT off, sessions in `state`.
fn daemon(pty: &Pty, mode: &str, state: &str) -> Daemon {
    let m = qwen();
    let spec = format!("{}:115200:{mode}", pty.path);
    let args = [
        "-m",
        &m,
        "--mqtt",
        "off",
        "-c",
        "1024",
        "-t",
        "2",
        "--state-dir",
        state,
        "--serial",
        &spec,
    ];
    let d = Daemon::start(&args, &[("EDGELLM_LOG", "info")]);
    let log = d.wait_log(T, |l| l.contains("serial port open"));
    assert!(log.contains("serial port open"), "port not open: {log}");
    d
}

/// The text of an `OK <answer>` line.
fn answer(line: &str) -> String {
    unescape(
        line.strip_prefix("OK ")
            .unwrap_or_else(|| panic!("not an answer: {line}")),
    )
}

#[test]
fn a_session_on_the_line_remembers_turn_one_in_turn_three_across_a_restart_until_reset() {
    let mut p = Pty::open();
    let state = tempfile::tempdir().unwrap();
    let sd = state.path().to_str().unwrap().to_owned();
    let mut d = daemon(&p, "line", &sd);
    assert_eq!(p.ask("SET max_tokens=16", T), "OK max_tokens=16");

    // Without the first turn the model cannot know the name: the control.
    let alone = answer(&p.ask(&format!("CHAT {QUESTION}"), T));
    assert!(
        !alone.contains("Ana"),
        "knew the name from nothing: {alone}"
    );

    answer(&p.ask(&format!("CHAT session=shift-a {FACT}"), T));
    answer(&p.ask("CHAT session=shift-a Which planet is the largest?", T));
    let third = answer(&p.ask(&format!("CHAT session=shift-a {QUESTION}"), T));
    assert!(third.contains("Ana"), "turn 3 forgot turn 1: {third}");
    let conv = state.path().join("sessions/shift-a.conv");
    assert!(
        conv.exists(),
        "the conversation is kept beside the snapshot"
    );

    // A turn cancelled mid-answer is not kept (`sessions list` below counts three turns).
    assert_eq!(p.ask("SET stream=on", T), "OK stream=on");
    assert_eq!(p.ask("SET max_tokens=200", T), "OK max_tokens=200");
    p.send(b"CHAT session=shift-a Write a long story about a robot.\r\n");
    let first = p.line(T).expect("a first DATA line");
    assert!(first.starts_with("DATA "), "{first}");
    // DATA lines may come before and after the reply to CANCEL; the answer ends cancelled.
    p.send(b"CANCEL\r\n");
    let mut rest = Vec::new();
    while rest.last().is_none_or(|l: &String| !l.starts_with("END ")) {
        rest.push(p.line(T).expect("the rest of the answer"));
    }
    assert!(rest.iter().any(|l| l == "OK CANCELLING"), "{rest:?}");
    assert!(
        rest.last().unwrap().starts_with("END cancelled "),
        "{rest:?}"
    );
    assert_eq!(p.ask("SET stream=off", T), "OK stream=off");
    assert_eq!(p.ask("SET max_tokens=16", T), "OK max_tokens=16");

    // Another session knows nothing of it.
    let other = answer(&p.ask(&format!("CHAT session=shift-b {QUESTION}"), T));
    assert!(
        !other.contains("Ana"),
        "shift-b knew shift-a's name: {other}"
    );

    // `edgellm sessions` reads them while the daemon runs, and will not delete under it.
    let list = sessions(&["list", "--state-dir", &sd]);
    assert!(list.status.success(), "{list:?}");
    let list = String::from_utf8_lossy(&list.stdout).into_owned();
    assert!(list.contains("shift-a  turns=3 messages=6"), "{list}");
    assert!(list.contains("shift-b  turns=1 messages=2"), "{list}");
    let show = sessions(&["show", "shift-a", "--state-dir", &sd]);
    assert!(String::from_utf8_lossy(&show.stdout).starts_with(&format!("user: {FACT}\n")));
    let refused = sessions(&["delete", "shift-b", "--state-dir", &sd]);
    assert!(!refused.status.success());
    let why = String::from_utf8_lossy(&refused.stderr);
    assert!(
        why.contains("a daemon holds") && why.contains("RESET shift-b"),
        "{why}"
    );
    assert!(state.path().join("sessions/shift-b.conv").exists());

    // The same four turns in a session never interrupted: what shift-a's fourth turn must be.
    let mut uninterrupted = String::new();
    for q in [FACT, "Which planet is the largest?", QUESTION, QUESTION] {
        uninterrupted = answer(&p.ask(&format!("CHAT session=shift-c {q}"), T));
    }

    // SIGKILL: the acknowledged turns were synced before their answers went out. The KV
    // snapshot goes too, so the restarted daemon recomputes the session from its messages.
    d.child.kill().unwrap();
    d.child.wait().unwrap();
    drop(d);
    std::fs::remove_file(state.path().join("sessions/shift-a.kv")).unwrap();
    let d = daemon(&p, "line", &sd);
    assert_eq!(p.ask("SET max_tokens=16", T), "OK max_tokens=16");
    let again = answer(&p.ask(&format!("CHAT session=shift-a {QUESTION}"), T));
    assert!(
        again.contains("Ana"),
        "the restart lost the conversation: {again}"
    );
    assert_eq!(
        again, uninterrupted,
        "the restart changed how the conversation goes on"
    );

    // RESET forgets it: the conversation and the cache.
    assert_eq!(p.ask("RESET shift-a", T), "OK RESET shift-a");
    assert!(!conv.exists(), "RESET left the conversation");
    let after = answer(&p.ask(&format!("CHAT session=shift-a {QUESTION}"), T));
    assert!(!after.contains("Ana"), "RESET kept the name: {after}");
    drop(d);

    // With the daemon gone, delete works, and a deleted session is no more.
    let deleted = sessions(&["delete", "shift-b", "--state-dir", &sd]);
    assert!(deleted.status.success(), "{deleted:?}");
    assert!(!state.path().join("sessions/shift-b.conv").exists());
    assert!(!state.path().join("sessions/shift-b.kv").exists());
    let gone = sessions(&["show", "shift-b", "--state-dir", &sd]);
    assert!(
        String::from_utf8_lossy(&gone.stderr).contains("no session shift-b"),
        "{gone:?}"
    );
}

/// `edgellm sessions ARGS`.
fn sessions(args: &[&str]) -> std::process::Output {
    let mut a = vec!["sessions"];
    a.extend_from_slice(args);
    common::mqtt::edgellm(&a)
}

/// `edgellm ask --session desk --json -n 16 TEXT` against the daemon: the final message.
fn ask_desk(port: u16, text: &str) -> Value {
    let v = json_of(&ask(
        port,
        DEVICE,
        &["--session", "desk", "--json", "-n", "16", text],
    ));
    assert!(v["error"].is_null(), "{v}");
    v
}

/// Publishes `req` (with its `id`) to the device and returns the final message.
fn publish_request(port: u16, req: Value) -> Value {
    let id = req["id"].as_str().unwrap().to_owned();
    let sub = subscribe(port, &format!("edgellm/{DEVICE}/response/{id}"), 1, 120);
    publish(
        port,
        &format!("edgellm/{DEVICE}/request"),
        req.to_string().as_bytes(),
    );
    let (_, payload) = collect(sub).pop().expect("an answer");
    serde_json::from_str(&payload).unwrap()
}

#[test]
fn mqtt_and_ask_continue_a_session_messages_replace_it_and_reset_forgets_it() {
    let broker = Mosquitto::start();
    let state = tempfile::tempdir().unwrap();
    let sd = state.path().to_str().unwrap().to_owned();
    let (m, b) = (qwen(), format!("127.0.0.1:{}", broker.port));
    let args = [
        "-m",
        &m,
        "--mqtt",
        &b,
        "--device",
        DEVICE,
        "-c",
        "1024",
        "-t",
        "2",
        "--state-dir",
        &sd,
    ];
    let _d = Daemon::start(&args, &[("EDGELLM_LOG", "info")]);
    let port = broker.port;

    ask_desk(port, FACT);
    ask_desk(port, "Which planet is the largest?");
    let third = ask_desk(port, QUESTION);
    assert!(
        third["text"].as_str().unwrap().contains("Ana"),
        "turn 3 forgot turn 1: {third}"
    );

    let history = publish_request(
        port,
        json!({"id": "h1", "session": "desk", "history": true}),
    );
    assert!(
        history["text"].as_str().unwrap().contains(FACT),
        "{history}"
    );

    // `messages` replace the conversation: the name is gone from it.
    let replaced = publish_request(
        port,
        json!({"id": "m1", "session": "desk", "max_tokens": 16,
            "messages": [{"role": "user", "content": QUESTION}]}),
    );
    assert!(
        !replaced["text"].as_str().unwrap().contains("Ana"),
        "{replaced}"
    );

    // A system prompt given once stays the conversation's: the next turn keeps it.
    let with_system = |text: &str, system: Option<&str>| {
        let mut a = vec!["--session", "sys", "--json", "-n", "4"];
        a.extend(system.map(|s| ["--system", s]).into_iter().flatten());
        a.push(text);
        let v = json_of(&ask(port, DEVICE, &a));
        assert!(v["error"].is_null(), "{v}");
        v
    };
    with_system("Hello.", Some("You are a pump expert."));
    let second = with_system("Go on.", None);
    let h = publish_request(port, json!({"id": "h2", "session": "sys", "history": true}));
    let h = h["text"].as_str().unwrap();
    assert!(
        h.starts_with("system: You are a pump expert.\n\nuser: Hello."),
        "{h}"
    );
    assert!(h.contains("\n\nuser: Go on.\n\nassistant: "), "{h}");
    let computed = second["usage"]["prompt_tokens"].as_u64().unwrap()
        - second["usage"]["restored_tokens"].as_u64().unwrap();
    assert!(
        computed < 20,
        "turn 2 recomputed {computed} tokens: its system prompt changed"
    );

    ask_desk(port, FACT);
    let reset = publish_request(port, json!({"id": "r1", "session": "desk", "reset": true}));
    assert!(reset["error"].is_null(), "{reset}");
    assert!(
        !state.path().join("sessions/desk.conv").exists(),
        "reset kept the log"
    );
    let after = ask_desk(port, QUESTION);
    assert!(
        !after["text"].as_str().unwrap().contains("Ana"),
        "reset kept the name: {after}"
    );
}

/// The daemon on MQTT with a 256-position context and the configuration `toml`.
fn small_context(broker: &Mosquitto, toml: &str) -> (Daemon, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("edgellm.toml");
    std::fs::write(&conf, toml).unwrap();
    let state = dir.path().join("state");
    let (m, b) = (qwen(), format!("127.0.0.1:{}", broker.port));
    let (c, s) = (conf.to_str().unwrap(), state.to_str().unwrap());
    let args = [
        "--config",
        c,
        "-m",
        &m,
        "--mqtt",
        &b,
        "--device",
        DEVICE,
        "-c",
        "256",
        "-t",
        "2",
        "--state-dir",
        s,
    ];
    (Daemon::start(&args, &[]), dir)
}

/// Turn `n` of a conversation longer than the context.
fn long_turn(n: usize) -> Value {
    json!({"id": format!("t{n}"), "session": "log", "max_tokens": 16,
        "prompt": format!("Reading {n}: the pressure on line {n} is {} bar. Note it.", 3 + n)})
}

#[test]
fn a_conversation_longer_than_the_context_slides_or_is_refused_as_configured() {
    let broker = Mosquitto::start();
    let (_d, _dir) = small_context(&broker, "[limits]\ncontext_full = \"slide\"\n");
    let mut dropped = Vec::new();
    for n in 0..8 {
        let a = publish_request(broker.port, long_turn(n));
        assert!(a["error"].is_null(), "turn {n} was not answered: {a}");
        dropped.push(a["usage"]["dropped_turns"].as_u64().unwrap_or(0));
    }
    assert_eq!(dropped[0], 0, "{dropped:?}");
    assert!(
        *dropped.last().unwrap() >= 1,
        "nothing slid out of 256 positions: {dropped:?}"
    );
    drop(_d);

    let (_d, _dir) = small_context(&broker, "[limits]\ncontext_full = \"refuse\"\n");
    let refused = (0..8)
        .map(|n| publish_request(broker.port, long_turn(n)))
        .find(|a| !a["error"].is_null())
        .expect("a turn past the context is refused");
    assert_eq!(refused["error"]["code"], "context_full", "{refused}");
}

#[test]
fn the_console_continues_its_session_shows_its_history_and_resets_it() {
    let mut p = Pty::open();
    let state = tempfile::tempdir().unwrap();
    let sd = state.path().to_str().unwrap().to_owned();
    let _d = daemon(&p, "console", &sd);
    until(&mut p, "edgellm> ", T);
    let say = |p: &mut Pty, line: &str| {
        p.send(format!("{line}\r").as_bytes());
        until(p, "edgellm> ", T)
    };
    say(&mut p, "/session bench");
    say(&mut p, FACT);
    say(&mut p, "Which planet is the largest?");
    let third = say(&mut p, QUESTION);
    assert!(third.contains("Ana"), "turn 3 forgot turn 1: {third:?}");
    let history = say(&mut p, "/history");
    assert!(history.contains(&format!("user: {FACT}")), "{history:?}");
    assert!(say(&mut p, "/reset").contains("session bench forgotten"));
    let after = say(&mut p, QUESTION);
    assert!(!after.contains("Ana"), "reset kept the name: {after:?}");
}

#[test]
fn a_conversation_keeps_the_configured_number_of_turns() {
    let broker = Mosquitto::start();
    let (d, dir) = small_context(&broker, "[state]\nconversation_turns = 2\n");
    for n in 0..4 {
        let a = publish_request(broker.port, long_turn(n));
        assert!(a["error"].is_null(), "turn {n}: {a}");
    }
    drop(d);
    let state = dir.path().join("state");
    let out = sessions(&["list", "--json", "--state-dir", state.to_str().unwrap()]);
    let list: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (&list[0]["name"], &list[0]["turns"]),
        (&json!("log"), &json!(4)),
        "{list}"
    );
    assert_eq!(list[0]["messages"], 4, "two turns of four kept: {list}");
}
