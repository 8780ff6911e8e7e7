//! The fuzz harness of issue #17: one function per target, each feeding arbitrary bytes to a
//! real entry point of the library and checking what must hold for any input (a panic, an
//! assertion failure, a hang or a huge allocation is a bug). Shared by the libFuzzer targets
//! (`tests/fuzz/fuzz_targets/`, nightly) and by `tests/fuzz_regressions.rs`, which replays the
//! corpora and every regression input on stable in `cargo test`.
//!
//! Uses only `edgellm`, `serde_json` and std: both crates that include it have those.
#![allow(dead_code)]

use edgellm::gguf::Gguf;
use edgellm::kv::snapshot;
use edgellm::kv::{KvCache, KvError, SnapshotFile};
use edgellm::mqtt::contract::{self, Origin};
use edgellm::serial::console::{ConsoleConfig, ConsoleCore};
use edgellm::serial::core::{Core, MemEnv};
use edgellm::serial::frame::codec::{self, Decoded, Decoder};
use edgellm::serial::frame::{FrameConfig, FrameCore};
use edgellm::serial::line::{LineConfig, LineCore};
use edgellm::serial::modbus::map::{self, Exception, Mailbox, MailboxConfig, Written};
use edgellm::service::{Chunk, Done, ErrorCode, Event, FinishReason, Prompt, Request};
use edgellm::service::{ServiceError, Timings, Usage};
use edgellm::tokenizer::{ChatMessage, ChatTemplate, StreamDecoder, TokenType, Tokenizer};
use edgellm::tokenizer::{Vocab, VocabKind};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The targets, as named in `fuzz_targets/` and in `corpus/` and `regressions/`.
pub const TARGETS: [&str; 9] = [
    "gguf",
    "kv_snapshot",
    "mqtt_request",
    "serial_line",
    "frame",
    "modbus",
    "console",
    "chat_template",
    "tokenizer",
];

/// Runs target `name` on one input (the regression test's dispatch).
pub fn run(name: &str, data: &[u8]) {
    match name {
        "gguf" => gguf(data),
        "kv_snapshot" => kv_snapshot(data),
        "mqtt_request" => mqtt_request(data),
        "serial_line" => serial_line(data),
        "frame" => frame(data),
        "modbus" => modbus(data),
        "console" => console(data),
        "chat_template" => chat_template(data),
        "tokenizer" => tokenizer(data),
        other => panic!("no fuzz target {other:?}"),
    }
}

/// Reads the fuzz input as a script: small numbers and byte runs, never failing (an exhausted
/// input reads as zeros, so every input is a valid script).
pub struct Input<'a>(&'a [u8]);

impl<'a> Input<'a> {
    pub fn new(data: &'a [u8]) -> Input<'a> {
        Input(data)
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    pub fn u8(&mut self) -> u8 {
        self.bytes(1).first().copied().unwrap_or(0)
    }
    pub fn u16(&mut self) -> u16 {
        u16::from_be_bytes([self.u8(), self.u8()])
    }
    pub fn bytes(&mut self, n: usize) -> &'a [u8] {
        let (a, b) = self.0.split_at(n.min(self.0.len()));
        self.0 = b;
        a
    }
    /// A byte run with its length first (one byte).
    pub fn run(&mut self) -> &'a [u8] {
        let n = self.u8() as usize;
        self.bytes(n)
    }
    pub fn rest(&mut self) -> &'a [u8] {
        self.bytes(usize::MAX)
    }
}

/// Lossy UTF-8 of `b`, cut to at most `max` bytes on a character boundary.
fn text(b: &[u8], max: usize) -> String {
    let mut s = String::from_utf8_lossy(b).into_owned();
    let mut cut = s.len().min(max);
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    s.truncate(cut);
    s
}

// ---------------------------------------------------------------------------------------------
// GGUF reader: from bytes, every view, the tokenizer and the model built from it.

pub fn gguf(data: &[u8]) {
    let Ok(g) = Gguf::from_bytes("fuzz.gguf", data.to_vec()) else {
        return;
    };
    let len = data.len() as u64;
    assert!(g.data_offset() <= len.next_multiple_of(g.alignment()));
    for t in g.tensors() {
        // Parsing accepted the file: every tensor lies inside it, so its bytes are all there.
        let end = g
            .data_offset()
            .checked_add(t.offset)
            .and_then(|s| s.checked_add(t.size));
        assert!(
            t.size == 0 || end.is_some_and(|e| e <= len),
            "{t:?} past the end"
        );
        assert_eq!(g.tensor_data(t).len() as u64, t.size);
        let _ = (t.shape_string(), t.n_rows(), t.row_len());
        if let Ok(v) = g.tensor_view(&t.name) {
            // At most 8 values a byte (Q4): bounded by the input's size.
            let mut out = vec![0f32; t.n_elements() as usize];
            v.to_f32(&mut out);
        }
    }
    for (key, value) in g.metadata().iter() {
        let _ = (key.len(), value.describe(), value.to_string());
    }
    if let Ok(tok) = Tokenizer::from_gguf(&g) {
        let ids = tok.encode("Hello <|im_start|> wörld", true, true);
        assert!(ids.iter().all(|&i| (i as usize) < tok.n_vocab()), "{ids:?}");
    }
    if let Ok(m) = edgellm::model::Model::from_gguf(g) {
        assert_eq!(m.tokenizer.n_vocab(), m.hp.n_vocab);
        let _ = m.fingerprint();
    }
}

