//! What a client sees when the embedded broker gets more than a request should hold:
//! `edgellm serve` as a real process on its embedded broker, `mosquitto_pub` and
//! `mosquitto_sub` as its clients.

mod common;

use common::mqtt::{Daemon, collect, subscribe_v311};
use serde_json::Value;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const DEVICE: &str = "test-dev";
/// `mqtt.max_payload` of these tests: small, so the requests over it are quick to send.
const MAX_PAYLOAD: usize = 16 << 10;

/// The daemon on its embedded broker: MQTT 5 on the port returned, 3.1.1 on the next.
fn serve_embedded() -> (u16, tempfile::TempDir, Daemon) {
    let port = common::mqtt::free_ports(2);
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("edgellm.toml");
    std::fs::write(
        &conf,
        format!(
            "[mqtt]\nbroker = \"embedded\"\nembedded_port = {port}\ndevice = \"{DEVICE}\"\n\
             max_payload = \"16K\"\n[model]\nctx = 256\nthreads = 1\n"
        ),
    )
    .unwrap();
    let m = common::model_path("q4_0");
    let d = Daemon::start(
        &[
            "--config",
            conf.to_str().unwrap(),
            "--model",
            m.to_str().unwrap(),
        ],
        &[],
    );
    (port, dir, d)
}

/// `mosquitto_pub OPTS -i CLIENT` of `payload` to this device's request topic, QoS 1, given
/// 10 s: a client whose connection the broker closes may report it or try again, so neither
/// its exit status nor its end is asserted.
fn publish_as(port: u16, opts: &[&str], client: &str, payload: &[u8]) {
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), payload).unwrap();
    let mut child = Command::new("mosquitto_pub")
        .args(opts)
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-i", client])
        .args(["-t", &format!("edgellm/{DEVICE}/request"), "-q", "1", "-f"])
        .arg(file.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("mosquitto_pub (Debian package mosquitto-clients)");
    let until = Instant::now() + Duration::from_secs(10);
    while child.try_wait().unwrap().is_none() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// A request of `len` bytes in all: JSON with an id, a prompt of `x`s.
fn request_of(id: &str, len: usize) -> Vec<u8> {
    let head = format!(r#"{{"id":"{id}","prompt":""#);
    let tail = r#""}"#;
    let mut r = head.into_bytes();
    r.resize(len - tail.len(), b'x');
    r.extend_from_slice(tail.as_bytes());
    assert_eq!(r.len(), len);
    r
}

#[test]
fn a_request_of_twice_max_payload_reaches_the_daemon_and_is_answered_too_large() {
    let (port, _dir, d) = serve_embedded();
    // Over MQTT 5 without a response topic, so the answer goes to response/{id}; heard on the
    // 3.1.1 port, as both listeners share one broker.
    let sub = subscribe_v311(port + 1, &format!("edgellm/{DEVICE}/response/big-1"), 1, 60);
    publish_as(
        port,
        &["-V", "mqttv5"],
        "big-sender",
        &request_of("big-1", 2 * MAX_PAYLOAD),
    );
    let replies = collect(sub);
    let (_, body) = replies
        .first()
        .unwrap_or_else(|| panic!("no reply to a request of 2 × max_payload\n{}", d.log_text()));
    let v: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body:?}"));
    assert_eq!(v["error"]["code"], "too_large", "{v}");
    assert_eq!(
        (v["id"].as_str(), v["done"].as_bool()),
        (Some("big-1"), Some(true)),
        "{v}"
    );
}
