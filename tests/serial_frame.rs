//! The frame mode against the running daemon on a real pseudo-terminal: PING, a request and
//! its acknowledged answer equal to `edgellm run`, a repeat answered from the cache without a
//! second computation, a bad CRC, an overlong frame, a megabyte of noise, and answer formats
//! named by the request with their validity on END.

mod common;

use common::mqtt::{Daemon, model_arg};
use common::serial::{Pty, rss_kib, run_text};
use edgellm::serial::frame::codec::{self, Decoded, Decoder};
use edgellm::serial::frame::{
    FLAG_FORMAT, FLAG_HISTORY, FLAG_RAW, FLAG_RESET, FLAG_SESSION, REFUSAL_INDEX, kind, nak,
};
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(60);

fn model() -> String {
    model_arg(&common::model_path("q4_0"))
}

/// The master's end of the link.
struct Master {
    p: Pty,
    dec: Decoder,
    /// Bytes read but not yet fed to the decoder.
    pending: Vec<u8>,
}

impl Master {
    fn send(&mut self, seq: u8, k: u8, payload: &[u8]) {
        self.p.send(&codec::encode(seq, k, payload));
    }

    /// The next whole frame the daemon sends within `within`.
    fn frame(&mut self, within: Duration) -> (u8, u8, Vec<u8>) {
        let until = Instant::now() + within;
        loop {
            let n = self.dec.feed(&self.pending);
            self.pending.drain(..n);
            match self.dec.pop() {
                Some(Decoded::Frame { seq, kind, payload }) => {
                    return (seq, kind, payload.to_vec());
                }
                Some(other) => panic!("the daemon sent a bad frame: {other:?}"),
                None if self.pending.is_empty() => {
                    assert!(Instant::now() < until, "no frame within {within:?}");
                    let bytes = self.p.drain(Duration::from_millis(20));
                    self.pending.extend(bytes);
                }
                None => {}
            }
        }
    }

    /// Sends a raw-text request and collects its answer, acknowledging every frame.
    fn ask(&mut self, seq: u8, prompt: &str, max_tokens: u16) -> (String, Vec<u8>) {
        let mut p = vec![FLAG_RAW];
        p.extend_from_slice(&max_tokens.to_le_bytes());
        p.extend_from_slice(prompt.as_bytes());
        self.send(seq, kind::REQUEST, &p);
        assert_eq!(self.frame(T), (seq, kind::R_ACK, vec![]));
        self.answer(seq)
    }

    fn answer(&mut self, seq: u8) -> (String, Vec<u8>) {
        let mut text = String::new();
        loop {
            let (s, k, p) = self.frame(T);
            assert_eq!(s, seq);
            self.send(seq, kind::ACK, &p[..2]);
            match k {
                kind::DATA => text.push_str(std::str::from_utf8(&p[2..]).unwrap()),
                kind::END => return (text, p[2..].to_vec()),
                other => panic!("frame type {other:#x} in an answer: {p:?}"),
            }
        }
    }
}

fn daemon(p: &Pty) -> Daemon {
    daemon_with(p, &model(), &["-c", "256"])
}

/// The daemon in frame mode on `p`, running `m`, with `extra` arguments.
fn daemon_with(p: &Pty, m: &str, extra: &[&str]) -> Daemon {
    let spec = format!("{}:115200:frame", p.path);
    let mut args = vec!["-m", m, "--mqtt", "off", "-t", "2", "--serial", &spec];
    args.extend_from_slice(extra);
    let d = Daemon::start(&args, &[("EDGELLM_LOG", "info")]);
    let log = d.wait_log(T, |l| l.contains("serial port open"));
    assert!(log.contains("serial port open"), "port not open: {log}");
    d
}