// ---------------------------------------------------------------------------------------------
// KV snapshot: the whole-file parser, the salvage of tokens, and the streaming file loader,
// which must agree with the parser.

pub fn kv_snapshot(data: &[u8]) {
    let parsed = snapshot::parse(data);
    let salvaged = snapshot::salvage_tokens(data);
    assert_eq!(snapshot::decode_header(data).is_ok(), salvaged.is_some());
    if let Ok(p) = &parsed {
        let (mut pos, mut end) = (0usize, p.geometry.header_len() as u64);
        for r in &p.records {
            assert_eq!(
                (r.first as usize, r.offset),
                (pos, end),
                "records are contiguous"
            );
            assert!(r.count > 0 && r.kv.end + 4 <= data.len());
            pos += r.count as usize;
            end += r.len();
        }
        assert_eq!((p.tokens.len(), p.valid_len), (pos, end));
        assert!(p.tokens.len() <= p.geometry.n_ctx as usize);
        match &p.torn {
            Some(t) => assert_eq!((t.offset, t.offset + t.bytes), (end, data.len() as u64)),
            None => assert_eq!(end, data.len() as u64),
        }
        let (g, tokens) = salvaged.expect("a parsed snapshot has a header");
        assert_eq!(g, p.geometry);
        assert!(
            tokens.starts_with(&p.tokens),
            "salvage keeps the valid records"
        );
    }
    kv_file(data, &parsed);
}

/// The same bytes as a file, through [`SnapshotFile::load`] (streamed a record at a time).
fn kv_file(data: &[u8], parsed: &Result<snapshot::Parsed, KvError>) {
    let Ok(g) = snapshot::decode_header(data) else {
        return;
    };
    let cache_bytes = g.kv_bytes(g.n_ctx as u64);
    if cache_bytes.is_none_or(|b| b > 1 << 22) {
        return; // A cache this large is the daemon's to allocate, not a fuzz run's.
    }
    let path = std::env::temp_dir().join(format!("edgellm-fuzz-kv-{}", std::process::id()));
    std::fs::write(&path, data).expect("write the snapshot to a temporary file");
    let mut kv = KvCache::with_window(
        g.n_layer as usize,
        g.n_ctx as usize,
        g.kv_dim as usize,
        1,
        g.dtype,
        g.window,
        4,
    );
    let mut file = SnapshotFile::new(&path, g);
    let loaded = file.load(&mut kv);
    let read = edgellm::kv::file::read(&path);
    let _ = std::fs::remove_file(&path);
    // Files longer than any snapshot of their shape are refused before they are read.
    let too_long = |e: &KvError| {
        matches!(
            e,
            KvError::Invalid {
                section: "file",
                ..
            }
        )
    };
    if loaded.as_ref().is_err_and(too_long) {
        assert!(read.as_ref().is_err_and(too_long));
        return;
    }
    assert_eq!(read.is_ok(), parsed.is_ok(), "{read:?}");
    match (parsed, &loaded) {
        (Ok(p), Ok(torn)) => {
            // A torn tail can leave the sliding-window rows short: then nothing is restored.
            let short = !p.geometry.window_covers(p.window_from, p.tokens.len());
            let want: &[u32] = if short { &[] } else { &p.tokens };
            assert_eq!(file.tokens(), want);
            assert_eq!(torn.is_some(), p.torn.is_some());
        }
        (Err(_), Err(_)) => {}
        (p, l) => panic!("the file loader and the parser disagree: {l:?} vs {p:?}"),
    }
    if let (Ok((bytes, p)), Ok(q)) = (&read, parsed) {
        assert_eq!((bytes.as_slice(), &p.tokens), (data, &q.tokens));
    }
}

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
        }
        Err(refused) => {
            assert!(refused.id.as_deref().is_none_or(contract::valid_id));
            let out = contract::error_json(refused.id.as_deref(), &refused.error);
            let v: serde_json::Value = serde_json::from_slice(&out).expect("error JSON");
            assert_eq!(
                v["error"]["message"].as_str(),
                Some(&*refused.error.message)
            );
        }
    }
    if let Ok(id) = contract::parse_cancel(payload) {
        assert!(payload.len() <= 1024, "{id:?}");
    }
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
            let reason = match input.u8() % 5 {
                0 => FinishReason::Eog,
                1 => FinishReason::Length,
                2 => FinishReason::ContextFull,
                3 => FinishReason::Cancelled,
                _ => FinishReason::Timeout,
            };
            core.on_event(Event::Done(Box::new(done(live.take(), reason))), env);
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
        },
        timings: Timings::default(),
        prompt_ids: vec![],
        generated_ids: vec![],
        top_logits: vec![],
        truncated_tokens: 0,
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
                let Decoded::Frame { kind, .. } = d else {
                    panic!("wrote {d:?}")
                };
                assert!(kind & 0x80 != 0, "the appliance's types only: {kind:#x}");
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
                    let d = done(Some(std::mem::take(&mut streamed)), FinishReason::Eog);
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
    let mut all = m
        .read(0, 125)
        .expect("status, control and the window's start");
    all.extend(m.read(125, 32).expect("the window's end"));
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
        match &req.prompt {
            Prompt::Text { text, special } => assert!(!text.is_empty() && !special),
            Prompt::Chat(msgs) => assert!(msgs.len() == 1 && !msgs[0].content.is_empty()),
            Prompt::Forget => panic!("Modbus never resets a session"),
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
}

