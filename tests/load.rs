//! A thousand requests over MQTT from twenty clients, with a serial port asking all the while,
//! against `edgellm serve` and a real Mosquitto (load and no loss): every request gets exactly
//! one final answer, `busy` comes only from a full queue, and the daemon's memory stays flat.
//!
//! Two rounds of 500: in the first the queue has room for every client's request at once, so
//! not one may be answered busy; in the second each client keeps three in flight against a
//! queue of 16, so many are, and each must still be answered (ok or busy), none lost.

mod common;

use common::json_of;
use common::mqtt::{Daemon, Mosquitto, model_arg};
use common::serial::{Pty, rss_kib};
use serde_json::Value;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const DEVICE: &str = "load";
const CLIENTS: usize = 20;
const PER_CLIENT: usize = 25;

fn count(v: &Value, key: &str) -> u64 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("no count {key}: {v}"))
}

/// Twenty `edgellm ask` load generators at once, each `repeat` requests with `inflight` in
/// flight; their JSON summaries.
fn round(port: u16, repeat: usize, inflight: usize) -> Vec<Value> {
    let broker = format!("127.0.0.1:{port}");
    let (n, c) = (repeat.to_string(), inflight.to_string());
    let clients: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let prompt = format!("Name a colour, client {i}.");
            let args = [
                "ask",
                "--broker",
                &broker,
                "--device",
                DEVICE,
                "--timeout",
                "300",
                "--repeat",
                &n,
                "--concurrency",
                &c,
                "--json",
                "-n",
                "4",
                &prompt,
            ];
            std::process::Command::new(env!("CARGO_BIN_EXE_edgellm"))
                .args(args)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("edgellm ask")
        })
        .collect();
    clients
        .into_iter()
        .map(|c| json_of(&c.wait_with_output().unwrap()))
        .collect()
}

/// Sums a count over the summaries.
fn total(s: &[Value], key: &str) -> u64 {
    s.iter().map(|v| count(v, key)).sum()
}

fn busy(s: &[Value]) -> u64 {
    s.iter()
        .map(|v| v["errors_by_code"]["busy"].as_u64().unwrap_or(0))
        .sum()
}

/// One line of the summaries for a failure message: each client's ok/busy/other.
fn brief(s: &[Value]) -> String {
    let one = |v: &Value| {
        let b = v["errors_by_code"]["busy"].as_u64().unwrap_or(0);
        format!(
            "{}/{}/{}",
            v["ok"],
            b,
            v["errors"].as_u64().unwrap_or(0).saturating_sub(b)
        )
    };
    format!(
        "ok/busy/other per client: {}",
        s.iter().map(one).collect::<Vec<_>>().join(" ")
    )
}

/// The largest p50 and p99 of `key` over the clients (ms).
fn worst(s: &[Value], key: &str) -> (f64, f64) {
    let p = |q: &str| {
        s.iter()
            .filter_map(|v| v[key][q].as_f64())
            .fold(0.0, f64::max)
    };
    (p("p50"), p("p99"))
}

