//! Answer formats through the daemon, a child process: over MQTT (`response_format`, a named
//! `schema_ref`, hostile formats refused while the daemon serves on with bounded memory), through
//! `edgellm ask`, the serial line protocol (`SET choice=`, `SET format=`, `END … valid`,
//! `ERR invalid`) and the console (`/choice`, `/format`). SmolLM2, greedy.

mod common;

use common::mqtt::{Daemon, Mosquitto, ask, collect, model_arg, publish, subscribe};
use common::serial::{Pty, unescape, until};
use serde_json::{Value, json};
use std::time::Duration;

const DEVICE: &str = "fmt-dev";
const T: Duration = Duration::from_secs(120);
const OPTIONS: [&str; 4] = ["low", "medium", "high", "critical"];

fn alarm_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "severity": {"type": "integer", "minimum": 0, "maximum": 3},
            "stop_line": {"type": "boolean"},
            "reason": {"type": "string", "enum": ["bearing", "overheat", "sensor", "other"]}
        },
        "required": ["severity", "stop_line", "reason"],
        "additionalProperties": false
    })
}

/// The daemon with MQTT on `broker`, a line port and a console port, and the formats
/// `alarm` (a schema file) and `severity` (a choice list) configured.
fn daemon(broker: &Mosquitto, line: &Pty, console: &Pty) -> (Daemon, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("alarm.json"), alarm_schema().to_string()).unwrap();
    let conf = dir.path().join("edgellm.toml");
    std::fs::write(
        &conf,
        "[mqtt]\nmax_payload = \"2M\"\n\n[schemas]\nalarm = \"alarm.json\"\n\n\
         [choices]\nseverity = [\"low\", \"medium\", \"high\", \"critical\"]\n",
    )
    .unwrap();
    let m = model_arg(&common::model_path("q4_0"));
    let b = format!("127.0.0.1:{}", broker.port);
    let (l, c) = (
        format!("{}:115200:line", line.path),
        format!("{}:115200:console", console.path),
    );
    let args = [
        "--config",
        conf.to_str().unwrap(),
        "-m",
        &m,
        "--mqtt",
        &b,
        "--device",
        DEVICE,
        "-c",
        "512",
        "-t",
        "2",
        "--serial",
        &l,
        "--serial",
        &c,
    ];
    let d = Daemon::start(&args, &[("EDGELLM_LOG", "info")]);
    let log = d.wait_log(T, |l| l.contains("named answer formats ready"));
    assert!(log.contains("formats=2"), "{log}");
    (d, dir)
}

fn request(port: u16, req: Value) -> Value {
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

const ALARM: &str = "Alarm: spindle bearing temperature 95 C and rising. Classify it.";

fn rss_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap()
}

