//! Nothing lost, nothing twice, with real parts: the daemon killed (SIGKILL) while requests
//! are pending and started again, the Mosquitto broker stopped mid-answer and started again,
//! a fleet of three daemons sharing one group, and systemd's watchdog when the engine hangs.

mod common;

use common::mqtt::{Daemon, publish_lines};
use common::recovery::{Broker, Collector};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

const DEVICE: &str = "rec-dev";

fn model() -> String {
    common::model_path("q4_0").to_str().unwrap().to_owned()
}

/// Requests with these ids; greedy, so the answer to one is the same each time it is computed.
fn requests(ids: &[String], tokens: usize) -> Vec<String> {
    ids.iter()
        .map(|id| {
            let q = if tokens > 8 {
                "Count from 1 to 40, separated by commas."
            } else {
                "Name a colour."
            };
            format!(r#"{{"id":"{id}","prompt":"{q} ({id})","max_tokens":{tokens}}}"#)
        })
        .collect()
}

fn ids(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}{i}")).collect()
}

fn serve(port: u16, state: &Path, env: &[(&str, &str)]) -> Daemon {
    common::recovery::serve(port, DEVICE, state, "", env)
}

/// The daemon answering one request at a time: a request that arrives while another is
/// answered waits in the queue instead of joining the batch.
fn serve_one_at_a_time(port: u16, state: &Path, env: &[(&str, &str)]) -> Daemon {
    common::recovery::serve(port, DEVICE, state, "[model]\nmax_batch = 1\n", env)
}

/// Every id has exactly one final message, and it is an answer (not an error).
fn assert_once(finals: &BTreeMap<String, Vec<(String, Value)>>, ids: &[String], log: &str) {
    for id in ids {
        let f = &finals[id];
        assert_eq!(f.len(), 1, "{id} answered {} times: {f:?}\n{log}", f.len());
        assert!(f[0].1["text"].is_string(), "{id}: {:?}", f[0].1);
    }
}

#[test]
fn the_daemon_killed_with_requests_pending_answers_each_exactly_once_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(dir.path(), false);
    let state = dir.path().join("state");
    let answers = Collector::start(broker.port, &format!("edgellm/{DEVICE}/response/+"), None);
    // SIGKILL at the worst moment: k2's answer is computed and journaled, not yet published or
    // acknowledged; k3..k5 wait in the queue, unacknowledged.
    let mut first = serve(
        broker.port,
        &state,
        &[("EDGELLM_TEST_HOOK", "kill_after_journal=k2")],
    );
    let all = ids("k", 6);
    publish_lines(
        broker.port,
        &format!("edgellm/{DEVICE}/request"),
        &requests(&all, 6),
    );
    let until = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = first.child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < until, "no kill\n{}", first.log_text());
        std::thread::sleep(Duration::from_millis(20));
    };
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(9), "{}", first.log_text());
    let before = answers.finals();
    assert!(
        !before.contains_key("k2") && before.contains_key("k1"),
        "k0, k1 answered before the kill, k2 not: {before:?}"
    );

    let second = serve(broker.port, &state, &[]);
    let finals = answers.wait_all(&all, Duration::from_secs(60), &|| second.log_text());
    let log = second.log_text();
    assert_once(&finals, &all, &log);
    // k2 came from the journal: sent, not computed again.
    assert!(
        log.contains("its stored answer is sent again"),
        "k2 not answered from the journal:\n{log}"
    );
    // Computed only what was never answered: k3, k4, k5.
    let v = wait_status(broker.port, 3, &log);
    assert_eq!(v["counters"]["accepted"], 3, "{v}");
}

/// The device's retained status once it counts `answered` answers.
fn wait_status(port: u16, answered: usize, log: &str) -> Value {
    common::recovery::wait_status(port, DEVICE, answered, log)
}

#[test]
fn the_broker_stopped_mid_answer_and_started_again_loses_nothing_and_doubles_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut broker = Broker::start(dir.path(), true);
    let state = dir.path().join("state");
    let answers = Collector::start(
        broker.port,
        &format!("edgellm/{DEVICE}/response/+"),
        Some("recovery-collector"),
    );
    // One at a time, so that requests wait in the queue while the first is answered.
    let d = serve_one_at_a_time(broker.port, &state, &[]);
    let all = ids("b", 5);
    let topic = format!("edgellm/{DEVICE}/request");
    publish_lines(broker.port, &topic, &requests(&all[..4], 48));
    // The broker goes away once the first answer is out: the others are in the daemon's queue
    // or being answered, unacknowledged.
    let until = Instant::now() + Duration::from_secs(60);
    while answers.finals().is_empty() {
        assert!(Instant::now() < until, "no first answer\n{}", d.log_text());
        std::thread::sleep(Duration::from_millis(20));
    }
    // Back soon enough that requests are still waiting in the daemon's queue when the broker
    // delivers them again.
    broker.down();
    std::thread::sleep(Duration::from_millis(200));
    broker.up();
    // One more, published once the broker is back (the daemon may still be reconnecting).
    publish_lines(broker.port, &topic, &requests(&all[4..], 6));
    let finals = answers.wait_all(&all, Duration::from_secs(90), &|| d.log_text());
    let log = d.log_text();
    assert!(
        log.contains("MQTT connection"),
        "no disconnection seen:\n{log}"
    );
    assert!(
        log.contains("redelivered request still being answered"),
        "no redelivery of a request still queued:\n{log}"
    );
    // An answer published just as the broker went down may reach the collector twice (QoS 1
    // is at least once); it is then the same answer, byte for byte, never a second one.
    for id in &all {
        let f = &finals[id];
        assert!(f.iter().all(|x| x.1 == f[0].1), "{id}: two answers {f:?}");
        assert!(f[0].1["text"].is_string(), "{id}: {:?}", f[0].1);
    }
    // Computed once each: the status counts every accepted request once.
    let v = wait_status(broker.port, all.len(), &log);
    assert_eq!(v["counters"]["accepted"], all.len(), "{v}");
}

