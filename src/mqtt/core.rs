//! The MQTT front end's delivery rules, pure: fed what the broker says (a ConnAck, a SubAck, a
//! message) and what the service says (a request's events), it returns [`Action`]s. No I/O, no
//! clock of its own, no async: [`super::client`] polls the connection, calls this, and executes
//! what comes back. The rules, each unit-tested below:
//!
//! - **Sessions.** A ConnAck without a session present renews the subscriptions and starts a
//!   new broker-session epoch; with one, the broker kept them: requests can arrive at once.
//! - **Duplicates.** A redelivery (DUP) whose answer is in the journal is answered from it,
//!   not recomputed; one still being answered is not taken twice (its answer acknowledges it).
//!   A first delivery is never looked up: a client may send the same request twice on purpose.
//! - **Ack after publish.** A request's final message is journaled, then published, then the
//!   request acknowledged ([`Action::Final`], then [`Core::on_published`]): whatever point a
//!   crash stops this at, a redelivery finds the answer or finds a request never answered.
//! - **Epochs.** A packet id means something only in the broker session it came in: an answer
//!   finished after that session was lost acknowledges nothing (the id may be another
//!   request's by now).
//! - **Sequence numbers.** A streaming request's chunks count from 0 without a gap.
//! - **Cancels** reach every request in flight with that id; cancels and messages on a topic
//!   we did not subscribe to are acknowledged as soon as the deliveries before them are.
//! - **Ack order.** Acknowledgements go in the order the deliveries came (MQTT-4.6.0-2): one
//!   that is ready waits for the older ones ([`AckOrder`]). The embedded broker closes a
//!   connection that acknowledges out of order.
//!
//! `A` is what acknowledges a delivery (rumqttc's publish in the client; a number in tests).

use super::ack_order::{AckOrder, Slot};
use super::contract::{self, Limits, Origin, Topics};
use super::journal::{self, Answer, Key};
use super::link::Props;
use crate::service::{Event, Refusal, Request, ServiceError};
use bytes::Bytes;
use std::collections::HashMap;
use std::time::Instant;

/// Which of a device's connections this is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// The device's own request and cancel topics, on a persistent session (requests wait at
    /// the broker while the daemon is away), with the retained status and the last will.
    Device,
    /// The fleet's shared request topic and its cancel topic, on a second connection with a
    /// clean session: the broker keeps nothing for a member that is away, so it gives the
    /// group's requests to the members that are connected.
    Fleet,
}

/// A message from the broker.
#[derive(Clone, Debug)]
pub struct Delivery<A> {
    pub topic: String,
    pub payload: Bytes,
    /// A redelivery: the broker sent it before and saw no acknowledgement.
    pub dup: bool,
    pub response_topic: Option<String>,
    pub correlation: Option<Bytes>,
    pub ack: A,
}

/// A message to publish (QoS as configured, not retained).
#[derive(Clone, Debug, PartialEq)]
pub struct Publish {
    pub topic: String,
    pub payload: Vec<u8>,
    /// MQTT 5 properties: only when the request named a response topic, so that a 3.1.1
    /// subscriber can take the answer (rumqttd panics forwarding properties to one).
    pub props: Option<Props>,
}

/// What the client loop does for the core.
#[derive(Debug)]
pub enum Action<A> {
    /// Subscribe to these topics, in one SUBSCRIBE.
    Subscribe(Vec<String>),
    /// Requests can arrive: subscribed, or the broker kept our subscriptions.
    Ready,
    /// Hand the request to the service; its events come back through [`Core::on_event`] with
    /// this token, or its refusal through [`Core::on_refused`].
    Submit(u64, Box<Request>),
    /// Cancel the request of this token.
    Cancel(u64),
    /// Tell the service of a request refused here, for the audit trail
    /// ([`Handle::refused`](crate::service::Handle::refused)).
    Refused(Refusal),
    Publish(Publish),
    Ack(A),
    /// A request's final message: write `answer` to the journal under `key` (synced), then
    /// publish it, then call [`Core::on_published`] with the token.
    Final {
        token: u64,
        id: String,
        key: Key,
        answer: Answer,
    },
}

/// What the core reads of the rest of the daemon.
pub trait Env {
    /// The journaled answer to the delivery `key`, if any.
    fn stored(&self, key: &Key) -> Option<Answer>;
    /// A fresh request id, for a request that has none.
    fn fresh_id(&mut self) -> String;
    /// The bounds requests are held to now.
    fn limits(&self) -> Limits;
    fn now(&self) -> Instant;
}