#[test]
fn a_thousand_requests_from_twenty_clients_and_a_serial_port_lose_nothing() {
    let broker = Mosquitto::start();
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("edgellm.toml");
    // Room for every client's one request (and the port's) in round one.
    std::fs::write(&conf, "[limits]\nqueue_depth = 24\nper_source = 8\n").unwrap();
    let mut port = Pty::open();
    let m = model_arg(&common::model_path("q4_0"));
    let url = format!("127.0.0.1:{}", broker.port);
    let serial = format!("{}:115200:line", port.path);
    let d = Daemon::start(
        &[
            "--config",
            conf.to_str().unwrap(),
            "-m",
            &m,
            "--mqtt",
            &url,
            "--device",
            DEVICE,
            "--serial",
            &serial,
            "-c",
            "256",
            "-t",
            "2",
        ],
        &[],
    );
    let pid = d.child.id();

    // Warm-up, then the resident size every later sample is held to.
    let warm = round(broker.port, 3, 1);
    assert_eq!(total(&warm, "ok"), (CLIENTS * 3) as u64, "{}", brief(&warm));
    let rss_warm = rss_kib(pid);

    // The serial port asks, one request after the other, for as long as the rounds run.
    assert_eq!(
        port.ask("SET max_tokens=4", Duration::from_secs(30)),
        "OK max_tokens=4"
    );
    let stop = Arc::new(AtomicBool::new(false));
    let asker = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let (mut ok, mut busy, mut other) = (0u32, 0u32, Vec::new());
            let until = Instant::now() + Duration::from_secs(600);
            while !stop.load(Ordering::Relaxed) && Instant::now() < until {
                match port.ask("GEN Red, green and", Duration::from_secs(120)) {
                    l if l.starts_with("OK ") => ok += 1,
                    l if l.starts_with("ERR busy ") => busy += 1,
                    l => other.push(l),
                }
            }
            (ok, busy, other)
        })
    };

    // Round one: the queue never fills, so no request may be answered busy.
    let t0 = Instant::now();
    let one = round(broker.port, PER_CLIENT, 1);
    let one_s = t0.elapsed().as_secs_f64();
    let rss_one = rss_kib(pid);
    // Round two: 60 in flight against 16 places.
    let two = round_two_on_a_smaller_queue(&d, &conf, broker.port);
    let rss_two = rss_kib(pid);
    stop.store(true, Ordering::Relaxed);
    let (serial_ok, serial_busy, serial_other) = asker.join().unwrap();

    let sent = (CLIENTS * PER_CLIENT) as u64;
    for (name, s) in [("round one", &one), ("round two", &two)] {
        let (ok, errors) = (total(s, "ok"), total(s, "errors"));
        assert_eq!(total(s, "requests"), sent, "{name}: {}", brief(s));
        assert_eq!(
            ok + errors,
            sent,
            "{name}: a request without its answer: {}",
            brief(s)
        );
        assert_eq!(
            errors,
            busy(s),
            "{name}: busy is the only error: {}",
            brief(s)
        );
        assert_eq!(
            total(s, "timeouts") + total(s, "invalid"),
            0,
            "{name}: {}",
            brief(s)
        );
    }
    assert_eq!(
        busy(&one),
        0,
        "busy while the queue had room: {}",
        brief(&one)
    );
    assert!(
        busy(&two) > 0,
        "60 in flight against 16 places and no busy: {}",
        brief(&two)
    );
    assert!(serial_other.is_empty(), "serial: {serial_other:?}");
    assert!(serial_ok > 0, "the serial port was never answered");

    let (q50, q99) = worst(&one, "queue_ms");
    let tps: f64 = one.iter().filter_map(|v| v["aggregate_tps"].as_f64()).sum();
    eprintln!(
        "load: round one {sent} requests in {one_s:.1} s, worst client queue wait p50 {q50:.0} ms \
         p99 {q99:.0} ms, {tps:.0} tokens/s over the clients; round two {} ok, {} busy; serial \
         {serial_ok} ok, {serial_busy} busy; RSS {rss_warm} → {rss_one} → {rss_two} KiB",
        total(&two, "ok"),
        busy(&two),
    );
    for rss in [rss_one, rss_two] {
        let grown = rss as f64 / rss_warm as f64 - 1.0;
        assert!(
            grown.abs() <= 0.05,
            "RSS moved {:.1}% after warm-up ({rss_warm} → {rss} KiB)",
            grown * 100.0
        );
    }
}

/// Round two on a queue of 16: the limits reloaded (SIGHUP) from the file.
fn round_two_on_a_smaller_queue(d: &Daemon, conf: &std::path::Path, port: u16) -> Vec<Value> {
    std::fs::write(conf, "[limits]\nqueue_depth = 16\nper_source = 8\n").unwrap();
    let pid = nix::unistd::Pid::from_raw(d.child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP).unwrap();
    let log = d.wait_log(Duration::from_secs(30), |l| {
        l.contains("configuration reloaded")
    });
    assert!(log.contains("configuration reloaded"), "{log}");
    round(port, PER_CLIENT, 3)
}
