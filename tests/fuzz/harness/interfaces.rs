//! The request interfaces: MQTT payloads, and the serial cores (line protocol, binary frames,
//! interactive console, Modbus register mailbox) driven by scripts of port bytes and service
//! events. They share the service's event vocabulary (`done`, `service_error`), hence one file.

use super::{Input, text};
use edgellm::mqtt::contract::{self, Origin};
use edgellm::serial::console::{ConsoleConfig, ConsoleCore};
use edgellm::serial::core::{Core, MemEnv};
use edgellm::serial::frame::codec::{self, Decoded, Decoder};
use edgellm::serial::frame::{FrameConfig, FrameCore};
use edgellm::serial::line::{LineConfig, LineCore};
use edgellm::serial::modbus::map::{self, Exception, Mailbox, MailboxConfig, Written};
use edgellm::service::{Chunk, Done, ErrorCode, Event, FinishReason, Prompt, Request};
use edgellm::service::{ServiceError, Timings, Usage};
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------------------------
// MQTT: request and cancel payloads, and the JSON answered.

pub fn mqtt_request(data: &[u8]) {
    let mut input = Input::new(data);
    let sel = input.u8();
    let payload = input.rest();
    let origin = if sel & 1 == 0 {
        Origin::Device
    } else {
        Origin::Fleet
    };
    let limits = contract::Limits {
        // Small bounds too, so that the oversized path is reached.
        max_payload: 16 << (sel >> 1 & 7),
        max_tokens: 512,
        timeout: Some(Duration::from_secs(30)),
    };
    let now = Instant::now();
    match contract::parse_request(payload, origin, "fuzz", || "gen-1".into(), &limits, now) {
        Ok(p) => {
            let r = &p.request;
            assert!(payload.len() <= limits.max_payload);
            assert!(contract::valid_id(&r.id), "{:?}", r.id);
            assert_eq!(
                p.generated_id,
                r.id == "gen-1" && !payload_names_id(payload)
            );
            assert!((1..=limits.max_tokens).contains(&r.max_tokens));
            assert!(r.sampling.validate().is_ok(), "{:?}", r.sampling);
            assert!(origin == Origin::Device || r.session.is_none());
            assert!(
                matches!(r.prompt, Prompt::Chat(_)),
                "MQTT prompts are chats"
            );
            assert_eq!(r.deadline, Some(now + Duration::from_secs(30)));
            let chunk = contract::chunk_json(&r.id, 1, &text(payload, 64));
            let v: serde_json::Value = serde_json::from_slice(&chunk).expect("chunk JSON");
            assert_eq!(v["id"].as_str(), Some(r.id.as_str()));
            // What `edgellm ask` reads back is what the daemon wrote.
            let back = contract::parse_reply(&chunk).expect("a chunk reads back");
            assert!(matches!(back, contract::Reply::Chunk(_)) && back.id() == Some(&*r.id));
        }
        Err(refused) => {
            assert!(refused.id.as_deref().is_none_or(contract::valid_id));
            let out = contract::error_json(refused.id.as_deref(), &refused.error);
            let v: serde_json::Value = serde_json::from_slice(&out).expect("error JSON");
            assert_eq!(
                v["error"]["message"].as_str(),
                Some(&*refused.error.message)
            );
            let back = contract::parse_reply(&out).expect("an error reads back");
            assert_eq!(back.id(), refused.id.as_deref());
        }
    }
    if let Ok(id) = contract::parse_cancel(payload) {
        assert!(payload.len() <= 1024, "{id:?}");
    }
    // The client's parser, on anything a broker may hand it: an answer or an error, never a
    // panic.
    let _ = contract::parse_reply(payload);
}

/// Whether the payload's JSON has an `id` string (then the id was not generated).
fn payload_names_id(payload: &[u8]) -> bool {
    serde_json::from_slice::<serde_json::Value>(payload)
        .is_ok_and(|v| v.get("id").is_some_and(|id| id.is_string()))
}

// ---------------------------------------------------------------------------------------------
// Serial cores: the fuzz input is the port's bytes interleaved with the service's events.

