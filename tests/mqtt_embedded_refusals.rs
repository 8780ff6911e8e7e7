//! What a client sees, and what the daemon's log says, when the embedded broker gets more than
//! a request should hold or a CONNECT in the other MQTT version: `edgellm serve` as a real
//! process on its embedded broker, `mosquitto_pub` and `mosquitto_sub` as its clients.

mod common;

use common::mqtt::{Daemon, collect, subscribe_v311};
use serde_json::Value;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const DEVICE: &str = "test-dev";
/// `mqtt.max_payload` of these tests: small, so the requests over it are quick to send.
const MAX_PAYLOAD: usize = 16 << 10;
/// The broker's packet limit for it: twice `MAX_PAYLOAD`, plus 4096 for topic and properties.
const MAX_PACKET: usize = 2 * MAX_PAYLOAD + 4096;

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

/// The daemon's WARN lines that contain `needle`, waiting up to 20 s for one.
fn warnings_naming(d: &Daemon, needle: &str) -> Vec<String> {
    let pick = |log: &str| -> Vec<String> {
        log.lines()
            .filter(|l| l.contains("WARN") && l.contains(needle))
            .map(str::to_owned)
            .collect()
    };
    pick(&d.wait_log(Duration::from_secs(20), |log| !pick(log).is_empty()))
}

/// The numbers written in `line`.
fn numbers(line: &str) -> Vec<usize> {
    line.split(|c: char| !c.is_ascii_digit())
        .filter_map(|w| w.parse().ok())
        .collect()
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

#[test]
fn a_request_over_the_brokers_limit_is_named_in_the_daemons_log_with_its_size_and_the_limit() {
    let (port, _dir, d) = serve_embedded();
    let len = MAX_PACKET + 4000;
    publish_as(
        port,
        &["-V", "mqttv5"],
        "huge-sender",
        &request_of("huge-1", len),
    );
    let warned = warnings_naming(&d, "huge-sender");
    let line = warned
        .first()
        .unwrap_or_else(|| panic!("no WARN naming the client\n{}", d.log_text()));
    let n = numbers(line);
    assert!(n.contains(&MAX_PACKET), "the limit, {MAX_PACKET}: {line}");
    // The packet's size: the payload, with its topic and properties.
    assert!(
        n.iter().any(|&x| (len..len + 200).contains(&x)),
        "the packet's size, a little over {len}: {line}"
    );
    assert_eq!(warned.len(), 1, "one line for one refusal: {warned:?}");
}

#[test]
fn a_3_1_1_client_on_the_mqtt_5_port_is_told_in_the_log_which_port_to_use() {
    let (port, _dir, d) = serve_embedded();
    publish_as(port, &["-V", "mqttv311"], "old-client", b"{}");
    let v311 = (port + 1).to_string();
    let warned = warnings_naming(&d, "3.1.1");
    let line = warned
        .first()
        .unwrap_or_else(|| panic!("no WARN about the 3.1.1 client\n{}", d.log_text()));
    assert!(
        line.contains(&v311) && numbers(line).contains(&usize::from(port + 1)),
        "the 3.1.1 port, {v311}: {line}"
    );
}
