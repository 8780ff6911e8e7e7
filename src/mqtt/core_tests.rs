//! Every delivery rule of the MQTT core, without a broker: acks are numbers (a packet id).

use super::*;
use crate::service::{Chunk, Done, ErrorCode, FinishReason, Timings, Usage};
use std::time::Duration;

struct MemEnv {
    journal: HashMap<Key, Answer>,
    next_id: u64,
    now: Instant,
}

impl MemEnv {
    fn new() -> MemEnv {
        MemEnv {
            journal: HashMap::new(),
            next_id: 0,
            now: Instant::now(),
        }
    }
}

impl Env for MemEnv {
    fn stored(&self, key: &Key) -> Option<Answer> {
        self.journal.get(key).cloned()
    }
    fn fresh_id(&mut self) -> String {
        self.next_id += 1;
        format!("gen-{}", self.next_id)
    }
    fn limits(&self) -> Limits {
        Limits {
            max_payload: 4096,
            max_tokens: 100,
            timeout: Some(Duration::from_secs(5)),
        }
    }
    fn now(&self) -> Instant {
        self.now
    }
}

fn topics() -> Topics {
    Topics::new("edgellm", "dev", Some("line")).unwrap()
}

fn device() -> Core<u16> {
    Core::new(topics(), Role::Device)
}

/// A request on the device's topic with packet id `ack`, from an MQTT 5 client that named
/// its response topic.
fn request(body: &str, ack: u16) -> Delivery<u16> {
    Delivery {
        topic: "edgellm/dev/request".into(),
        payload: Bytes::copy_from_slice(body.as_bytes()),
        dup: false,
        response_topic: Some("client/7/answers".into()),
        correlation: Some(Bytes::from_static(b"c-1")),
        ack,
    }
}

fn redelivered(mut d: Delivery<u16>) -> Delivery<u16> {
    d.dup = true;
    d
}

fn done(id: &str, text: &str) -> Event {
    Event::Done(Box::new(Done {
        id: id.into(),
        text: text.into(),
        finish_reason: FinishReason::Eog,
        usage: Usage::default(),
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
    }))
}

fn text(s: &str) -> Event {
    let mut c = Chunk::new();
    c.push_str(s).unwrap();
    Event::Text(c)
}

/// The token of a lone `Submit`.
fn submitted(actions: Vec<Action<u16>>) -> u64 {
    match actions.as_slice() {
        [Action::Submit(t, _)] => *t,
        other => panic!("expected one submit, got {other:?}"),
    }
}

/// The answer of a lone `Final`.
fn final_of(actions: Vec<Action<u16>>) -> (u64, Key, Answer) {
    match actions.as_slice() {
        [
            Action::Final {
                token, key, answer, ..
            },
        ] => (*token, *key, answer.clone()),
        other => panic!("expected one final message, got {other:?}"),
    }
}

/// The refusal told to the service, and the answer of the `Final` after it.
fn refused_of(actions: Vec<Action<u16>>) -> (Refusal, u64, Answer) {
    match actions.as_slice() {
        [Action::Refused(r), Action::Final { token, answer, .. }] => {
            (r.clone(), *token, answer.clone())
        }
        other => panic!("expected a refusal and its final message, got {other:?}"),
    }
}

fn json(payload: &[u8]) -> serde_json::Value {
    serde_json::from_slice(payload).unwrap()
}