/// One request in flight: where its answer goes, and the delivery it acknowledges.
#[derive(Debug)]
struct InFlight<A> {
    id: String,
    topic: String,
    correlation: Option<Bytes>,
    properties: bool,
    stream: bool,
    key: Key,
    ack: A,
    /// Its place among the connection's acknowledgements.
    slot: Slot,
    /// The broker-session epoch the delivery came in.
    epoch: u64,
    /// The next chunk's sequence number.
    seq: u64,
}

/// The delivery rules of one connection.
pub struct Core<A> {
    topics: Topics,
    role: Role,
    epoch: u64,
    /// Deliveries received and not yet answered, by key (a count: a client may send the same
    /// request twice on purpose).
    deliveries: HashMap<Key, usize>,
    requests: HashMap<u64, InFlight<A>>,
    next_token: u64,
    acks: AckOrder<A>,
}

impl<A: Clone> Core<A> {
    pub fn new(topics: Topics, role: Role) -> Core<A> {
        Core {
            topics,
            role,
            epoch: 0,
            deliveries: HashMap::new(),
            requests: HashMap::new(),
            next_token: 0,
            acks: AckOrder::default(),
        }
    }

    /// Requests submitted and not yet answered.
    pub fn in_flight(&self) -> usize {
        self.requests.len()
    }

    /// The broker accepted the connection.
    pub fn on_connack(&mut self, session_present: bool) -> Vec<Action<A>> {
        if session_present {
            return vec![Action::Ready];
        }
        // The broker forgot the session: the packet ids of every earlier delivery are void.
        self.epoch += 1;
        let t = &self.topics;
        let topics = match self.role {
            Role::Device => vec![t.request.clone(), t.cancel.clone()],
            Role::Fleet => t
                .fleet_request
                .iter()
                .chain(&t.fleet_cancel)
                .cloned()
                .collect(),
        };
        vec![Action::Subscribe(topics)]
    }

    /// Our only SUBSCRIBE of a connection was acknowledged: every topic is in place.
    pub fn on_suback(&mut self) -> Vec<Action<A>> {
        vec![Action::Ready]
    }

    /// A message arrived: a request (submitted, answered from the journal, refused, or left
    /// to the answer in progress) or a cancel.
    pub fn on_publish(&mut self, d: Delivery<A>, env: &mut dyn Env) -> Vec<Action<A>> {
        let t = &self.topics;
        // A fleet cancel reaches every member; the one answering the request cancels it.
        if d.topic == t.cancel || t.fleet_cancel.as_deref() == Some(d.topic.as_str()) {
            let mut out: Vec<Action<A>> = match contract::parse_cancel(&d.payload) {
                Ok(id) => {
                    let mut tokens: Vec<u64> = self
                        .requests
                        .iter()
                        .filter(|(_, r)| r.id == id)
                        .map(|(t, _)| *t)
                        .collect();
                    tokens.sort_unstable();
                    tracing::info!(request = id, found = tokens.len(), "cancel");
                    tokens.into_iter().map(Action::Cancel).collect()
                }
                Err(e) => {
                    tracing::warn!("cancel refused: {e}");
                    Vec::new()
                }
            };
            out.extend(self.ack_now(d.ack));
            return out;
        }
        let origin = if t.fleet_topic.as_deref() == Some(d.topic.as_str()) {
            Origin::Fleet
        } else if d.topic == t.request {
            Origin::Device
        } else {
            tracing::warn!(
                topic = d.topic,
                "message on a topic we did not subscribe to: ignored"
            );
            return self.ack_now(d.ack);
        };
        let key = journal::delivery_key(
            d.topic.as_bytes(),
            &d.payload,
            d.response_topic.as_deref(),
            d.correlation.as_deref(),
        );
        if d.dup {
            if let Some(a) = env.stored(&key) {
                tracing::info!(
                    topic = d.topic,
                    "redelivered request: its stored answer is sent again"
                );
                let mut out = vec![Action::Publish(publish_of(&a))];
                out.extend(self.ack_now(d.ack));
                return out;
            }
            if self.deliveries.contains_key(&key) {
                // Its answer, when published, acknowledges this delivery (the same packet id).
                tracing::info!(
                    topic = d.topic,
                    "redelivered request still being answered: not taken twice"
                );
                return Vec::new();
            }
        }
        *self.deliveries.entry(key).or_default() += 1;
        // The client's own response topic keys the queue's fairness between clients (and
        // names the asker in the audit trail); a 3.1.1 client has none, and is named by the
        // topic.
        let source = format!("mqtt:{}", d.response_topic.as_deref().unwrap_or(&d.topic));
        let limits = env.limits();
        let now = env.now();
        let parsed =
            contract::parse_request(&d.payload, origin, &source, || env.fresh_id(), &limits, now);
        let token = self.next_token;
        self.next_token += 1;
        let slot = self.acks.arrive(self.epoch);
        let mut req = InFlight {
            id: String::new(),
            topic: String::new(),
            properties: d.response_topic.is_some(),
            correlation: d.correlation,
            stream: false,
            key,
            ack: d.ack,
            slot,
            epoch: self.epoch,
            seq: 0,
        };
        let reply_to = |id: &str| {
            d.response_topic
                .clone()
                .unwrap_or_else(|| self.topics.response(id))
        };
        match parsed {
            Err(refused) => {
                let id = refused.id.clone().unwrap_or_default();
                tracing::info!(id = refused.id.as_deref().unwrap_or("?"), code = %refused.error.code, "request refused: {}", refused.error);
                let body = contract::error_json(refused.id.as_deref(), &refused.error);
                // An unreadable id gets the answer on the response topic, or a shared error
                // topic.
                req.topic = reply_to(if id.is_empty() { "error" } else { &id });
                // A refusal with an id the service can carry is on the record; one without
                // (unreadable JSON, a bad id) is a message, not yet a request.
                let record = refused.id.as_ref().map(|id| {
                    let r = Refusal::new(id, &source, refused.error.clone());
                    Action::Refused(r.with_session(refused.session.as_deref()))
                });
                req.id = id;
                self.requests.insert(token, req);
                record
                    .into_iter()
                    .chain([self.finish(token, body)])
                    .collect()
            }
            Ok(p) => {
                req.id = p.request.id.clone();
                req.topic = reply_to(&req.id);
                req.stream = p.stream;
                self.requests.insert(token, req);
                vec![Action::Submit(token, Box::new(p.request))]
            }
        }
    }