#[test]
fn frames_on_a_pty_answer_acknowledge_repeat_from_cache_and_survive_noise() {
    let p = Pty::open();
    let mut d = daemon(&p);
    let mut m = Master {
        p,
        dec: Decoder::new(codec::MAX_PAYLOAD),
        pending: Vec::new(),
    };
    m.send(1, kind::PING, b"hi");
    assert_eq!(m.frame(T), (1, kind::PONG, b"hi".to_vec()));

    // A request byte by byte; its answer is the CLI's for the same greedy prompt.
    let prompt = "The capital of France is";
    let mut p = vec![FLAG_RAW, 12, 0];
    p.extend_from_slice(prompt.as_bytes());
    for b in codec::encode(2, kind::REQUEST, &p) {
        m.p.send(&[b]);
    }
    assert_eq!(m.frame(T), (2, kind::R_ACK, vec![]));
    let (text, end) = m.answer(2);
    assert_eq!(text, run_text(prompt, 12, 256));
    assert_eq!(end[0], 1, "finish reason length");
    assert_eq!(u32::from_le_bytes(end[5..9].try_into().unwrap()), 12);

    // The same request again: the same answer, from the cache, computed once.
    let answered = |d: &Daemon| d.log_text().matches("answered").count();
    let before = answered(&d);
    m.send(2, kind::REQUEST, &p);
    assert_eq!(m.frame(T), (2, kind::R_ACK, vec![]));
    assert_eq!(m.answer(2).0, text);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(answered(&d), before, "the repeat was computed again");

    // A bad CRC, then an overlong frame: NAKs, and the link goes on.
    let mut bad = codec::encode(3, kind::PING, b"x").to_vec();
    bad[5] ^= 1;
    m.p.send(&bad);
    assert_eq!(m.frame(T), (3, kind::R_NAK, vec![nak::CRC]));
    m.p.send(&[codec::START, 0xFF, 0x0F, 4, kind::REQUEST]);
    assert_eq!(m.frame(T), (4, kind::R_NAK, vec![nak::TOO_LONG]));
    m.send(5, kind::STATUS, b"");
    let (_, k, s) = m.frame(T);
    assert_eq!(k, kind::STATUS_REPLY);
    assert_eq!(
        u32::from_le_bytes(s[28..32].try_into().unwrap()),
        1,
        "one CRC error"
    );

    // A megabyte of noise: memory flat, the port answering.
    let pid = d.child.id();
    let rss = rss_kib(pid);
    let mut noise = common::serial::Noise(0x9e37_79b9_7f4a_7c15);
    let mut chunk = vec![0u8; 16 << 10];
    for _ in 0..64 {
        noise.fill(&mut chunk, &[], 0);
        m.p.send(&chunk);
        m.p.drain(Duration::from_millis(5));
    }
    // Whatever half frame the noise left is given up after the gap.
    std::thread::sleep(Duration::from_millis(700));
    m.p.drain(Duration::from_millis(100));
    m.dec.clear();
    m.pending.clear();
    m.send(6, kind::PING, b"alive");
    assert_eq!(m.frame(T), (6, kind::PONG, b"alive".to_vec()));
    let after = rss_kib(pid);
    assert!(after < rss + 2048, "memory grew from {rss} to {after} KiB");
    let (again, _) = m.ask(7, prompt, 12);
    assert_eq!(again, text);
    assert!(d.is_running());
    d.terminate(Duration::from_secs(20));
}

#[test]
fn a_session_over_frames_remembers_turn_one_in_turn_three_and_reset_forgets_it() {
    let p = Pty::open();
    let state = tempfile::tempdir().unwrap();
    let sd = state.path().to_str().unwrap();
    let qwen = model_arg(&common::model_path(common::QWEN_05B));
    let _d = daemon_with(&p, &qwen, &["-c", "1024", "--state-dir", sd]);
    let mut m = Master {
        p,
        dec: Decoder::new(codec::MAX_PAYLOAD),
        pending: Vec::new(),
    };
    // A request naming session `rs485-a` (bit 1: its length and name before the prompt).
    let mut seq = 0u8;
    let mut turn = |m: &mut Master, flags: u8, text: &str| {
        seq += 1;
        let mut p = vec![flags | FLAG_SESSION, 16, 0, 7];
        p.extend_from_slice(b"rs485-a");
        p.extend_from_slice(text.as_bytes());
        m.send(seq, kind::REQUEST, &p);
        assert_eq!(m.frame(T), (seq, kind::R_ACK, vec![]));
        m.answer(seq).0
    };
    let fact = "My name is Ana and I look after pump seven. Please remember my name.";
    let question = "What is my name? Answer with the name only.";
    turn(&mut m, 0, fact);
    turn(&mut m, 0, "Which planet is the largest?");
    let third = turn(&mut m, 0, question);
    assert!(third.contains("Ana"), "turn 3 forgot turn 1: {third}");
    let history = turn(&mut m, FLAG_HISTORY, "");
    assert!(
        history.starts_with(&format!("user: {fact}\n\nassistant: ")),
        "{history}"
    );
    assert_eq!(turn(&mut m, FLAG_RESET, ""), "");
    let after = turn(&mut m, 0, question);
    assert!(!after.contains("Ana"), "reset kept the name: {after}");
}

const ALARM: &str = "Alarm: spindle bearing temperature 95 C and rising. Classify it.";
const OPTIONS: [&str; 4] = ["low", "medium", "high", "critical"];

