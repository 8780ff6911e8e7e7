//! Requests over MQTT that do not simply run to their end, against `edgellm serve` as a real
//! process and a real Mosquitto: a full queue answers `busy` at once, a cancel stops an answer
//! mid-way, the request timeout cuts a long one, and named sessions carry a conversation from
//! one turn to the next. After each, the daemon answers a new request.

mod common;

use common::json_of;
use common::mqtt::{Daemon, Mosquitto, collect, edgellm, publish, publish_lines, subscribe};
use serde_json::Value;
use std::time::{Duration, Instant};

const DEVICE: &str = "req-dev";

fn model() -> String {
    common::model_path("q4_0").to_str().unwrap().to_owned()
}

fn request_topic() -> String {
    format!("edgellm/{DEVICE}/request")
}

/// The daemon on the broker at `port`, with `toml` as its configuration file (the `[limits]`
/// under test) and `extra` flags (a context of 512 unless they say `--ctx`).
fn serve(port: u16, toml: &str, extra: &[&str]) -> (Daemon, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("edgellm.toml");
    std::fs::write(&conf, toml).unwrap();
    let broker = format!("127.0.0.1:{port}");
    let (m, c) = (model(), conf.to_str().unwrap().to_owned());
    let mut args = vec![
        "--config", &c, "--model", &m, "--mqtt", &broker, "--device", DEVICE, "-t", "1",
    ];
    if !extra.contains(&"--ctx") {
        args.extend(["--ctx", "512"]);
    }
    args.extend_from_slice(extra);
    (Daemon::start(&args, &[]), dir)
}

/// The final message of request `id` among `replies`; exactly one must be there.
fn final_of<'a>(replies: &'a [(String, Value)], id: &str) -> &'a Value {
    let finals: Vec<_> = replies
        .iter()
        .filter(|(t, v)| t.ends_with(&format!("/{id}")) && v["done"] == true)
        .map(|(_, v)| v)
        .collect();
    assert_eq!(finals.len(), 1, "one final message for {id}: {replies:?}");
    finals[0]
}

fn parsed(replies: Vec<(String, String)>) -> Vec<(String, Value)> {
    replies
        .into_iter()
        .map(|(t, p)| {
            let v = serde_json::from_str(&p).unwrap_or_else(|e| panic!("{e}: {p}"));
            (t, v)
        })
        .collect()
}

/// A short request is answered: the daemon is still serving.
fn still_serves(port: u16) {
    let out = common::mqtt::ask(port, DEVICE, &["-n", "2", "--json", "Hi"]);
    let v = json_of(&out);
    let finish = v["finish_reason"].as_str().unwrap_or("");
    assert!(finish == "length" || finish == "stop", "{v}");
}