#[test]
fn every_front_end_asks_for_a_shape_and_gets_it_or_a_clear_error() {
    let broker = Mosquitto::start();
    let (mut line, mut console) = (Pty::open(), Pty::open());
    let (d, _dir) = daemon(&broker, &line, &console);
    let port = broker.port;

    // MQTT: a schema given with the request, the same schema by name, a choice, a regex.
    let a = request(
        port,
        json!({"id": "s1", "prompt": ALARM,
               "response_format": {"type": "json_schema", "schema": alarm_schema()}}),
    );
    assert_eq!(a["valid"], json!(true), "{a}");
    assert!(
        a["json"]["severity"]
            .as_i64()
            .is_some_and(|s| (0..=3).contains(&s)),
        "{a}"
    );
    assert!(a["json"]["stop_line"].is_boolean(), "{a}");
    let parsed: Value = serde_json::from_str(a["text"].as_str().unwrap()).unwrap();
    assert_eq!(parsed, a["json"]);
    let named = request(
        port,
        json!({"id": "s2", "prompt": ALARM, "response_format": {"schema_ref": "alarm"}}),
    );
    assert_eq!(
        named["json"], a["json"],
        "a named schema is the same schema: {named}"
    );
    let c = request(
        port,
        json!({"id": "c1", "prompt": ALARM,
               "response_format": {"type": "choice", "options": OPTIONS}}),
    );
    assert!(OPTIONS.contains(&c["text"].as_str().unwrap()), "{c}");
    assert_eq!(c["valid"], json!(true));
    let r = request(
        port,
        json!({"id": "r1", "prompt": "What is the bearing temperature?",
               "response_format": {"type": "regex", "pattern": "[0-9]{2,3} C"}}),
    );
    let text = r["text"].as_str().unwrap();
    assert!(
        text.ends_with(" C") && text[..text.len() - 2].bytes().all(|b| b.is_ascii_digit()),
        "{r}"
    );
    // Cut short: marked invalid, never presented as valid.
    let short = request(
        port,
        json!({"id": "m1", "prompt": ALARM, "max_tokens": 3,
               "response_format": {"schema_ref": "alarm"}}),
    );
    assert_eq!(short["valid"], json!(false), "{short}");
    assert_eq!(short["finish_reason"], json!("length"));
    assert!(short.get("json").is_none(), "{short}");
    let missing = request(
        port,
        json!({"id": "m2", "prompt": ALARM, "response_format": {"schema_ref": "nope"}}),
    );
    assert_eq!(missing["error"]["code"], json!("bad_request"), "{missing}");
    assert!(
        missing["error"]["message"]
            .as_str()
            .unwrap()
            .contains("alarm, severity")
    );

    // Hostile formats: each refused with its reason; memory stays bounded; the next request
    // is answered.
    let pid = d.child.id();
    let before = rss_kib(pid);
    let mut deep = String::new();
    for _ in 0..10_000 {
        deep.push_str("{\"type\":\"array\",\"items\":");
    }
    deep.push_str("{\"type\":\"integer\"}");
    deep.push_str(&"}".repeat(10_000));
    let hostile = [
        (
            json!({"id": "h1", "prompt": "x", "response_format": {"type": "json_schema",
                   "schema": {"type": "string", "description": "x".repeat(1 << 20)}}}),
            "too_large",
            "bytes",
        ),
        (
            json!({"id": "h3", "prompt": "x", "response_format": {"type": "json_schema",
                   "schema": {"type": "array", "items": {"type": "integer"}, "uniqueItems": true}}}),
            "bad_request",
            "uniqueItems",
        ),
        (
            json!({"id": "h4", "prompt": "x", "response_format": {"type": "regex",
                   "pattern": "(x{1,1000}){1,1000}y"}}),
            "",
            "",
        ),
        // Ambiguous: each row of its parse grows with every token and each token costs in
        // proportion, so the row bound ends it (the grammar engine's own bound of 2000 items
        // let it hold the worker for a minute).
        (
            json!({"id": "h5", "prompt": "x", "response_format": {"type": "lark",
                   "grammar": "start: start start | \"a\""}}),
            "bad_request",
            "items; max is 500",
        ),
    ];
    for (req, code, says) in hostile {
        let a = request(port, req.clone());
        if code.is_empty() {
            // Pathological but legal: answered in bounded time, or refused; either way one
            // message, and the daemon goes on.
            assert!(a["done"] == json!(true), "{a}");
        } else {
            assert_eq!(a["error"]["code"], json!(code), "{req}: {a}");
            assert!(
                a["error"]["message"].as_str().unwrap().contains(says),
                "{a}"
            );
        }
    }
    // Nested past what the JSON parser takes (128 levels), the request's id cannot be read
    // either: the refusal goes where an unreadable request's does.
    let sub = subscribe(port, &format!("edgellm/{DEVICE}/response/error"), 1, 120);
    let payload = format!(
        "{{\"id\": \"h2\", \"prompt\": \"x\", \"response_format\": {{\"type\": \"json_schema\", \
         \"schema\": {deep}}}}}"
    );
    publish(
        port,
        &format!("edgellm/{DEVICE}/request"),
        payload.as_bytes(),
    );
    let (_, deep_answer) = collect(sub).pop().expect("an answer to the deep schema");
    let deep_answer: Value = serde_json::from_str(&deep_answer).unwrap();
    assert_eq!(
        deep_answer["error"]["code"],
        json!("bad_request"),
        "{deep_answer}"
    );
    let after = rss_kib(pid);
    assert!(
        after < before + 200 * 1024,
        "RSS grew from {before} KiB to {after} KiB over the hostile formats"
    );
    let again = request(
        port,
        json!({"id": "s3", "prompt": ALARM, "response_format": {"schema_ref": "alarm"}}),
    );
    assert_eq!(
        again["json"], a["json"],
        "served on after the hostile formats: {again}"
    );

    // `edgellm ask`: a choice, and the configured one by name.
    let out = ask(
        port,
        DEVICE,
        &["--choice", "low,medium,high,critical", ALARM],
    );
    let said = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(
        out.status.success() && OPTIONS.contains(&said.as_str()),
        "{out:?}"
    );
    let out = ask(port, DEVICE, &["--format", "severity", ALARM]);
    assert!(
        OPTIONS.contains(&String::from_utf8_lossy(&out.stdout).trim()),
        "{out:?}"
    );
    let out = ask(port, DEVICE, &["--format", "alarm", "-n", "3", ALARM]);
    assert!(
        !out.status.success(),
        "a cut answer exits non-zero: {out:?}"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("shape"),
        "{out:?}"
    );

    // The line protocol.
    assert_eq!(
        line.ask("SET choice=low|medium|high|critical", T),
        "OK choice=low|medium|high|critical"
    );
    let ok = line.ask(&format!("CHAT {ALARM}"), T);
    let choice = unescape(ok.strip_prefix("OK ").unwrap_or_else(|| panic!("{ok}")));
    assert!(OPTIONS.contains(&choice.as_str()), "{ok}");
    assert_eq!(line.ask("SET format=alarm", T), "OK format=alarm");
    assert_eq!(line.ask("SET stream=on", T), "OK stream=on");
    line.send(format!("CHAT {ALARM}\r\n").as_bytes());
    let mut streamed = Vec::new();
    let end = loop {
        let l = line.line(T).expect("a DATA or END line");
        if l.starts_with("END ") {
            break l;
        }
        streamed.push(l);
    };
    assert!(
        end.ends_with(" valid"),
        "END carries validity: {end:?} after {streamed:?}"
    );
    assert_eq!(line.ask("SET stream=off", T), "OK stream=off");
    assert_eq!(line.ask("SET max_tokens=3", T), "OK max_tokens=3");
    let cut = line.ask(&format!("CHAT {ALARM}"), T);
    assert!(cut.starts_with("ERR invalid "), "{cut}");
    assert_eq!(line.ask("SET format=off", T), "OK format=off");

    // The console.
    until(&mut console, "edgellm> ", T);
    let say = |p: &mut Pty, l: &str| {
        p.send(format!("{l}\r").as_bytes());
        until(p, "edgellm> ", T)
    };
    assert!(say(&mut console, "/choice low|medium|high|critical").contains("answers are one of"));
    let answer = say(&mut console, ALARM);
    assert!(answer.contains(" · valid"), "{answer:?}");
    assert!(OPTIONS.iter().any(|o| answer.contains(o)), "{answer:?}");
    assert!(say(&mut console, "/format alarm").contains("format alarm"));
    let answer = say(&mut console, ALARM);
    assert!(
        answer.contains("\"severity\": ") && answer.contains(" · valid"),
        "{answer:?}"
    );
}