#[test]
fn a_connack_without_a_session_subscribes_anew_and_one_with_a_session_is_ready_at_once() {
    let mut c = device();
    match c.on_connack(false).as_slice() {
        [Action::Subscribe(t)] => assert_eq!(t, &["edgellm/dev/request", "edgellm/dev/cancel"]),
        other => panic!("{other:?}"),
    }
    assert!(matches!(c.on_suback().as_slice(), [Action::Ready]));
    assert!(matches!(c.on_connack(true).as_slice(), [Action::Ready]));

    let mut fleet: Core<u16> = Core::new(topics(), Role::Fleet);
    match fleet.on_connack(false).as_slice() {
        [Action::Subscribe(t)] => assert_eq!(
            t,
            &["$share/line/edgellm/fleet/request", "edgellm/fleet/cancel"]
        ),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_final_message_is_journaled_and_published_before_its_request_is_acknowledged() {
    let (mut c, mut env) = (device(), MemEnv::new());
    c.on_connack(false);
    let t = submitted(c.on_publish(request(r#"{"id":"r1","prompt":"hi"}"#, 11), &mut env));
    assert!(
        c.on_event(t, text("he")).is_empty(),
        "not streamed: no chunk"
    );
    let (token, key, answer) = final_of(c.on_event(t, done("r1", "hello")));
    assert_eq!(token, t);
    assert_eq!(
        key,
        journal::delivery_key(
            b"edgellm/dev/request",
            br#"{"id":"r1","prompt":"hi"}"#,
            Some("client/7/answers"),
            Some(b"c-1")
        )
    );
    assert_eq!(answer.topic, "client/7/answers");
    assert!(answer.properties);
    assert_eq!(answer.correlation.as_deref(), Some(&b"c-1"[..]));
    assert_eq!(json(&answer.payload)["text"], "hello");
    // Only once it is out: the acknowledgement, of this delivery's packet id.
    assert!(matches!(c.on_published(t).as_slice(), [Action::Ack(11)]));
    assert_eq!(c.in_flight(), 0);
    assert!(c.on_published(t).is_empty(), "a request ends once");
}

#[test]
fn streamed_chunks_count_from_zero_without_a_gap_and_carry_the_properties() {
    let (mut c, mut env) = (device(), MemEnv::new());
    let t = submitted(c.on_publish(
        request(r#"{"id":"s","prompt":"hi","stream":true}"#, 1),
        &mut env,
    ));
    for (n, piece) in ["a", "b", "c"].into_iter().enumerate() {
        match c.on_event(t, text(piece)).as_slice() {
            [Action::Publish(p)] => {
                let v = json(&p.payload);
                assert_eq!(
                    (v["seq"].as_u64(), v["delta"].as_str()),
                    (Some(n as u64), Some(piece))
                );
                assert_eq!(p.topic, "client/7/answers");
                assert_eq!(
                    p.props.as_ref().and_then(|p| p.correlation.as_deref()),
                    Some(&b"c-1"[..])
                );
            }
            other => panic!("{other:?}"),
        }
    }
    final_of(c.on_event(t, done("s", "abc")));
}

#[test]
fn a_redelivery_whose_answer_was_journaled_is_answered_from_the_journal_not_recomputed() {
    let (mut c, mut env) = (device(), MemEnv::new());
    let d = request(r#"{"id":"r1","prompt":"hi"}"#, 5);
    let t = submitted(c.on_publish(d.clone(), &mut env));
    let (_, key, answer) = final_of(c.on_event(t, done("r1", "hello")));
    // The daemon died after the journal write, before the acknowledgement.
    env.journal.insert(key, answer.clone());
    let mut c = device();
    match c.on_publish(redelivered(d), &mut env).as_slice() {
        [Action::Publish(p), Action::Ack(5)] => assert_eq!(*p, publish_of(&answer)),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_first_delivery_is_never_looked_up_a_client_may_ask_twice_on_purpose() {
    let (mut c, mut env) = (device(), MemEnv::new());
    let d = request(r#"{"id":"r1","prompt":"hi"}"#, 5);
    let t = submitted(c.on_publish(d.clone(), &mut env));
    let (_, key, answer) = final_of(c.on_event(t, done("r1", "hello")));
    env.journal.insert(key, answer);
    c.on_published(t);
    submitted(c.on_publish(d, &mut env));
}

#[test]
fn a_redelivery_still_being_answered_is_not_taken_twice() {
    let (mut c, mut env) = (device(), MemEnv::new());
    let d = request(r#"{"id":"r1","prompt":"hi"}"#, 5);
    let t = submitted(c.on_publish(d.clone(), &mut env));
    // The broker restarted and sends it again: the answer in progress acknowledges it.
    assert!(c.on_publish(redelivered(d.clone()), &mut env).is_empty());
    assert_eq!(c.in_flight(), 1);
    final_of(c.on_event(t, done("r1", "x")));
    assert!(matches!(c.on_published(t).as_slice(), [Action::Ack(5)]));
    // Answered (and not journaled here): a later redelivery is a request like any other.
    submitted(c.on_publish(redelivered(d), &mut env));
}

#[test]
fn an_answer_finished_after_the_broker_lost_its_session_acknowledges_nothing() {
    let (mut c, mut env) = (device(), MemEnv::new());
    c.on_connack(false);
    let t = submitted(c.on_publish(request(r#"{"id":"r1","prompt":"hi"}"#, 9), &mut env));
    // The broker restarted without persistence: packet id 9 may be another request's now.
    c.on_connack(false);
    final_of(c.on_event(t, done("r1", "x")));
    assert!(c.on_published(t).is_empty());
    assert_eq!(c.in_flight(), 0);
    // A reconnection that kept the session keeps the epoch: that one is acknowledged.
    let t = submitted(c.on_publish(request(r#"{"id":"r2","prompt":"hi"}"#, 10), &mut env));
    c.on_connack(true);
    final_of(c.on_event(t, done("r2", "x")));
    assert!(matches!(c.on_published(t).as_slice(), [Action::Ack(10)]));
}

#[test]
fn a_cancel_reaches_every_request_in_flight_with_its_id_and_is_acknowledged_after_them() {
    let (mut c, mut env) = (device(), MemEnv::new());
    let a = submitted(c.on_publish(request(r#"{"id":"r1","prompt":"a"}"#, 1), &mut env));
    let b = submitted(c.on_publish(request(r#"{"id":"r1","prompt":"b"}"#, 2), &mut env));
    let r2 = submitted(c.on_publish(request(r#"{"id":"r2","prompt":"c"}"#, 3), &mut env));
    let mut cancel = request(r#"{"id":"r1"}"#, 4);
    cancel.topic = "edgellm/dev/cancel".into();
    // Both r1s are cancelled at once; the cancel's ack waits for the three requests before it.
    match c.on_publish(cancel.clone(), &mut env).as_slice() {
        [Action::Cancel(x), Action::Cancel(y)] => assert_eq!((*x, *y), (a, b)),
        other => panic!("{other:?}"),
    }
    // The fleet's cancel topic too; a cancel it cannot read is acknowledged all the same.
    cancel.topic = "edgellm/fleet/cancel".into();
    cancel.payload = Bytes::from_static(b"r1");
    cancel.ack = 5;
    assert!(c.on_publish(cancel, &mut env).is_empty());
    // The acks go in the order the deliveries came, whatever order the answers end in.
    final_of(c.on_event(r2, done("r2", "x")));
    assert!(c.on_published(r2).is_empty(), "r2 waits for a and b");
    final_of(c.on_event(b, done("r1", "y")));
    assert!(c.on_published(b).is_empty(), "b waits for a");
    final_of(c.on_event(a, done("r1", "z")));
    match c.on_published(a).as_slice() {
        [
            Action::Ack(1),
            Action::Ack(2),
            Action::Ack(3),
            Action::Ack(4),
            Action::Ack(5),
        ] => {}
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_message_on_a_topic_we_did_not_subscribe_to_is_acknowledged_and_ignored() {
    let (mut c, mut env) = (device(), MemEnv::new());
    let mut d = request(r#"{"id":"r1","prompt":"a"}"#, 8);
    d.topic = "edgellm/other/request".into();
    assert!(matches!(
        c.on_publish(d, &mut env).as_slice(),
        [Action::Ack(8)]
    ));
    assert_eq!(c.in_flight(), 0);
}

#[test]
fn a_malformed_request_is_answered_with_its_error_journaled_then_acknowledged() {
    let (mut c, mut env) = (device(), MemEnv::new());
    let (r, t, answer) =
        refused_of(c.on_publish(request(r#"{"id":"r1","prompt":1}"#, 3), &mut env));
    let v = json(&answer.payload);
    assert_eq!(
        (v["id"].as_str(), v["error"]["code"].as_str()),
        (Some("r1"), Some("bad_request"))
    );
    // The service is told, for the audit trail: the id, who sent it, the error answered.
    assert_eq!(
        (r.id.as_str(), r.source.as_str(), r.session, r.error.code),
        ("r1", "mqtt:client/7/answers", None, ErrorCode::BadRequest)
    );
    assert!(matches!(c.on_published(t).as_slice(), [Action::Ack(3)]));
    // Without a readable id and without a response topic: the device's shared error topic,
    // and nothing to record (a message, not yet a request).
    let mut d = request("not json", 4);
    d.response_topic = None;
    let (_, _, answer) = final_of(c.on_publish(d, &mut env));
    assert_eq!(answer.topic, "edgellm/dev/response/error");
    assert!(!answer.properties, "a 3.1.1 client gets no properties");
    assert_eq!(json(&answer.payload)["id"], serde_json::Value::Null);
}

#[test]
fn a_request_the_service_refuses_is_answered_with_the_refusal() {
    let (mut c, mut env) = (device(), MemEnv::new());
    let mut d = request(r#"{"prompt":"hi"}"#, 6);
    d.response_topic = None;
    let t = submitted(c.on_publish(d, &mut env));
    let busy = ServiceError::new(ErrorCode::Busy, "busy: 16 requests are already waiting");
    let (_, _, answer) = final_of(c.on_refused(t, &busy));
    // The generated id names the answer's topic and the answer.
    assert_eq!(answer.topic, "edgellm/dev/response/gen-1");
    let v = json(&answer.payload);
    assert_eq!(
        (v["id"].as_str(), v["error"]["code"].as_str()),
        (Some("gen-1"), Some("busy"))
    );
    assert!(matches!(c.on_published(t).as_slice(), [Action::Ack(6)]));
}

#[test]
fn a_fleet_request_is_taken_from_the_shared_topic_and_cannot_name_a_session() {
    let (mut c, mut env) = (Core::new(topics(), Role::Fleet), MemEnv::new());
    let mut d = request(r#"{"id":"f1","prompt":"hi","session":"s"}"#, 2);
    d.topic = "edgellm/fleet/request".into();
    let (r, _, answer) = refused_of(c.on_publish(d.clone(), &mut env));
    assert_eq!(json(&answer.payload)["error"]["code"], "bad_request");
    assert_eq!((r.id.as_str(), r.session.as_deref()), ("f1", Some("s")));
    d.payload = Bytes::from_static(br#"{"id":"f2","prompt":"hi"}"#);
    submitted(c.on_publish(d, &mut env));
}

#[test]
fn a_session_name_that_cannot_be_used_is_refused_and_told_with_the_name_as_sent() {
    let (mut c, mut env) = (device(), MemEnv::new());
    let d = request(r#"{"id":"s1","prompt":"hi","session":"line 3/pump"}"#, 5);
    let (r, t, answer) = refused_of(c.on_publish(d, &mut env));
    assert_eq!(json(&answer.payload)["error"]["code"], "bad_request");
    assert_eq!(
        (r.id.as_str(), r.session.as_deref(), r.error.code),
        ("s1", Some("line 3/pump"), ErrorCode::BadRequest)
    );
    assert!(matches!(c.on_published(t).as_slice(), [Action::Ack(5)]));
}

#[test]
fn events_of_a_request_no_longer_in_flight_are_ignored() {
    let mut c = device();
    assert!(c.on_event(42, done("x", "y")).is_empty());
    assert!(
        c.on_refused(42, &ServiceError::new(ErrorCode::Busy, "b"))
            .is_empty()
    );
    assert!(c.on_published(42).is_empty());
}