/// A prompt with nothing to answer is refused `bad_request` at once, as the serial front ends
/// refuse it, instead of the model answering the template's turn markers at length; so is a
/// session name that cannot be one. Each refusal is in the audit trail, with its session name.
#[test]
fn an_empty_or_blank_prompt_or_a_bad_session_name_is_refused_at_once_and_recorded() {
    let broker = Mosquitto::start();
    let state = tempfile::tempdir().unwrap();
    let sd = state.path().to_str().unwrap();
    let (mut d, _dir) = serve(broker.port, "", &["--state-dir", sd]);
    let requests = [
        ("blank", r#""prompt":"   ""#),
        ("empty", r#""prompt":"""#),
        ("white", r#""prompt":"\t\r\n \u00a0""#),
        (
            "msgs",
            r#""messages":[{"role":"system","content":" "},{"role":"user","content":"\n"}]"#,
        ),
        ("none", r#""messages":[]"#),
        ("name", r#""prompt":"hi","session":"../etc""#),
    ];
    let sub = subscribe(
        broker.port,
        &format!("edgellm/{DEVICE}/response/+"),
        requests.len(),
        60,
    );
    let lines: Vec<String> = requests
        .iter()
        .map(|(id, body)| format!(r#"{{"id":"{id}",{body}}}"#))
        .collect();
    publish_lines(broker.port, &request_topic(), &lines);
    let replies = parsed(collect(sub));
    assert_eq!(replies.len(), requests.len(), "{replies:?}");
    for (id, _) in requests {
        let v = final_of(&replies, id);
        assert_eq!(v["error"]["code"], "bad_request", "{v}");
        let message = v["error"]["message"].as_str().unwrap();
        let why = if id == "name" {
            "session name"
        } else {
            "empty or only whitespace"
        };
        assert!(message.contains(why), "{v}");
    }
    still_serves(broker.port);
    assert_eq!(d.terminate(Duration::from_secs(30)).code(), Some(0));

    let out = edgellm(&["audit", "list", "--json", "--state-dir", sd]);
    assert!(out.status.success(), "{out:?}");
    let listed: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let refused: Vec<&Value> = listed.iter().filter(|e| e["kind"] == "refused").collect();
    let ids: Vec<&str> = refused.iter().map(|e| e["id"].as_str().unwrap()).collect();
    assert_eq!(ids, requests.map(|(id, _)| id), "{listed:?}");
    for e in &refused {
        assert_eq!(e["error"], "bad_request", "{e}");
        // No response topic was given: the request topic names where it came from.
        assert_eq!(e["source"], format!("mqtt:edgellm/{DEVICE}/request"), "{e}");
    }
    assert_eq!(refused[5]["session"], "../etc", "{:?}", refused[5]);
    assert_eq!(
        listed.len(),
        refused.len() + 1,
        "and the answer: {listed:?}"
    );
}

#[test]
fn a_full_queue_answers_busy_at_once_and_the_accepted_requests_are_answered() {
    let broker = Mosquitto::start();
    // One answered at a time (no batch), one waiting: the others find the queue full.
    let (_d, _dir) = serve(
        broker.port,
        "[model]\nmax_batch = 1\n[limits]\nqueue_depth = 1\n",
        &[],
    );
    // One answered, one waiting: the others find the queue full. 48 tokens take long enough
    // (about a second on one thread) for all four to arrive while the first is answered.
    let ids = ["b0", "b1", "b2", "b3"];
    let sub = subscribe(
        broker.port,
        &format!("edgellm/{DEVICE}/response/+"),
        ids.len(),
        60,
    );
    let lines: Vec<String> = ids
        .iter()
        .map(|id| format!(r#"{{"id":"{id}","prompt":"Tell me a story.","max_tokens":48}}"#))
        .collect();
    publish_lines(broker.port, &request_topic(), &lines);
    let replies = parsed(collect(sub));
    assert_eq!(replies.len(), ids.len(), "{replies:?}");
    let busy: Vec<&str> = ids
        .iter()
        .copied()
        .filter(|id| final_of(&replies, id)["error"]["code"] == "busy")
        .collect();
    assert!(
        !busy.is_empty(),
        "a queue of 1 holds 2 at most: {replies:?}"
    );
    for id in ids {
        let v = final_of(&replies, id);
        assert_eq!(v["id"], id, "{v}");
        if !busy.contains(&id) {
            assert!(v["text"].as_str().is_some_and(|t| !t.is_empty()), "{v}");
        }
    }
    assert!(
        busy.len() < ids.len(),
        "the first is always taken: {replies:?}"
    );
    // At once: every `busy` came before the first answer was done.
    let first_answer = replies
        .iter()
        .position(|(_, v)| v.get("text").is_some())
        .unwrap();
    let last_busy = replies
        .iter()
        .rposition(|(_, v)| v["error"]["code"] == "busy")
        .unwrap();
    assert!(last_busy < first_answer, "{replies:?}");
    still_serves(broker.port);
}

#[test]
fn a_cancel_stops_a_running_answer_promptly_and_takes_a_waiting_one_out_of_the_queue() {
    let broker = Mosquitto::start();
    // One answer at a time (a batch would take the second in at once, tests/service_batch.rs).
    let (d, _dir) = serve(broker.port, "[model]\nmax_batch = 1\n", &[]);
    let mut sub = subscribe(
        broker.port,
        &format!("edgellm/{DEVICE}/response/+"),
        1000,
        60,
    );
    // 400 tokens take several seconds; the second request waits behind the first.
    let long = |id: &str| {
        format!(
            r#"{{"id":"{id}","prompt":"Tell me a long story about a lighthouse.","max_tokens":400,"stream":true}}"#
        )
    };
    publish_lines(broker.port, &request_topic(), &[long("c1"), long("c2")]);
    let mut lines = sub.lines();
    let mut next = || -> (String, Value) {
        let l = lines
            .next()
            .unwrap_or_else(|| panic!("no more messages\n{}", d.log_text()));
        let (t, p) = l.split_once(' ').unwrap();
        (t.to_owned(), serde_json::from_str(p).unwrap())
    };
    let (t, first) = next();
    assert!(t.ends_with("/c1") && first["done"] == false, "{t} {first}");

    let cancel = format!("edgellm/{DEVICE}/cancel");
    publish(broker.port, &cancel, br#"{"id":"c2"}"#);
    publish(broker.port, &cancel, br#"{"id":"c1"}"#);
    let cancelled = Instant::now();
    let (mut c1, mut c2) = (None, None);
    while c1.is_none() || c2.is_none() {
        let (t, v) = next();
        if v["done"] == true {
            let slot = if t.ends_with("/c1") { &mut c1 } else { &mut c2 };
            assert!(slot.is_none(), "a second final message: {t} {v}");
            *slot = Some((v, cancelled.elapsed()));
        }
    }
    let ((c1, took), (c2, _)) = (c1.unwrap(), c2.unwrap());
    // The waiting one never started: an error, at once.
    assert_eq!(c2["error"]["code"], "cancelled", "{c2}");
    // The running one stops at its next token, with what it had so far.
    assert_eq!(c1["finish_reason"], "cancelled", "{c1}");
    let n = c1["usage"]["completion_tokens"].as_u64().unwrap();
    assert!((1..400).contains(&n), "{c1}");
    assert!(took < Duration::from_secs(5), "cancelled after {took:?}");
    drop(next);
    drop(lines);
    drop(sub);
    still_serves(broker.port);
}

#[test]
fn a_long_answer_stops_at_the_request_timeout_with_its_text_so_far() {
    let broker = Mosquitto::start();
    // 1000 tokens take 20 s on one thread here, and 5 s on a core four times as fast: the 2 s
    // timeout comes first (and leaves a loaded machine time for the short request after it).
    let (_d, _dir) = serve(
        broker.port,
        "[limits]\nrequest_timeout_s = 2\nmax_tokens = 1000\n",
        &["--ctx", "1280"],
    );
    let sub = subscribe(broker.port, &format!("edgellm/{DEVICE}/response/t1"), 1, 60);
    let asked = Instant::now();
    publish(
        broker.port,
        &request_topic(),
        br#"{"id":"t1","prompt":"Tell me a long story about a lighthouse.","max_tokens":1000}"#,
    );
    let replies = parsed(collect(sub));
    let took = asked.elapsed();
    let v = final_of(&replies, "t1");
    assert_eq!(v["finish_reason"], "timeout", "{v}");
    let n = v["usage"]["completion_tokens"].as_u64().unwrap();
    assert!((1..1000).contains(&n), "{v}");
    assert!(v["text"].as_str().is_some_and(|t| !t.is_empty()), "{v}");
    assert!(took < Duration::from_secs(15), "{took:?}");
    still_serves(broker.port);
}

/// A request of `messages` (and a `session`), answered: the final message.
/// Requests that arrive together are decoded together (the daemon's default batch), and each
/// answer is the one it gets alone.
#[test]
fn requests_that_arrive_together_are_answered_together_as_each_is_alone() {
    let broker = Mosquitto::start();
    let (_d, _dir) = serve(broker.port, "", &[]);
    let prompts = [
        "What is a PLC?",
        "Name the boiling point of water in Celsius.",
        "Say hello.",
        "Which colour is the sky?",
    ];
    let request = |id: &str, p: &str| {
        serde_json::json!({"id": id, "prompt": p, "max_tokens": 24}).to_string()
    };
    let topic = format!("edgellm/{DEVICE}/response/+");
    let mut alone = Vec::new();
    for (i, p) in prompts.iter().enumerate() {
        let id = format!("a{i}");
        let sub = subscribe(broker.port, &topic, 1, 60);
        publish(broker.port, &request_topic(), request(&id, p).as_bytes());
        alone.push(final_of(&parsed(collect(sub)), &id)["text"].clone());
    }
    let sub = subscribe(broker.port, &topic, prompts.len(), 60);
    let lines: Vec<String> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| request(&format!("t{i}"), p))
        .collect();
    publish_lines(broker.port, &request_topic(), &lines);
    let replies = parsed(collect(sub));
    for (i, want) in alone.iter().enumerate() {
        let v = final_of(&replies, &format!("t{i}"));
        assert!(want.as_str().is_some_and(|t| !t.is_empty()), "{want}");
        assert_eq!(&v["text"], want, "t{i}: {v}");
    }
    let status = collect(subscribe(
        broker.port,
        &format!("edgellm/{DEVICE}/status"),
        1,
        20,
    ));
    let v: Value = serde_json::from_str(&status[0].1).unwrap();
    assert_eq!(v["max_batch"], 4, "{v}");
    assert!(v["counters"]["batched_steps"].as_u64().unwrap() > 0, "{v}");
}

fn chat(port: u16, id: &str, messages: &Value, session: Option<&str>) -> Value {
    let sub = subscribe(port, &format!("edgellm/{DEVICE}/response/{id}"), 1, 60);
    let mut req = serde_json::json!({"id": id, "messages": messages, "max_tokens": 8});
    if let Some(s) = session {
        req["session"] = s.into();
    }
    publish(port, &request_topic(), req.to_string().as_bytes());
    let replies = parsed(collect(sub));
    let v = final_of(&replies, id).clone();
    assert!(v.get("text").is_some(), "{v}");
    v
}

#[test]
fn a_named_session_restores_the_first_turn_and_messages_answer_as_run_does() {
    let broker = Mosquitto::start();
    let state = tempfile::tempdir().unwrap();
    let (_d, _dir) = serve(
        broker.port,
        "",
        &["--state-dir", state.path().to_str().unwrap()],
    );
    let (system, first) = ("You are terse.", "My name is Ada. Say hello.");
    let turn1 = serde_json::json!([
        {"role": "system", "content": system},
        {"role": "user", "content": first},
    ]);
    let a1 = chat(broker.port, "s1", &turn1, Some("chat-1"));

    // `messages` is the conversation as `run --chat` builds it from --system and --prompt.
    let m = model();
    let run = json_of(&edgellm(&[
        "run", "-m", &m, "--chat", "--system", system, "--prompt", first, "-n", "8", "--json",
        "-c", "512",
    ]));
    assert_eq!(a1["text"], run["text"], "{a1}");
    let prompt1 = run["prompt_ids"].as_array().unwrap().len() as u64;
    // `prompt_tokens` is the whole prompt, whatever was restored of it.
    assert_eq!(a1["usage"]["prompt_tokens"], prompt1, "{a1}");

    // A request without a session in between: the scratch session that answers it keeps
    // its positions too, and a prefix in common would be restored from there. Now only the
    // named session holds the first turn.
    let other = serde_json::json!([
        {"role": "system", "content": "You count."},
        {"role": "user", "content": "One, two?"},
    ]);
    chat(broker.port, "u1", &other, None);

    // The second turn carries the first: the session holds all of its prompt already.
    let mut turn2 = turn1.clone();
    let arr = turn2.as_array_mut().unwrap();
    arr.push(serde_json::json!({"role": "assistant", "content": a1["text"]}));
    arr.push(serde_json::json!({"role": "user", "content": "What is my name?"}));
    let a2 = chat(broker.port, "s2", &turn2, Some("chat-1"));
    let restored = a2["usage"]["restored_tokens"].as_u64().unwrap();
    assert!(restored >= prompt1, "{prompt1} tokens of turn 1: {a2}");

    // Restored or computed, the same greedy answer, and the same prompt_tokens: the whole
    // prompt, with restored_tokens of it beside.
    let fresh = chat(broker.port, "s3", &turn2, None);
    assert_eq!(fresh["text"], a2["text"], "{fresh}\n{a2}");
    let whole = fresh["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(whole > prompt1, "{fresh}");
    assert_eq!(a2["usage"]["prompt_tokens"], whole, "{a2}\n{fresh}");
    assert!(
        fresh["usage"]["restored_tokens"].as_u64().unwrap() < restored,
        "{a2}\n{fresh}"
    );
}
