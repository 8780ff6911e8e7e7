//! Faults under load, counted: the broker stopped and started five times while
//! requests stream in, and the daemon killed with SIGKILL at random moments while it answers
//! (`EDGELLM_KILLS`, 10 by default; `EDGELLM_KILLS=100` for the figure in
//! docs/reliability.md). Every request is answered, each with one answer (QoS 1 may bring the
//! same answer twice, byte for byte, never two different ones), and session files verify.

mod common;

use common::mqtt::{Daemon, edgellm, publish_lines};
use common::recovery::{Broker, Collector};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

const DEVICE: &str = "fault-dev";

fn serve(port: u16, state: &Path) -> Daemon {
    // Room for every request the faults pile up (all come from one publisher, one source):
    // a busy answer would be an answer, but not the one this test counts.
    let config = "[limits]\nqueue_depth = 512\nper_source = 512\n";
    common::recovery::serve(port, DEVICE, state, config, &[("EDGELLM_LOG", "info")])
}

/// Request `id`: every third one continues a named session (`s0`..`s2`).
fn request(id: &str, n: usize) -> String {
    let session = match n % 3 {
        0 => format!(r#","session":"s{}""#, n % 9 / 3),
        _ => String::new(),
    };
    format!(
        r#"{{"id":"{id}","messages":[{{"role":"user","content":"Name a colour ({id})."}}],"max_tokens":6{session}}}"#
    )
}

/// Each id has a final answer, and all its final messages are the same one.
fn assert_once(finals: &BTreeMap<String, Vec<(String, Value)>>, ids: &[String]) -> usize {
    let mut dup = 0;
    for id in ids {
        let f = &finals[id];
        assert!(f[0].1["text"].is_string(), "{id}: {:?}", f[0].1);
        assert!(f.iter().all(|x| x.1 == f[0].1), "{id}: two answers {f:?}");
        dup += f.len() - 1;
    }
    dup
}

fn verify_sessions(state: &Path) -> usize {
    let mut n = 0;
    for e in std::fs::read_dir(state.join("sessions")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "kv") {
            let out = edgellm(&["kv", "verify", p.to_str().unwrap()]);
            assert!(
                out.status.success(),
                "{}: {}",
                p.display(),
                String::from_utf8_lossy(&out.stdout)
            );
            n += 1;
        }
    }
    n
}

#[test]
fn the_broker_stopped_five_times_under_load_loses_nothing_and_computes_nothing_twice() {
    let dir = tempfile::tempdir().unwrap();
    let mut broker = Broker::start(dir.path(), true);
    let state = dir.path().join("state");
    let answers = Collector::start(
        broker.port,
        &format!("edgellm/{DEVICE}/response/+"),
        Some("fault-collector"),
    );
    let d = serve(broker.port, &state);
    let topic = format!("edgellm/{DEVICE}/request");
    let mut all = Vec::new();
    for round in 0..5 {
        let batch: Vec<String> = (0..8).map(|i| format!("b{round}-{i}")).collect();
        let reqs: Vec<String> = batch
            .iter()
            .enumerate()
            .map(|(i, id)| request(id, round * 8 + i))
            .collect();
        publish_lines(broker.port, &topic, &reqs);
        all.extend(batch);
        // Down while this batch is being answered: some answered, the rest queued or running.
        let seen = answers.finals().len();
        let until = Instant::now() + Duration::from_secs(60);
        while answers.finals().len() == seen {
            assert!(Instant::now() < until, "no answer\n{}", d.log_text());
            std::thread::sleep(Duration::from_millis(10));
        }
        broker.down();
        std::thread::sleep(Duration::from_millis(300));
        broker.up();
    }
    let finals = answers.wait_all(&all, Duration::from_secs(120), &|| d.log_text());
    let dup = assert_once(&finals, &all);
    let log = d.log_text();
    let drops = log.matches("MQTT connection").count();
    assert!(drops >= 5, "{drops} disconnections seen:\n{log}");
    // Computed once each: the status counts each request taken once.
    let v = common::recovery::wait_status(broker.port, DEVICE, all.len(), &log);
    assert_eq!(v["counters"]["accepted"], all.len(), "{v}");
    let sessions = verify_sessions(&state);
    eprintln!(
        "broker restarts: 5, requests {}, answered {}, computed {}, answers seen twice (QoS 1) \
         {dup}, session files verified {sessions}",
        all.len(),
        finals.len(),
        v["counters"]["accepted"]
    );
}

#[test]
fn sigkill_at_random_moments_under_load_loses_nothing_and_answers_nothing_twice() {
    let kills: usize = std::env::var("EDGELLM_KILLS")
        .ok()
        .and_then(|k| k.parse().ok())
        .unwrap_or(10);
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(dir.path(), false);
    let state = dir.path().join("state");
    let answers = Collector::start(broker.port, &format!("edgellm/{DEVICE}/response/+"), None);
    let topic = format!("edgellm/{DEVICE}/request");
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut all = Vec::new();
    let mut killed_answering = 0;
    for k in 0..kills {
        let batch: Vec<String> = (0..3).map(|i| format!("k{k}-{i}")).collect();
        let reqs: Vec<String> = batch
            .iter()
            .enumerate()
            .map(|(i, id)| request(id, k * 3 + i))
            .collect();
        // Up first: the daemon's persistent session is what keeps requests while it is away
        // (before its first connection, there is none to keep them).
        let mut d = serve(broker.port, &state);
        publish_lines(broker.port, &topic, &reqs);
        all.extend(batch);
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        // The first kill comes at once, so that at least one finds requests pending however
        // fast a loaded or idle machine answers; the others at random moments.
        let wait = if k == 0 { 0 } else { rng % 700 };
        std::thread::sleep(Duration::from_millis(wait));
        killed_answering += usize::from(answers.finals().len() < all.len());
        let _ = d.child.kill();
        let _ = d.child.wait();
    }
    let d = serve(broker.port, &state);
    let finals = answers.wait_all(&all, Duration::from_secs(180), &|| d.log_text());
    let dup = assert_once(&finals, &all);
    let sessions = verify_sessions(&state);
    eprintln!(
        "SIGKILLs: {kills} ({killed_answering} with requests unanswered), requests {}, answered \
         {}, answers seen twice (QoS 1) {dup}, session files verified {sessions}",
        all.len(),
        finals.len()
    );
    assert!(
        killed_answering > 0,
        "no kill came while requests were pending"
    );
}