// ---------------------------------------------------------------------------------------------
// Tokenizers over synthetic vocabularies, and SmolLM2's chat template over untrusted messages.

/// SmolLM2's `tokenizer.chat_template`, as `tests/data/model.json` has it (the regression test
/// checks they are the same text).
pub const SMOLLM2_TEMPLATE: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// GPT-2's byte-to-character table: the byte-level alphabet of a `gpt2` vocabulary.
fn byte_char(b: u8) -> char {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    if printable(b) {
        return char::from(b);
    }
    let n = (0..b).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(256 + n).expect("below U+0200")
}

/// A byte-level BPE vocabulary with ChatML control tokens, every byte, a few merges and a
/// user-defined token; `pre` is its pre-tokenizer.
fn bpe_vocab(pre: &str) -> Vocab {
    let mut tokens: Vec<String> = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        .map(String::from)
        .into();
    let mut types = vec![TokenType::Control as i32; 3];
    tokens.extend((0..=255u8).map(|b| byte_char(b).to_string()));
    let merges = [
        "Ġ t", "h e", "Ġt he", "i n", "Ġ a", "e r", "< |", "Ċ Ċ", "Ã ¤",
    ];
    for m in merges {
        tokens.push(m.replace(' ', ""));
    }
    types.resize(tokens.len(), TokenType::Normal as i32);
    tokens.push("<tool>".into());
    types.push(TokenType::UserDefined as i32);
    Vocab {
        kind: VocabKind::Bpe,
        pre: Some(pre.into()),
        tokens,
        types,
        merges: merges.map(String::from).into(),
        bos: Some(1),
        eos: Some(2),
        ..Vocab::default()
    }
}

/// A SentencePiece vocabulary with byte fallback (`<0xNN>` for every byte).
fn spm_vocab() -> Vocab {
    let mut tokens: Vec<String> = ["<unk>", "<s>", "</s>"].map(String::from).into();
    let mut types = vec![
        TokenType::Unknown as i32,
        TokenType::Control as i32,
        TokenType::Control as i32,
    ];
    let mut scores = vec![0.0; 3];
    tokens.extend((0..=255).map(|b| format!("<0x{b:02X}>")));
    types.resize(tokens.len(), TokenType::Byte as i32);
    scores.resize(tokens.len(), 0.0);
    for (i, p) in [
        "▁", "H", "e", "l", "o", "ll", "llo", "▁w", "or", "▁wor", "He", "▁Hello",
    ]
    .iter()
    .enumerate()
    {
        tokens.push(p.to_string());
        types.push(TokenType::Normal as i32);
        scores.push(-(i as f32) / 4.0);
    }
    Vocab {
        kind: VocabKind::Spm,
        tokens,
        scores,
        types,
        ..Vocab::default()
    }
}

/// The tokenizers, built once: (tokenizer, whether decoding gives back the text exactly).
fn tokenizers() -> &'static [(Tokenizer, bool)] {
    static T: OnceLock<Vec<(Tokenizer, bool)>> = OnceLock::new();
    T.get_or_init(|| {
        // `smollm` and `qwen2` do not clean up spaces in decoding, `default` and `llama3` do.
        let bpe = [
            ("smollm", true),
            ("qwen2", true),
            ("default", false),
            ("llama3", false),
        ];
        let mut v: Vec<_> = bpe
            .iter()
            .map(|&(p, exact)| (Tokenizer::new(bpe_vocab(p)).expect(p), exact))
            .collect();
        v.push((Tokenizer::new(spm_vocab()).expect("spm"), false));
        v
    })
}