/// What the driver does to a core, one step of the script.
fn step<C: Core>(core: &mut C, env: &mut MemEnv, input: &mut Input, live: &mut Option<String>) {
    let now = env.clock.expect("the harness keeps a clock");
    match input.u8() % 8 {
        0 | 1 => core.on_bytes(input.run(), env),
        // The service's events, in the order its contract allows: Text*, then Done or Error,
        // only for a request the core submitted.
        2 if live.is_some() => {
            let t = text(input.run(), edgellm::service::CHUNK_BYTES);
            live.as_mut().expect("checked").push_str(&t);
            core.on_event(Event::Text(Chunk::try_from(t.as_str()).expect("fits")), env);
        }
        3 if live.is_some() => {
            let b = input.u8();
            let reason = match b % 5 {
                0 => FinishReason::Eog,
                1 => FinishReason::Length,
                2 => FinishReason::ContextFull,
                3 => FinishReason::Cancelled,
                _ => FinishReason::Timeout,
            };
            // 0 to 4: no format was asked, as in the seeds made before formats.
            let valid = [None, Some(true), Some(false)][(b / 5 % 3) as usize];
            let mut d = done(live.take(), reason);
            d.valid = valid;
            core.on_event(Event::Done(Box::new(d)), env);
        }
        4 if live.is_some() => {
            *live = None;
            core.on_event(Event::Error(service_error(input)), env);
        }
        5 => core.on_open(env),
        6 => {
            // Time passes; the driver ticks the core when its deadline is reached.
            let later = now + Duration::from_millis(input.u8() as u64 * 20);
            env.clock = Some(later);
            if core.deadline().is_some_and(|d| d <= later) {
                core.on_tick(env);
            }
        }
        7 => env.refuse = (input.u8() & 1 == 1).then(|| service_error(input)),
        _ => core.on_bytes(input.rest(), env),
    }
}

fn service_error(input: &mut Input) -> ServiceError {
    let code = match input.u8() % 7 {
        0 => ErrorCode::BadRequest,
        1 => ErrorCode::TooLarge,
        2 => ErrorCode::ContextFull,
        3 => ErrorCode::Busy,
        4 => ErrorCode::Timeout,
        5 => ErrorCode::Cancelled,
        _ => ErrorCode::Internal,
    };
    ServiceError::new(code, text(input.run(), 255))
}

fn done(text: Option<String>, reason: FinishReason) -> Done {
    Done {
        id: "fuzz".into(),
        text: text.unwrap_or_default(),
        finish_reason: reason,
        usage: Usage {
            prompt_tokens: 7,
            completion_tokens: 3,
            restored_tokens: 0,
            dropped_turns: 0,
        },
        timings: Timings::default(),
        prompt_ids: vec![],
        generated_ids: vec![],
        top_logits: vec![],
        truncated_tokens: 0,
        valid: None,
        json: None,
        constraint: None,
        shape: None,
        session: None,
    }
}

/// Runs a core over the script in `data`; `check` sees the core and what it wrote after each
/// step. Checks every request submitted: one at a time per port, and never control tokens.
fn drive<C: Core>(core: &mut C, data: &[u8], max_tokens: usize, mut check: impl FnMut(&C, &[u8])) {
    let mut env = MemEnv::default();
    env.clock = Some(Instant::now());
    env.sessions = vec!["plc-7".into()];
    env.log = vec![
        "daemon: started \x1b[31mred\x1b[0m".into(),
        "tab\there".into(),
    ];
    env.status.model = "synthetic".into();
    let mut input = Input::new(data);
    let mut live: Option<String> = None;
    core.on_open(&mut env);
    for _ in 0..10_000 {
        if input.is_empty() {
            break;
        }
        let before = env.submitted.len();
        step(core, &mut env, &mut input, &mut live);
        for req in &env.submitted[before..] {
            assert!(live.is_none(), "a second request while one runs: {req:?}");
            check_request(req, max_tokens);
            live = Some(String::new());
        }
        check(core, &env.out);
        env.out.clear();
    }
}

fn check_request(req: &Request, max_tokens: usize) {
    assert!(!req.id.is_empty());
    assert!(
        (1..=max_tokens).contains(&req.max_tokens),
        "{}",
        req.max_tokens
    );
    if let Prompt::Text { special, .. } = &req.prompt {
        assert!(!special, "serial text must never become control tokens");
    }
}

pub fn serial_line(data: &[u8]) {
    let cfg = LineConfig {
        max_line: 64,
        max_tokens: 100,
        default_tokens: 16,
        timeout: None,
    };
    let mut core = LineCore::new(cfg);
    let cap = core.capacity();
    drive(&mut core, data, 100, |core, out| {
        assert_eq!(core.capacity(), cap, "the line buffer never grows");
        // Every answer is whole lines: CR LF ends each, and nothing else inside ends one.
        let out = std::str::from_utf8(out).expect("answers are UTF-8");
        assert!(out.is_empty() || out.ends_with("\r\n"), "{out:?}");
        for line in out.split_terminator("\r\n") {
            assert!(!line.contains(['\r', '\n']), "{line:?}");
            let head = ["OK", "ERR", "DATA", "END"];
            assert!(head.iter().any(|h| line.starts_with(h)), "{line:?}");
        }
    });
}