/// The last status the collector (subscribed to the device's topics) has seen.
fn last_status(c: &Collector) -> Option<Value> {
    let got = c.got.lock().unwrap();
    got.iter()
        .rev()
        .find(|(t, _)| t.ends_with("/status"))
        .map(|(_, v)| v.clone())
}

/// A broker restarted without persistence forgets the daemon's session, and gives packet ids
/// out afresh. The answer to a request of the old session must not acknowledge its old id on
/// the new connection: that id is now another request's, which the broker would then count as
/// answered, and never deliver again if the daemon died before answering it.
#[test]
fn an_answer_from_a_session_the_broker_forgot_does_not_acknowledge_a_newer_request() {
    let dir = tempfile::tempdir().unwrap();
    let mut broker = Broker::start(dir.path(), false);
    let state = dir.path().join("state");
    // Every answer waits 2 s before it starts: s0 is still on the worker when the broker
    // comes back, and s1 still waiting for its turn when s0's answer goes out (one at a time:
    // in a batch s1 would start, and stall, beside s0).
    let d = serve_one_at_a_time(
        broker.port,
        &state,
        &[("EDGELLM_TEST_HOOK", "stall_ms=2000")],
    );
    let topic = format!("edgellm/{DEVICE}/request");
    let until = Instant::now() + Duration::from_secs(30);
    let wait = |what: &str, done: &dyn Fn() -> bool| {
        while !done() {
            assert!(Instant::now() < until, "{what}\n{}", d.log_text());
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    let watch = Collector::start(broker.port, &format!("edgellm/{DEVICE}/status"), None);
    publish_lines(broker.port, &topic, &requests(&ids("s", 1), 4));
    wait("s0 never ran", &|| {
        last_status(&watch).is_some_and(|v| v["running"] == "s0")
    });
    drop(watch);
    broker.down();
    broker.up();
    // The daemon publishes its status again once it has subscribed on the new session.
    let answers = Collector::start(broker.port, &format!("edgellm/{DEVICE}/#"), None);
    wait("no status after the restart", &|| {
        last_status(&answers).is_some()
    });
    // The new session's first delivery: the same packet id as s0's in the old one.
    publish_lines(broker.port, &topic, &requests(&["s1".to_owned()], 4));
    wait("s0 not answered", &|| answers.finals().contains_key("s0"));
    // s1 is stalled on the worker now, unanswered: the daemon dies.
    let mut d = d;
    let _ = d.child.kill();
    let _ = d.child.wait();
    let first_log = d.log_text();
    assert!(
        !answers.finals().contains_key("s1"),
        "s1 was answered before the kill: the test did not set up what it means to\n{first_log}"
    );
    assert!(
        first_log.contains("nothing to acknowledge"),
        "s0's answer did not see that its session was gone:\n{first_log}"
    );
    // s1 was never acknowledged, so the broker delivers it again to the restarted daemon.
    let second = serve(broker.port, &state, &[]);
    let all = ["s0".to_owned(), "s1".to_owned()];
    let finals = answers.wait_all(&all, Duration::from_secs(30), &|| {
        format!(
            "{first_log}\n--- after the restart ---\n{}",
            second.log_text()
        )
    });
    assert_once(&finals, &all, &second.log_text());
}

#[test]
fn a_fleet_of_three_shares_sixty_requests_each_answered_once_by_one_of_them() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(dir.path(), false);
    let m = model();
    let b = format!("127.0.0.1:{}", broker.port);
    let answers = Collector::start(broker.port, "edgellm/+/response/+", None);
    let daemons: Vec<Daemon> = (0..3)
        .map(|i| {
            let conf = dir.path().join(format!("fleet{i}.toml"));
            std::fs::write(
                &conf,
                format!(
                    "[mqtt]\nbroker = \"{b}\"\ndevice = \"fleet-{i}\"\nfleet_group = \"line3\"\n\
                     [model]\npath = \"{m}\"\nctx = 128\nthreads = 1\n\
                     [limits]\nqueue_depth = 64\nper_source = 64\n"
                ),
            )
            .unwrap();
            Daemon::start(&["--config", conf.to_str().unwrap()], &[])
        })
        .collect();
    // The fleet connections subscribe just after each device's own.
    std::thread::sleep(Duration::from_millis(500));
    let all = ids("f", 60);
    let reqs: Vec<String> = all
        .iter()
        .map(|id| format!(r#"{{"id":"{id}","prompt":"Hi","max_tokens":1}}"#))
        .collect();
    publish_lines(broker.port, "edgellm/fleet/request", &reqs);
    let log = || {
        daemons
            .iter()
            .map(Daemon::log_text)
            .collect::<Vec<_>>()
            .join("\n---\n")
    };
    let finals = answers.wait_all(&all, Duration::from_secs(120), &log);
    assert_once(&finals, &all, &log());
    // Each answer is on the response topic of the device that took it.
    let served: BTreeSet<String> = finals
        .values()
        .map(|f| f[0].0.split('/').nth(1).unwrap().to_owned())
        .collect();
    assert_eq!(
        served,
        BTreeSet::from(["fleet-0".into(), "fleet-1".into(), "fleet-2".into()]),
        "every daemon served some"
    );
    // A fleet request that names a session is refused: its KV cache lives on one device.
    publish_lines(
        broker.port,
        "edgellm/fleet/request",
        &[r#"{"id":"fs","prompt":"Hi","session":"s1"}"#.to_owned()],
    );
    let f = answers.wait_all(&["fs".to_owned()], Duration::from_secs(30), &log);
    assert_eq!(
        f["fs"][0].1["error"]["code"], "bad_request",
        "{:?}",
        f["fs"]
    );
}

#[test]
fn watchdog_pings_stop_while_the_engine_is_stalled_and_come_back_after() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(dir.path(), false);
    let b = format!("127.0.0.1:{}", broker.port);
    let m = model();
    // Pings every 200 ms; each answer stalls 4 s before it starts.
    let d = Daemon::spawn(
        &[
            "--model", &m, "--mqtt", &b, "--device", DEVICE, "--ctx", "256", "-t", "1",
        ],
        &[
            ("WATCHDOG_USEC", "400000"),
            ("EDGELLM_TEST_HOOK", "stall_ms=4000"),
        ],
    );
    let got = d.wait_notify("READY=1", Duration::from_secs(60));
    assert!(got.contains("READY=1"), "{got}");
    let pings = |window: Duration| {
        d.wait_notify("never-sent", window)
            .matches("WATCHDOG=1")
            .count()
    };
    assert!(pings(Duration::from_millis(800)) >= 2, "{}", d.log_text());
    let answers = Collector::start(broker.port, &format!("edgellm/{DEVICE}/response/+"), None);
    publish_lines(
        broker.port,
        &format!("edgellm/{DEVICE}/request"),
        &requests(&["w".to_owned()], 2),
    );
    // Pings may go on for the first 400 ms of the stall (twice the interval); from then on
    // to its end, none. The window, 1 to 2.5 s after the publish, leaves 600 ms for the
    // request to reach the worker on a loaded machine.
    std::thread::sleep(Duration::from_millis(1000));
    d.wait_notify("never-sent", Duration::from_millis(1)); // drain what came before
    assert_eq!(
        pings(Duration::from_millis(1500)),
        0,
        "pings during the stall\n{}",
        d.log_text()
    );
    let finals = answers.wait_all(&["w".to_owned()], Duration::from_secs(30), &|| d.log_text());
    assert!(finals["w"][0].1["text"].is_string());
    assert!(
        pings(Duration::from_millis(800)) >= 2,
        "pings back after\n{}",
        d.log_text()
    );
    assert!(
        d.log_text().contains("watchdog pings stopped"),
        "{}",
        d.log_text()
    );
}

#[test]
fn sigterm_while_the_broker_never_answers_stops_at_once() {
    // A port that completes TCP handshakes (the kernel's backlog) but never answers CONNECT:
    // a broker that hangs, or a firewall that swallows the traffic after the handshake.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let broker = format!("127.0.0.1:{}", silent.local_addr().unwrap().port());
    let model = common::model_path("q4_0");
    let m = model.to_str().unwrap();
    let args = [
        "-m", m, "--mqtt", &broker, "--device", DEVICE, "-t", "1", "-c", "256",
    ];
    let mut d = Daemon::spawn(&args, &[("EDGELLM_LOG", "info")]);
    let log = d.wait_log(Duration::from_secs(60), |l| l.contains("service started"));
    assert!(log.contains("service started"), "{log}");
    // Inside the first connection attempt, before READY (the broker wait is 10 s).
    std::thread::sleep(Duration::from_millis(500));
    let asked = Instant::now();
    let status = d.terminate(Duration::from_secs(3));
    assert!(status.success(), "{status}: {}", d.log_text());
    let took = asked.elapsed();
    assert!(
        took < Duration::from_secs(2),
        "SIGTERM took {took:?}: {}",
        d.log_text()
    );
}