fn is_control(tok: &Tokenizer, id: u32) -> bool {
    tok.token_type(id) == Some(TokenType::Control)
}

pub fn tokenizer(data: &[u8]) {
    let mut input = Input::new(data);
    let sel = input.u8();
    let (tok, exact) = &tokenizers()[sel as usize % tokenizers().len()];
    let bytes = input.rest();
    let n = tok.n_vocab();
    let text = String::from_utf8_lossy(bytes);
    let ids = tok.encode(&text, false, false);
    assert!(ids.iter().all(|&i| (i as usize) < n), "{ids:?}");
    assert!(
        !ids.iter().any(|&i| is_control(tok, i)),
        "text became control tokens: {ids:?}"
    );
    if *exact {
        assert_eq!(String::from_utf8_lossy(&tok.decode(&ids)), text, "{ids:?}");
    }
    let raw = tok.encode_bytes(bytes, sel & 0x10 != 0, sel & 0x20 != 0);
    assert!(raw.iter().all(|&i| (i as usize) < n), "{raw:?}");
    // Protected as a whole, even control-token text stays text.
    let whole = tok.encode_protected(&text, false, std::slice::from_ref(&(0..text.len())));
    assert!(!whole.iter().any(|&i| is_control(tok, i)), "{whole:?}");
    // The bytes as ids (any, in range or not): detokenizing and streaming never panic, and a
    // stream of pieces is their bytes, lossily decoded.
    let any: Vec<u32> = bytes
        .chunks(2)
        .map(|c| u32::from(c[0]) + 256 * u32::from(c.len() % 2 == 0 && c[1] & 1 == 1))
        .collect();
    let _ = tok.detokenize(&any, sel & 1 != 0, sel & 2 != 0);
    let mut stream = StreamDecoder::new();
    let (mut out, mut all) = (String::new(), Vec::new());
    for &id in &any {
        let piece = tok.token_to_piece(id);
        all.extend_from_slice(piece);
        stream.push_into(piece, &mut out);
        assert!(stream.pending().len() <= 3);
    }
    out.push_str(&stream.finish());
    assert_eq!(out, String::from_utf8_lossy(&all));
}

fn chat() -> &'static ChatTemplate {
    static C: OnceLock<ChatTemplate> = OnceLock::new();
    C.get_or_init(|| {
        ChatTemplate::new(SMOLLM2_TEMPLATE, "<|im_start|>", "<|im_end|>").expect("template")
    })
}

/// Messages from the input: a selector byte (system override, generation prompt), then
/// role and content runs.
pub fn chat_template(data: &[u8]) {
    let mut input = Input::new(data);
    let sel = input.u8();
    let system = (sel & 1 != 0).then(|| text(input.run(), 255));
    let mut messages = Vec::new();
    while !input.is_empty() && messages.len() < 8 {
        let role = match input.u8() % 4 {
            0 => "user".to_string(),
            1 => "assistant".to_string(),
            2 => "system".to_string(),
            _ => text(input.run(), 32), // MQTT takes the role from the client too
        };
        messages.push(ChatMessage::new(role, text(input.run(), 255)));
    }
    let tok = &tokenizers()[0].0;
    let Ok(r) = chat().render_protected(system.as_deref(), &messages, sel & 2 != 0) else {
        return;
    };
    assert_eq!(
        r.text,
        chat()
            .render_with_system(system.as_deref(), &messages, sel & 2 != 0)
            .expect("renders")
    );
    let ids = tok.encode_protected(&r.text, true, &r.ranges());
    assert!(ids.iter().all(|&i| (i as usize) < tok.n_vocab()));
    // The control tokens are the template's own: as many as with harmless contents and roles.
    let plain: Vec<ChatMessage> = messages
        .iter()
        .map(|m| ChatMessage::new(if m.role == "system" { "system" } else { "user" }, "x"))
        .collect();
    let layout = chat()
        .render_with_system(system.as_ref().map(|_| "x"), &plain, sel & 2 != 0)
        .expect("renders");
    let controls = |ids: &[u32]| ids.iter().filter(|&&i| is_control(tok, i)).count();
    let want = controls(&tok.encode(&layout, true, true));
    assert_eq!(
        controls(&ids),
        want,
        "user text became control tokens: {:?}",
        r.text
    );
    for (_, range) in &r.contents {
        assert!(r.text.is_char_boundary(range.start) && r.text.is_char_boundary(range.end));
    }
}