pub fn frame(data: &[u8]) {
    // The decoder alone, on the raw bytes: frames it takes re-encode to themselves.
    let mut dec = Decoder::new(codec::MAX_PAYLOAD);
    let (mut fed, mut rest) = (0, data);
    while !rest.is_empty() {
        let n = dec.feed(rest);
        (fed, rest) = (fed + n, &rest[n..]);
        let mut pops = 0;
        while let Some(d) = dec.pop() {
            pops += 1;
            assert!(pops <= codec::MAX_FRAME, "pop makes progress");
            if let Decoded::Frame { seq, kind, payload } = d {
                let again = codec::encode(seq, kind, &payload);
                let mut d2 = Decoder::new(codec::MAX_PAYLOAD);
                assert_eq!(d2.feed(&again), again.len());
                assert_eq!(d2.pop(), Some(Decoded::Frame { seq, kind, payload }));
            }
        }
        assert!(
            dec.buffered() < codec::MAX_FRAME,
            "a full buffer always yields something"
        );
    }
    assert_eq!(fed, data.len());
    // The core, on the script: all it writes is whole frames of the appliance's types.
    let cfg = FrameConfig {
        max_payload: 64,
        max_tokens: 100,
        ..FrameConfig::default()
    };
    let mut core = FrameCore::new(cfg).expect("valid config");
    let (_, cap) = core.rx_buffer();
    drive(&mut core, data, 100, |core, out| {
        let (held, c) = core.rx_buffer();
        assert!(c == cap && held <= cap);
        let mut dec = Decoder::new(64);
        let mut rest = out;
        while !rest.is_empty() {
            rest = &rest[dec.feed(rest)..];
            while let Some(d) = dec.pop() {
                let Decoded::Frame { kind, payload, .. } = d else {
                    panic!("wrote {d:?}")
                };
                assert!(kind & 0x80 != 0, "the appliance's types only: {kind:#x}");
                if kind == edgellm::serial::frame::kind::END {
                    // index, finish, two counts, validity 0/1/2.
                    assert!(payload.len() == 12 && payload[11] <= 2, "END {payload:?}");
                }
            }
        }
        assert_eq!(dec.buffered(), 0, "a partial frame was written");
    });
}

pub fn console(data: &[u8]) {
    let cfg = ConsoleConfig {
        max_line: 32,
        max_tokens: 77,
        timeout: None,
    };
    let mut c = ConsoleCore::new(cfg).expect("valid config");
    let cap = c.line_capacity();
    drive(&mut c, data, 77, |c, out| {
        assert!(c.line().len() <= 32 && c.line_capacity() == cap);
        // Raw mode: CR LF ends every line, and nothing a model, a log line or the keyboard
        // sent can move the cursor or recolour the screen (no ESC, no C1, no lone CR or LF).
        let out = std::str::from_utf8(out).expect("the console writes UTF-8");
        let bytes = out.as_bytes();
        for (i, ch) in out.char_indices() {
            assert!(
                !ch.is_control() || "\r\n\t\x07\x08".contains(ch),
                "{ch:?} in {out:?}"
            );
            if ch == '\n' {
                assert!(i > 0 && bytes[i - 1] == b'\r', "bare LF in {out:?}");
            }
            if ch == '\r' {
                assert_eq!(bytes.get(i + 1), Some(&b'\n'), "bare CR in {out:?}");
            }
        }
    });
}

// ---------------------------------------------------------------------------------------------
// Modbus: the register mailbox, driven by register writes, reads and the service's events.

