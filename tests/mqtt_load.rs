//! `edgellm ask --repeat N --concurrency C`, the load generator, against `edgellm serve` as a
//! real process and a real Mosquitto: its summary counts what the daemon answered.

mod common;

use common::json_of;
use common::mqtt::{Daemon, Mosquitto};
use serde_json::Value;

const DEVICE: &str = "load-dev";

/// `edgellm serve` on `port`; `limits` (TOML lines) go to a `[limits]` section of a config
/// file, since the queue's bounds have no flags.
fn serve(port: u16, limits: &str, dir: &std::path::Path) -> Daemon {
    let conf = dir.join("edgellm.toml");
    std::fs::write(&conf, format!("[limits]\n{limits}\n")).unwrap();
    let broker = format!("127.0.0.1:{port}");
    let m = common::model_path("q4_0").to_str().unwrap().to_owned();
    Daemon::start(
        &[
            "--config",
            conf.to_str().unwrap(),
            "--model",
            &m,
            "--mqtt",
            &broker,
            "--device",
            DEVICE,
            "--ctx",
            "256",
            "-t",
            "1",
        ],
        &[],
    )
}

/// The load generator's JSON summary.
fn load(port: u16, repeat: &str, concurrency: &str) -> Value {
    json_of(&common::mqtt::ask(
        port,
        DEVICE,
        &[
            "--repeat",
            repeat,
            "--concurrency",
            concurrency,
            "--json",
            "-n",
            "8",
            "Name a colour.",
        ],
    ))
}

fn count(v: &Value, key: &str) -> u64 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("no count {key}: {v}"))
}

#[test]
fn a_load_of_six_requests_three_at_a_time_is_answered_whole_and_timed() {
    let broker = Mosquitto::start();
    let dir = tempfile::tempdir().unwrap();
    let _d = serve(broker.port, "", dir.path());
    let s = load(broker.port, "6", "3");
    assert_eq!(
        (count(&s, "requests"), count(&s, "ok"), count(&s, "errors")),
        (6, 6, 0),
        "{s}"
    );
    assert_eq!((count(&s, "timeouts"), count(&s, "invalid")), (0, 0), "{s}");
    let finished: u64 = s["finish_reasons"]
        .as_object()
        .unwrap()
        .values()
        .filter_map(Value::as_u64)
        .sum();
    assert_eq!(finished, 6, "{s}");
    for key in ["queue_ms", "client_ttfc_ms", "ttft_ms", "overhead_ms"] {
        let spread = &s[key];
        let (p50, p99) = (spread["p50"].as_f64(), spread["p99"].as_f64());
        assert_eq!(spread["n"], 6, "{key}: {s}");
        let (Some(p50), Some(p99)) = (p50, p99) else {
            panic!("{key} has no percentiles: {s}")
        };
        assert!(0.0 <= p50 && p50 <= p99, "{key}: {s}");
    }
    // The client's time to first chunk holds the daemon's own: the overhead is below it.
    assert!(s["ttft_ms"]["p50"].as_f64() > Some(0.0), "{s}");
    assert!(
        s["overhead_ms"]["p50"].as_f64() < s["client_ttfc_ms"]["p50"].as_f64(),
        "{s}"
    );
    let tokens = count(&s, "completion_tokens");
    assert!(tokens > 0 && tokens <= 6 * 8, "{s}");
    assert!(s["aggregate_tps"].as_f64() > Some(0.0), "{s}");
    assert!(s["mean_decode_tps"].as_f64() > Some(0.0), "{s}");
}

#[test]
fn a_load_over_a_small_queue_counts_the_busy_answers_as_errors_by_code() {
    let broker = Mosquitto::start();
    let dir = tempfile::tempdir().unwrap();
    // One request waiting at most beside the one being answered: of six sent at once, at
    // least four are answered busy.
    let _d = serve(broker.port, "queue_depth = 1\nper_source = 1", dir.path());
    let n = 12;
    let s = load(broker.port, &n.to_string(), "6");
    let (ok, errors) = (count(&s, "ok"), count(&s, "errors"));
    let busy = s["errors_by_code"]["busy"].as_u64().unwrap_or(0);
    assert!(busy >= 4, "{s}");
    assert_eq!(errors, busy, "busy is the only error: {s}");
    assert!(ok >= 1, "{s}");
    assert_eq!(ok + errors, n, "{s}");
    assert_eq!((count(&s, "timeouts"), count(&s, "invalid")), (0, 0), "{s}");
    assert_eq!(
        s["queue_ms"]["n"], ok,
        "percentiles are over the ok answers: {s}"
    );
}