    /// The service refused the request of `token` at once (busy, stopping).
    pub fn on_refused(&mut self, token: u64, e: &ServiceError) -> Vec<Action<A>> {
        let Some(r) = self.requests.get(&token) else {
            return Vec::new();
        };
        let body = contract::error_json(Some(&r.id), e);
        vec![self.finish(token, body)]
    }

    /// An event of the request of `token`.
    pub fn on_event(&mut self, token: u64, ev: Event) -> Vec<Action<A>> {
        let Some(r) = self.requests.get_mut(&token) else {
            return Vec::new();
        };
        let body = match ev {
            Event::Text(chunk) => {
                if !r.stream {
                    return Vec::new();
                }
                let body = contract::chunk_json(&r.id, r.seq, &chunk);
                r.seq += 1;
                let props = r.properties.then(|| Props {
                    correlation: r.correlation.clone(),
                });
                let p = Publish {
                    topic: r.topic.clone(),
                    payload: body,
                    props,
                };
                return vec![Action::Publish(p)];
            }
            Event::Done(d) => contract::done_json(&d),
            Event::Error(e) => contract::error_json(Some(&r.id), &e),
        };
        vec![self.finish(token, body)]
    }

    /// The final message of `token` is journaled and published: acknowledge its delivery,
    /// unless the broker session it came in is gone.
    pub fn on_published(&mut self, token: u64) -> Vec<Action<A>> {
        let Some(r) = self.requests.remove(&token) else {
            return Vec::new();
        };
        if let Some(n) = self.deliveries.get_mut(&r.key) {
            *n -= 1;
            if *n == 0 {
                self.deliveries.remove(&r.key);
            }
        }
        if r.epoch != self.epoch {
            // The broker forgot the session this came in, and with it the delivery: it will
            // not send it again, and its packet id may now be another request's.
            tracing::info!(
                request = r.id,
                "answered after the broker lost its session: nothing to acknowledge"
            );
            return Vec::new();
        }
        self.acks
            .ready(r.slot, r.ack)
            .into_iter()
            .map(Action::Ack)
            .collect()
    }

    /// A delivery acknowledged as soon as those before it are.
    fn ack_now(&mut self, ack: A) -> Vec<Action<A>> {
        let slot = self.acks.arrive(self.epoch);
        self.acks
            .ready(slot, ack)
            .into_iter()
            .map(Action::Ack)
            .collect()
    }

    /// The final message of `token`: its journal entry and its publish.
    fn finish(&self, token: u64, payload: Vec<u8>) -> Action<A> {
        let r = &self.requests[&token];
        Action::Final {
            token,
            id: r.id.clone(),
            key: r.key,
            answer: Answer {
                topic: r.topic.clone(),
                properties: r.properties,
                correlation: r.correlation.clone(),
                payload,
            },
        }
    }
}

/// The publish of a journaled answer: with properties only when the request had them.
pub fn publish_of(a: &Answer) -> Publish {
    Publish {
        topic: a.topic.clone(),
        payload: a.payload.clone(),
        props: a.properties.then(|| Props {
            correlation: a.correlation.clone(),
        }),
    }
}

#[cfg(test)]
#[path = "core_tests.rs"]
mod tests;
