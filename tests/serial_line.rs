//! The line protocol against the running daemon on a real pseudo-terminal: every command and
//! error, byte-by-byte and burst input, a megabyte of garbage, answers equal to `edgellm run`.

mod common;

use common::mqtt::{Daemon, model_arg};
use common::serial::{Pty, rss_kib, run_text, unescape};
use std::time::Duration;

const T: Duration = Duration::from_secs(60);

fn model() -> String {
    model_arg(&common::model_path("q4_0"))
}

/// The daemon serving `ptys` in line mode with MQTT off, once every port is open.
fn daemon(ptys: &[&Pty], extra: &[&str]) -> Daemon {
    let m = model();
    let specs: Vec<String> = ptys
        .iter()
        .map(|p| format!("{}:115200:line", p.path))
        .collect();
    let mut args = vec!["-m", &m, "--mqtt", "off", "-c", "256", "-t", "2"];
    for s in &specs {
        args.extend(["--serial", s]);
    }
    args.extend(extra);
    let d = Daemon::start(&args, &[("EDGELLM_LOG", "info")]);
    let log = d.wait_log(T, |l| l.matches("serial port open").count() >= ptys.len());
    assert!(
        log.matches("serial port open").count() >= ptys.len(),
        "ports not open: {log}"
    );
    d
}

#[test]
fn every_command_and_error_of_the_line_mode_on_a_pty() {
    let mut p = Pty::open();
    let state = tempfile::tempdir().unwrap();
    let sd = state.path().to_str().unwrap().to_owned();
    let mut d = daemon(&[&p], &["--state-dir", &sd]);

    assert_eq!(p.ask("PING", T), "OK PONG");
    assert!(p.ask("HELP", T).starts_with("OK PING | GEN"));
    let s = p.ask("STATUS", T);
    assert!(
        s.starts_with("OK state=online model=") && s.contains(" this_port=idle"),
        "{s}"
    );

    // GEN, sent one byte at a time, answers what `edgellm run` answers for the raw prompt.
    assert_eq!(p.ask("SET max_tokens=12", T), "OK max_tokens=12");
    for b in b"GEN The capital of France is\r\n" {
        p.send(&[*b]);
    }
    let got = p.line(T).expect("an answer");
    let text = got.strip_prefix("OK ").unwrap_or_else(|| panic!("{got}"));
    assert_eq!(
        unescape(text),
        run_text("The capital of France is", 12, 256)
    );

    // Streamed: DATA lines whose text joins to the same answer, then END.
    assert_eq!(p.ask("SET stream=on", T), "OK stream=on");
    p.send(b"GEN The capital of France is\n");
    let mut joined = String::new();
    let end = loop {
        let l = p.line(T).expect("a DATA or END line");
        match l.strip_prefix("DATA ") {
            Some(t) => joined.push_str(&unescape(t)),
            None => break l,
        }
    };
    assert_eq!(joined, run_text("The capital of France is", 12, 256));
    let f: Vec<&str> = end.split(' ').collect();
    assert_eq!((f[0], f[1], f[3]), ("END", "length", "12"), "{end}");
    assert!(f[2].parse::<usize>().unwrap() > 0);
    assert_eq!(p.ask("SET stream=off", T), "OK stream=off");

    // A named session is kept in the state directory; RESET deletes it.
    let a = p.ask("CHAT session=pump-3 Hello", T);
    assert!(a.starts_with("OK "), "{a}");
    let file = state.path().join("sessions/pump-3.kv");
    assert!(file.exists(), "the session was saved");
    assert_eq!(p.ask("RESET pump-3", T), "OK RESET pump-3");
    assert!(!file.exists(), "RESET deleted the session's file");

    // CANCEL stops a running answer; a second request meanwhile is busy.
    assert_eq!(p.ask("SET max_tokens=200", T), "OK max_tokens=200");
    p.send(b"GEN Write a long story about a robot\r\n");
    let busy = p.ask("GEN another", T);
    assert!(busy.starts_with("ERR busy "), "{busy}");
    assert_eq!(p.ask("CANCEL", T), "OK CANCELLING");
    // Mid-answer or, when the cancel came first, before the worker took it: both cancelled.
    let c = p.line(T).unwrap();
    assert!(c.starts_with("ERR cancelled "), "{c}");
    assert!(p.ask("CANCEL", T).starts_with("ERR idle "));

    // Errors: unknown command, invalid UTF-8, wrong and right checksums.
    assert!(p.ask("FLY", T).starts_with("ERR unknown_command FLY"));
    p.send(b"GEN \xc3\x28\r\n");
    assert_eq!(
        p.line(T).unwrap(),
        "ERR bad_utf8 the line is not valid UTF-8"
    );
    assert!(
        p.ask("PING*00", T)
            .starts_with("ERR checksum line checksum is 00")
    );
    let x = b"PING".iter().fold(0u8, |a, b| a ^ b);
    let want = format!("OK PONG*{:02X}", b"OK PONG".iter().fold(0u8, |a, b| a ^ b));
    assert_eq!(p.ask(&format!("PING*{x:02X}"), T), want);
    let s = p.ask("STATUS", T);
    assert!(
        s.contains(" port_bad_input=2 port_checksum_errors=1 "),
        "{s}"
    );

    // A line over the limit (16 KiB of prompt + 96) is refused once, whole; then all is well.
    let long = format!("GEN {}\r\n", "x".repeat(20_000));
    p.send(long.as_bytes());
    assert!(
        p.line(T)
            .unwrap()
            .starts_with("ERR too_long line longer than")
    );
    assert_eq!(p.ask("PING", T), "OK PONG");
    assert!(d.is_running());
    d.terminate(Duration::from_secs(20));
}

#[test]
fn a_megabyte_of_random_bytes_leaves_memory_flat_and_the_port_answering() {
    let mut p = Pty::open();
    let d = daemon(&[&p], &[]);
    assert_eq!(p.ask("PING", T), "OK PONG");
    let pid = d.child.id();
    let before = rss_kib(pid);
    let mut noise = common::serial::Noise(0x9e37_79b9_7f4a_7c15);
    let mut chunk = vec![0u8; 16 << 10];
    for _ in 0..64 {
        // No line ends: one endless line, the worst case for the buffer. (Random lines
        // would start requests; the unit test of the core covers those.)
        noise.fill(&mut chunk, b"\r\n", b'.');
        p.send(&chunk);
        // What the daemon answers must be read, or the pty fills and writes wait.
        p.drain(Duration::from_millis(5));
    }
    p.send(b"\r\n");
    let l = p.line(T).unwrap();
    assert!(l.starts_with("ERR too_long"), "{l}");
    assert_eq!(p.ask("PING", T), "OK PONG");
    let after = rss_kib(pid);
    eprintln!("RSS {before} -> {after} KiB");
    // Far less than the megabyte sent: a buffer that grew with it would fail this.
    assert!(
        after < before + 512,
        "RSS grew from {before} to {after} KiB over a megabyte of garbage"
    );
}