/// A chat REQUEST payload naming format `name` (bit 4: its length and name before the prompt).
fn format_request(name: &[u8], max_tokens: u16, prompt: &str) -> Vec<u8> {
    let mut p = vec![FLAG_FORMAT];
    p.extend_from_slice(&max_tokens.to_le_bytes());
    p.push(name.len() as u8);
    p.extend_from_slice(name);
    p.extend_from_slice(prompt.as_bytes());
    p
}

#[test]
fn a_request_naming_a_format_gets_its_shape_and_end_says_whether_it_has_it() {
    let dir = tempfile::tempdir().unwrap();
    let schema = include_str!("../bench/formats/alarm.json");
    std::fs::write(dir.path().join("alarm.json"), schema).unwrap();
    let conf = dir.path().join("edgellm.toml");
    std::fs::write(
        &conf,
        "[schemas]\nalarm = \"alarm.json\"\n\n\
         [choices]\nseverity = [\"low\", \"medium\", \"high\", \"critical\"]\n",
    )
    .unwrap();
    let p = Pty::open();
    let conf = conf.to_str().unwrap();
    let d = daemon_with(&p, &model(), &["-c", "512", "--config", conf]);
    let log = d.wait_log(T, |l| l.contains("named answer formats ready"));
    assert!(log.contains("formats=2"), "{log}");
    let mut m = Master {
        p,
        dec: Decoder::new(codec::MAX_PAYLOAD),
        pending: Vec::new(),
    };
    let ask = |m: &mut Master, seq: u8, payload: &[u8]| {
        m.send(seq, kind::REQUEST, payload);
        assert_eq!(m.frame(T), (seq, kind::R_ACK, vec![]));
        m.answer(seq)
    };
    // END: finish (1), prompt tokens (4), generated tokens (4), validity (1).
    let (choice, end) = ask(&mut m, 1, &format_request(b"severity", 16, ALARM));
    assert!(OPTIONS.contains(&choice.as_str()), "{choice:?}");
    assert_eq!(
        (end.len(), end[0], end[9]),
        (10, 0, 1),
        "eog, valid: {end:?}"
    );

    let (json, end) = ask(&mut m, 2, &format_request(b"alarm", 100, ALARM));
    assert_eq!((end[0], end[9]), (0, 1), "eog, valid: {json}");
    let v: serde_json::Value = serde_json::from_str(&json).expect("the answer is JSON");
    assert!(
        v["severity"].as_i64().is_some_and(|s| (0..=3).contains(&s))
            && v["stop_line"].is_boolean()
            && ["bearing", "belt", "sensor", "other"].contains(&v["reason"].as_str().unwrap()),
        "{v}"
    );

    // Cut by max_tokens: finish length, and END says the shape was not reached.
    let (cut, end) = ask(&mut m, 3, &format_request(b"alarm", 3, ALARM));
    assert_eq!((end[0], end[9]), (1, 2), "length, invalid: {cut:?}");

    // No format asked: validity 0, and the format of the request before does not stick.
    let mut plain = vec![0, 4, 0];
    plain.extend_from_slice(ALARM.as_bytes());
    let (_, end) = ask(&mut m, 4, &plain);
    assert_eq!(end[9], 0, "{end:?}");

    // A name the configuration lacks: taken, then the service's refusal ends the answer.
    m.send(5, kind::REQUEST, &format_request(b"nope", 16, ALARM));
    assert_eq!(m.frame(T), (5, kind::R_ACK, vec![]));
    let (seq, k, e) = m.frame(T);
    assert_eq!((seq, k, &e[..3]), (5, kind::ERROR, &[0, 0, 1][..]), "{e:?}");
    let message = String::from_utf8_lossy(&e[3..]);
    assert!(message.contains("nope"), "{message}");
    m.send(5, kind::ACK, &e[..2]);

    // A malformed format field: refused at once, never taken.
    for (seq, bad) in [
        (6, format_request(b"alarm.json", 16, ALARM)),
        (7, vec![FLAG_FORMAT, 16, 0, 200, b'a']),
    ] {
        m.send(seq, kind::REQUEST, &bad);
        let (s, k, e) = m.frame(T);
        assert_eq!((s, k), (seq, kind::ERROR));
        assert_eq!(u16::from_le_bytes([e[0], e[1]]), REFUSAL_INDEX);
        assert_eq!(e[2], 1, "bad_request: {}", String::from_utf8_lossy(&e[3..]));
    }
    // And the port answers on.
    let (again, end) = ask(&mut m, 8, &format_request(b"severity", 16, ALARM));
    assert_eq!((again, end[9]), (choice, 1));
}