pub fn modbus(data: &[u8]) {
    let cfg = MailboxConfig {
        max_prompt_bytes: 61, // odd on purpose: held to 60
        max_tokens: 300,
        max_answer_bytes: 600,
        id_prefix: "mb".into(),
        vendor: "edgellm".into(),
        product: "fuzz".into(),
        version: "0".into(),
        formats: std::sync::Arc::from([edgellm::serial::modbus::typed::Typed::of(
            "part",
            &edgellm::engine::constraint::Shape::Choice(vec!["pump".into(), "valve".into()]),
        )
        .expect("a two-option choice")]),
    };
    let mut m = Mailbox::new(cfg);
    let mut input = Input::new(data);
    // The answer streamed so far for the request in progress: Done's text repeats it.
    let mut streamed = String::new();
    for _ in 0..10_000 {
        if input.is_empty() {
            break;
        }
        let before = registers(&m);
        let refused_write = match input.u8() % 10 {
            0 => {
                let (addr, n) = (input.u16(), input.u8() as u16);
                if let Ok(r) = m.read(addr, n) {
                    assert_eq!(r.len(), n as usize);
                }
                false
            }
            1 | 2 => {
                let (addr, vals) = (input.u16(), values(&mut input));
                let busy = m.current().is_some();
                let w = m.write(addr, &vals);
                check_written(&m, &w, busy, &mut streamed);
                w.is_err()
            }
            3 => {
                let (ra, n, wa, vals) = (
                    input.u16(),
                    input.u8() as u16,
                    input.u16(),
                    values(&mut input),
                );
                let busy = m.current().is_some();
                let r = m.read_write(ra, n, wa, &vals);
                if let Ok((_, regs)) = &r {
                    assert_eq!(regs.len(), n as usize);
                }
                let w = r.map(|(w, _)| w);
                check_written(&m, &w, busy, &mut streamed);
                w.is_err()
            }
            4 => {
                let id = m.current().map(str::to_owned);
                let t = text(input.run(), edgellm::service::CHUNK_BYTES);
                let chunk = Chunk::try_from(t.as_str()).expect("fits");
                if m.on_event(id.as_deref().unwrap_or("stale"), Event::Text(chunk)) {
                    streamed.push_str(&t);
                }
                false
            }
            5 => {
                if let Some(id) = m.current().map(str::to_owned) {
                    let mut d = done(Some(std::mem::take(&mut streamed)), FinishReason::Eog);
                    // Under a format (the typed registers), valid or not, JSON or not.
                    d.valid = [None, Some(true), Some(false)][input.u8() as usize % 3];
                    d.json = serde_json::from_str(&d.text).ok();
                    m.on_event(&id, Event::Done(Box::new(d)));
                }
                false
            }
            6 => {
                if let Some(id) = m.current().map(str::to_owned) {
                    m.on_event(&id, Event::Error(service_error(&mut input)));
                }
                false
            }
            7 => {
                // The service takes the request, or refuses it (only just after its submission).
                let refuse = input.u8() & 1 == 1 && m.status() == map::Status::Queued;
                if refuse && m.current().is_some() {
                    m.refused(&service_error(&mut input));
                } else if let Some(id) = m.current().map(str::to_owned) {
                    m.started(&id);
                }
                false
            }
            8 => {
                m.advance(input.u8() as u64);
                false
            }
            _ => {
                let _ = m.device_id(input.u8(), input.u8());
                false
            }
        };
        if refused_write {
            assert_eq!(registers(&m), before, "a refused write changes nothing");
        }
        check_mailbox(&m);
    }
}

/// 0 to 130 register values (past both write bounds).
fn values(input: &mut Input) -> Vec<u16> {
    let n = input.u8() as usize % 131;
    (0..n).map(|_| input.u16()).collect()
}

/// Every register a master can read.
fn registers(m: &Mailbox) -> Vec<u16> {
    // 29–31 are unmapped: a read touching them is refused (exception 0x02).
    assert!(m.read(29, 1).is_err(), "29 is unmapped");
    let mut all = m.read(0, 29).expect("status and control");
    all.extend(m.read(32, 125).expect("the window"));
    all.extend(m.read(map::TYPED, 96).expect("the typed block"));
    all.extend(m.read(map::PROMPT, 30).expect("the prompt area"));
    assert!(
        m.read(map::PROMPT + 30, 1).is_err(),
        "the prompt area ends at its capacity"
    );
    all
}

fn check_written(m: &Mailbox, w: &Result<Written, Exception>, busy: bool, streamed: &mut String) {
    if let Ok(Written::Submit(req)) = w {
        assert!(!busy, "a request was submitted over the one in progress");
        assert_eq!(m.current(), Some(req.id.as_str()));
        assert_eq!(m.status(), map::Status::Queued);
        assert!((1..=300).contains(&req.max_tokens) && req.sampling.temperature <= 2.0);
        // An empty prompt is submitted too: the service refuses it, as for every front end.
        match &req.prompt {
            Prompt::Text { special, .. } => assert!(!special),
            Prompt::Chat(msgs) => assert!(msgs.len() == 1),
            Prompt::Forget | Prompt::History => assert!(req.session.is_some(), "{req:?}"),
        }
        streamed.clear();
    }
}

fn check_mailbox(m: &Mailbox) {
    let r = m.read(0, 25).expect("the status and control blocks");
    let (status, error, finish) = (r[0], r[1], r[8]);
    let len = (r[4] as usize) << 16 | r[5] as usize;
    assert!(
        status <= 4 && len <= 600,
        "status {status}, answer {len} bytes"
    );
    assert_eq!(r[6] as usize, len.div_ceil(map::PAGE_BYTES), "page count");
    assert!(r[7] == 0 || r[7] < r[6], "page {} of {}", r[7], r[6]);
    assert_eq!(status == 4, error != 0, "status {status}, error {error}");
    assert_eq!(status == 3, finish != 0, "status {status}, finish {finish}");
    assert_eq!(r[10], map::VERSION);
    // A typed answer only once done; an index only of a valid one, within the options.
    let t = m.read(map::VALID, 2).expect("VALID and CHOICE");
    assert!(
        t[0] <= 2 && (t[0] == 0 || status == 3),
        "valid {} in status {status}",
        t[0]
    );
    assert!(
        t[1] == 0xFFFF || (t[0] == 1 && t[1] < 2),
        "choice {} valid {}",
        t[1],
        t[0]
    );
}
