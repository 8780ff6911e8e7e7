//! The MQTT client loop (rumqttc, MQTT 5): a thin tokio wrapper around [`super::contract`].
//!
//! One task polls the connection and does nothing else: it never awaits a publish (rumqttc's
//! request channel is drained by that same poll, so awaiting it there can deadlock). Each
//! request's [`Ticket`] is read by a task of its own that hands the events to the publisher
//! task, which publishes chunks and the final answer and only then acknowledges the request to
//! the broker. Every channel on the way is bounded: a stalled broker holds the answer back
//! through the ticket, where the service's one backpressure policy applies.
//! So a request in flight when the daemon dies is delivered again (QoS 1, a persistent
//! session), and a redelivered one whose answer was already published is answered from the
//! [`Journal`], not recomputed.
//!
//! A device in a fleet runs this loop twice: once for its own topics ([`Role::Device`], a
//! persistent session, the status and the will) and once for the fleet's shared topic
//! ([`Role::Fleet`], a clean session).
//!
//! What rumqttc needs, measured with it: the maximum packet size set from the payload limit
//! (its 10 KiB default drops the connection on a larger request); outgoing inflight capped
//! (the v5 default preallocates ~14 MB); a backoff between reconnects of our own (poll fails
//! at once and repeatedly while the broker is down); subscriptions renewed on every ConnAck
//! without a session present; the retained offline status published by us before a graceful
//! disconnect (a clean disconnect suppresses the will).

use super::contract::{self, Limits, Origin, Topics};
use super::journal::{self, Answer, Journal, Key};
use super::link::{self, Ack, Incoming, Link, Message, Props, Version};
use crate::service::{Canceller, Event, Handle, Ticket};
use bytes::Bytes;
use rumqttc::v5::mqttbytes::QoS;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};

/// How to reach the broker and what to say to it.
#[derive(Clone)]
pub struct Settings {
    pub host: String,
    pub port: u16,
    pub client_id: String,
    pub credentials: Option<(String, String)>,
    /// Reads the password again (`mqtt.password_file`): before each new attempt, so that a
    /// rotated password is used without a restart.
    pub reread_password: Option<Reread>,
    pub tls: Option<Arc<rustls::ClientConfig>>,
    pub keepalive: Duration,
    pub topics: Topics,
    pub qos: QoS,
    /// Its `max_payload` sizes the connection's packets (a change needs a restart); the rest
    /// is taken from [`Shared::limits`], which a reload changes.
    pub limits: Limits,
    pub role: Role,
    pub version: Version,
    /// Told of the connection: `None` once connected, `Some(why)` when an attempt failed
    /// (one line for a person, with the delay before the next attempt).
    pub on_link: Option<OnLink>,
    /// Tests only (the `test-hooks` feature): SIGKILL right after the answer to this request id
    /// is journaled.
    #[cfg(feature = "test-hooks")]
    pub test_kill_after_journal: Option<String>,
}

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

/// See [`Settings::reread_password`].
pub type Reread = Arc<dyn Fn() -> Result<String, String> + Send + Sync>;

/// See [`Settings::on_link`].
pub type OnLink = Arc<dyn Fn(Option<&str>) + Send + Sync>;

/// Retained status JSON, written by the daemon, published here on change.
pub type StatusRx = watch::Receiver<Vec<u8>>;

/// The answers published, shared by a device's connections.
pub type SharedJournal = Arc<Mutex<Journal>>;

/// What a device's connections share: the service they feed, the ids they give requests that
/// have none, and the journal of answers.
#[derive(Clone)]
pub struct Shared {
    pub service: Handle,
    pub ids: Arc<dyn Fn() -> String + Send + Sync>,
    pub journal: SharedJournal,
    /// The bounds requests are held to now (a reload sends new ones).
    pub limits: watch::Receiver<Limits>,
}

/// Requests received and not yet answered.
///
/// Their deliveries, by key (a count: a client may send the same request twice on purpose): a
/// broker that restarts resends the requests it has not seen acknowledged; one still in the
/// queue here is not taken a second time. And their cancellers, by request id, for the cancel
/// topic.
#[derive(Default)]
struct InFlight {
    deliveries: Mutex<std::collections::HashMap<Key, usize>>,
    cancels: Mutex<Vec<(String, Canceller)>>,
}

impl InFlight {
    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<Key, usize>> {
        self.deliveries.lock().unwrap_or_else(|e| e.into_inner())
    }
    fn cancels(&self) -> std::sync::MutexGuard<'_, Vec<(String, Canceller)>> {
        self.cancels.lock().unwrap_or_else(|e| e.into_inner())
    }
    /// Keeps `c` for the cancel topic; forgets the answered ones (so the list is bounded by
    /// the requests in the service).
    fn submitted(&self, id: &str, c: Canceller) {
        let mut cs = self.cancels();
        cs.retain(|(_, c)| !c.is_ended());
        cs.push((id.to_owned(), c));
    }
    /// Cancels every request in flight with this id; how many there were.
    fn cancel(&self, id: &str) -> usize {
        let cs = self.cancels();
        let mine: Vec<&Canceller> = cs.iter().filter(|(i, _)| i == id).map(|(_, c)| c).collect();
        for c in &mine {
            c.cancel();
        }
        mine.len()
    }
    fn add(&self, k: Key) {
        *self.lock().entry(k).or_default() += 1;
    }
    fn contains(&self, k: &Key) -> bool {
        self.lock().contains_key(k)
    }
    fn done(&self, k: &Key) {
        let mut m = self.lock();
        if let Some(n) = m.get_mut(k) {
            *n -= 1;
            if *n == 0 {
                m.remove(k);
            }
        }
    }
}

/// Which broker session a delivery came in. A packet id means something only within the
/// session the broker gave it in: once the broker has forgotten that session (it restarted
/// without persistence, or this is the fleet's clean session reconnecting), an answer that was
/// still being computed must not acknowledge its old id on the new connection, where the
/// broker may have reused it for another request already: that one would then count as
/// answered, and be lost if the daemon died before answering it.
#[derive(Default)]
struct SessionCount(std::sync::atomic::AtomicU64);

impl SessionCount {
    fn now(&self) -> u64 {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }
    /// A ConnAck without a session: the ids of every earlier delivery are void.
    fn renew(&self) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// What the publisher task is asked to do.
enum Out {
    /// An event of the request `ctx` answers.
    Event(Arc<Ctx>, Event),
    /// An answer made here (a refused request): publish it, then acknowledge `ack`.
    Reply(Arc<Ctx>, Vec<u8>),
}

/// The reply address of one request, and the publish to acknowledge when it is answered.
struct Ctx {
    id: String,
    topic: String,
    correlation: Option<Bytes>,
    /// The request named a response topic (an MQTT 5 client): the answer carries properties.
    /// Without one it carries none, so that a 3.1.1 subscriber can take it (rumqttd panics
    /// forwarding properties to a 3.1.1 client).
    properties: bool,
    stream: bool,
    /// The delivery, for the journal.
    key: Key,
    ack: Option<Ack>,
    /// The [`SessionCount`] the delivery came in: its `ack` is void in any other.
    session: u64,
}

/// Reads one request's ticket into the publisher's channel, waiting while that is full (a
/// stalled broker): the ticket then fills, and the worker waits for it as for any slow reader.
async fn forward(mut t: Ticket, ctx: Arc<Ctx>, tx: mpsc::Sender<Out>) {
    while let Some(ev) = t.recv().await {
        if tx.send(Out::Event(Arc::clone(&ctx), ev)).await.is_err() {
            // The client is stopping: dropping the ticket cancels the answer.
            break;
        }
    }
}

/// The retained status a device leaves when it goes: called for the will when the client
/// connects, and again when it stops, so the status it leaves has its last counters and uptime.
pub type Offline = Arc<dyn Fn() -> Vec<u8> + Send + Sync>;

/// Runs the client until `stop` turns true: connects (again and again, with backoff),
/// subscribes, feeds requests to `service`, publishes answers and the status. Before it
/// returns it publishes `offline()` (retained) and disconnects.
pub async fn run(
    s: Settings,
    shared: Shared,
    mut status: StatusRx,
    offline: Offline,
    mut stop: watch::Receiver<bool>,
    ready: tokio::sync::oneshot::Sender<()>,
) {
    let device = s.role == Role::Device;
    // Fired once requests can arrive: subscribed, or the broker kept our subscriptions.
    let mut ready = Some(ready);
    let (client, mut eventloop) = link::new(&link::Options {
        version: s.version,
        client_id: &s.client_id,
        host: &s.host,
        port: s.port,
        keepalive: s.keepalive,
        // Requests published while the daemon restarts wait for it at the broker (a day, in
        // MQTT 5). The fleet's session ends with its connection.
        persistent: device,
        session_expiry_s: 86_400,
        // Twice the payload limit: a request somewhat over it is still received, and answered
        // too_large; the broker discards a bigger one (MQTT 5 maximum packet size).
        max_packet: s.limits.max_payload.saturating_mul(2).saturating_add(4096),
        inflight: 32,
        will: device.then(|| (s.topics.status.as_str(), offline())),
        credentials: s
            .credentials
            .as_ref()
            .map(|(u, p)| (u.as_str(), p.as_str())),
        tls: s.tls.clone(),
    });
    let (tx, rx) = mpsc::channel::<Out>(256);
    let inflight = Arc::new(InFlight::default());
    let sessions = Arc::new(SessionCount::default());
    let publisher = tokio::spawn(
        Publisher {
            client: client.clone(),
            journal: Arc::clone(&shared.journal),
            qos: s.qos,
            inflight: Arc::clone(&inflight),
            sessions: Arc::clone(&sessions),
            #[cfg(feature = "test-hooks")]
            kill_after_journal: s.test_kill_after_journal.clone(),
        }
        .run(rx),
    );
    // The status goes out once requests can arrive (a client that sees "online" may ask at
    // once), again after every reconnection (a broker restarted without persistence lost the
    // retained one), and whenever it changes.
    let (up_tx, mut up) = watch::channel(0u64);
    let status_client = client.clone();
    let status_topic = s.topics.status.clone();
    let status_task = tokio::spawn(async move {
        loop {
            tokio::select! {
                r = up.changed() => if r.is_err() { break },
                r = status.changed() => if r.is_err() { break },
            }
            // The fleet connection publishes no status: the device's own does.
            if *up.borrow_and_update() == 0 || !device {
                continue;
            }
            let body = status.borrow_and_update().clone();
            if status_client
                .publish(&status_topic, QoS::AtLeastOnce, true, body, None)
                .await
                .is_err()
            {
                break;
            }
        }
    });
    let connected = |ready: &mut Option<tokio::sync::oneshot::Sender<()>>| {
        if let Some(r) = ready.take() {
            let _ = r.send(());
        }
        up_tx.send_modify(|n| *n += 1);
    };

    let mut backoff = Backoff::new();
    loop {
        let ev = tokio::select! {
            ev = eventloop.poll() => ev,
            _ = stop.changed() => break,
        };
        match ev {
            Ok(Incoming::ConnAck { session_present }) => {
                backoff.reset();
                if let Some(f) = &s.on_link {
                    f(None);
                }
                tracing::info!(broker = %format!("{}:{}", s.host, s.port), role = ?s.role, version = ?s.version, session_present, "MQTT connected");
                if session_present {
                    connected(&mut ready);
                } else {
                    sessions.renew();
                    subscribe(&client, &s.topics, s.role, s.qos);
                }
            }
            // Our only SUBSCRIBE of a connection: every topic is in place.
            Ok(Incoming::SubAck) => connected(&mut ready),
            Ok(Incoming::Publish(p)) => {
                on_publish(&s, &shared, &client, &tx, &inflight, sessions.now(), *p);
            }
            Ok(_) => {}
            Err(e) => {
                let wait = backoff.next();
                let (why, ms) = (&e.message, wait.as_millis() as u64);
                let broker = format!("{}:{}", s.host, s.port);
                // The broker said no, or a certificate: that lasts until someone fixes it.
                if e.lasting {
                    tracing::error!(broker = %broker, retry_in_ms = ms, "MQTT connection: {why}");
                } else {
                    tracing::warn!(broker = %broker, retry_in_ms = ms, "MQTT connection: {why}");
                }
                if let Some(f) = &s.on_link {
                    f(Some(&format!("{why}; retrying in {ms} ms")));
                }
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = stop.changed() => break,
                }
                if let (Some((user, _)), Some(read)) = (&s.credentials, &s.reread_password) {
                    match read() {
                        Ok(p) => {
                            eventloop.set_credentials(user, &p);
                        }
                        Err(e) => tracing::warn!("the password is not read again: {e}"),
                    }
                }
            }
        }
    }
    // Graceful. The service has stopped (its last answer's events are queued to the
    // publisher): let the publisher send them and acknowledge their requests, polling the
    // connection meanwhile (its publishes go through the poll), within a bound; a request
    // whose acknowledgement did not go out is delivered again at the next start.
    status_task.abort();
    drop(tx);
    let mut publisher = publisher;
    let flush = tokio::time::sleep(Duration::from_secs(3));
    tokio::pin!(flush);
    loop {
        tokio::select! {
            _ = &mut publisher => break,
            _ = &mut flush => {
                tracing::warn!("stopping before every answer was published");
                publisher.abort();
                break;
            }
            ev = eventloop.poll() => if ev.is_err() { publisher.abort(); break },
        }
    }
    // The offline status ourselves (a clean disconnect suppresses the will), then poll until
    // it is out or a bound passes.
    if device {
        let _ = client.try_publish(&s.topics.status, QoS::AtLeastOnce, true, offline(), None);
    }
    let _ = client.try_disconnect();
    let until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < until {
        match tokio::time::timeout(Duration::from_millis(500), eventloop.poll()).await {
            Ok(Ok(Incoming::Disconnected)) | Ok(Err(_)) | Err(_) => {
                break;
            }
            Ok(Ok(_)) => {}
        }
    }
}

/// Subscribes to every topic of the role in one SUBSCRIBE, so one SUBACK says all of them are
/// in place.
fn subscribe(client: &Link, t: &Topics, role: Role, qos: QoS) {
    let topics = match role {
        Role::Device => vec![t.request.clone(), t.cancel.clone()],
        Role::Fleet => t
            .fleet_request
            .iter()
            .chain(&t.fleet_cancel)
            .cloned()
            .collect(),
    };
    if client.try_subscribe(&topics, qos).is_err() {
        tracing::error!(?topics, "cannot subscribe: the client has stopped");
    }
}

/// A message arrived: a request (queued, or answered at once when refused) or a cancel.
fn on_publish(
    s: &Settings,
    shared: &Shared,
    client: &Link,
    tx: &mpsc::Sender<Out>,
    inflight: &InFlight,
    session: u64,
    p: Message,
) {
    let service = &shared.service;
    let topic = p.topic.clone();
    // A fleet cancel reaches every member; the one answering the request cancels it.
    if topic == s.topics.cancel || s.topics.fleet_cancel.as_deref() == Some(topic.as_str()) {
        match contract::parse_cancel(&p.payload) {
            // A ticket's cancel never waits: fine on this task.
            Ok(id) => {
                let found = inflight.cancel(&id);
                tracing::info!(request = id, found, "cancel");
            }
            Err(e) => tracing::warn!("cancel refused: {e}"),
        }
        let _ = client.try_ack(&p.ack);
        return;
    }
    let origin = if s.topics.fleet_topic.as_deref() == Some(topic.as_str()) {
        Origin::Fleet
    } else if topic == s.topics.request {
        Origin::Device
    } else {
        tracing::warn!(topic, "message on a topic we did not subscribe to: ignored");
        let _ = client.try_ack(&p.ack);
        return;
    };
    let key = journal::delivery_key(
        p.topic.as_bytes(),
        &p.payload,
        p.response_topic.as_deref(),
        p.correlation.as_deref(),
    );
    // A redelivery (DUP: the broker sent it before and had no acknowledgement) whose answer
    // was published is answered with that answer again, not recomputed. A first delivery is
    // never looked up: a client may well send the same request twice on purpose.
    if p.dup {
        let stored = shared
            .journal
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            .cloned();
        if let Some(a) = stored {
            tracing::info!(
                topic,
                "redelivered request: its stored answer is sent again"
            );
            let props = answer_properties(a.properties, a.correlation.clone());
            let _ = client.try_publish(&a.topic, s.qos, false, a.payload, props);
            let _ = client.try_ack(&p.ack);
            return;
        }
        if inflight.contains(&key) {
            // Its answer, when published, acknowledges this delivery (the same packet id).
            tracing::info!(
                topic,
                "redelivered request still being answered: not taken twice"
            );
            return;
        }
    }
    inflight.add(key);
    // The client's own response topic keys the queue's fairness between clients (and names
    // the asker in the audit trail); a 3.1.1 client has none, and is named by the topic.
    let source = format!("mqtt:{}", p.response_topic.as_deref().unwrap_or(&topic));
    let ids = Arc::clone(&shared.ids);
    let parsed = contract::parse_request(
        &p.payload,
        origin,
        &source,
        move || ids(),
        &shared.limits.borrow().clone(),
        Instant::now(),
    );
    let reply_to = |id: &str| {
        p.response_topic
            .clone()
            .unwrap_or_else(|| s.topics.response(id))
    };
    let ctx = |id: &str, stream: bool| {
        Arc::new(Ctx {
            id: id.to_owned(),
            topic: reply_to(id),
            correlation: p.correlation.clone(),
            properties: p.response_topic.is_some(),
            stream,
            key,
            ack: Some(p.ack.clone()),
            session,
        })
    };
    match parsed {
        Err(refused) => {
            tracing::info!(id = refused.id.as_deref().unwrap_or("?"), code = %refused.error.code, "request refused: {}", refused.error);
            let id = refused.id.clone().unwrap_or_default();
            let body = contract::error_json(refused.id.as_deref(), &refused.error);
            // An unreadable id gets the answer on the response topic, or a shared error topic.
            let c = ctx(if id.is_empty() { "error" } else { &id }, false);
            queue_reply(tx, Out::Reply(c, body));
        }
        Ok(parsed) => {
            let id = parsed.request.id.clone();
            let c = ctx(&id, parsed.stream);
            match service.submit(parsed.request) {
                Ok(t) => {
                    inflight.submitted(&id, t.canceller());
                    tokio::spawn(forward(t, c, tx.clone()));
                }
                Err(e) => queue_reply(tx, Out::Reply(c, contract::error_json(Some(&id), &e))),
            }
        }
    }
}

/// Hands a refusal to the publisher without blocking the poll loop and without dropping it.
///
/// The channel is full while the publisher waits on a slow broker. A refusal dropped there was
/// never published, so its request was never acknowledged either, and the broker sends only so
/// many unacknowledged requests (Mosquitto: 20) before it stops sending any: a burst of
/// refusals made the device deaf until it reconnected. One that finds the channel full waits
/// in a task of its own; the broker's in-flight window bounds how many do.
fn queue_reply(tx: &mpsc::Sender<Out>, out: Out) {
    match tx.try_send(out) {
        Ok(()) => {}
        Err(mpsc::error::TrySendError::Full(out)) => {
            let tx = tx.clone();
            tokio::spawn(async move {
                let _ = tx.send(out).await;
            });
        }
        // The client is stopping: unacknowledged, the request is delivered again.
        Err(mpsc::error::TrySendError::Closed(_)) => {}
    }
}

/// Publishes the events of every request in the order they come. A request's final message
/// is first written to the journal (synced), then published, then the request is
/// acknowledged: whatever point a crash stops this at, a redelivery finds the answer or finds
/// a request never answered.
struct Publisher {
    client: Link,
    journal: SharedJournal,
    qos: QoS,
    inflight: Arc<InFlight>,
    sessions: Arc<SessionCount>,
    #[cfg(feature = "test-hooks")]
    kill_after_journal: Option<String>,
}

impl Publisher {
    async fn run(self, mut rx: mpsc::Receiver<Out>) {
        let Publisher {
            client,
            journal,
            qos,
            inflight,
            sessions,
            ..
        } = &self;
        // Chunks so far of each streaming request: (id, next seq).
        let mut seqs: Vec<(String, u64)> = Vec::new();
        while let Some(out) = rx.recv().await {
            let (ctx, body, last) = match out {
                Out::Reply(ctx, body) => (ctx, body, true),
                Out::Event(ctx, Event::Text(chunk)) => {
                    if !ctx.stream {
                        continue;
                    }
                    let seq = match seqs.iter_mut().find(|(i, _)| *i == ctx.id) {
                        Some((_, n)) => {
                            *n += 1;
                            *n - 1
                        }
                        None => {
                            seqs.push((ctx.id.clone(), 1));
                            0
                        }
                    };
                    let body = contract::chunk_json(&ctx.id, seq, &chunk);
                    (ctx, body, false)
                }
                Out::Event(ctx, Event::Done(d)) => (ctx, contract::done_json(&d), true),
                Out::Event(ctx, Event::Error(e)) => {
                    let body = contract::error_json(Some(&ctx.id), &e);
                    (ctx, body, true)
                }
            };
            if last {
                seqs.retain(|(i, _)| *i != ctx.id);
                let answer = Answer {
                    topic: ctx.topic.clone(),
                    properties: ctx.properties,
                    correlation: ctx.correlation.clone(),
                    payload: body.clone(),
                };
                // The sync blocks: off the I/O thread.
                let j = Arc::clone(journal);
                let key = ctx.key;
                let kept = tokio::task::spawn_blocking(move || {
                    j.lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .record(key, answer)
                })
                .await;
                match kept {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => tracing::error!(
                        request = ctx.id,
                        "{e}: the answer is published, but a redelivery would compute it again"
                    ),
                    Err(e) => tracing::error!(request = ctx.id, "answer journal: {e}"),
                }
                #[cfg(feature = "test-hooks")]
                if self.kill_after_journal.as_deref() == Some(ctx.id.as_str()) {
                    tracing::warn!(request = ctx.id, "test hook: SIGKILL after the journal");
                    let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
                }
            }
            let props = answer_properties(ctx.properties, ctx.correlation.clone());
            let sent = client.publish(&ctx.topic, *qos, false, body, props).await;
            if sent.is_err() {
                tracing::error!(
                    request = ctx.id,
                    "cannot publish the answer: the client has stopped"
                );
                return;
            }
            if last {
                match &ctx.ack {
                    // The broker forgot the session this came in, and with it the delivery: it
                    // will not send it again, and its packet id may now be another request's.
                    Some(_) if ctx.session != sessions.now() => tracing::info!(
                        request = ctx.id,
                        "answered after the broker lost its session: nothing to acknowledge"
                    ),
                    Some(ack) if client.ack(ack).await.is_err() => tracing::warn!(
                        request = ctx.id,
                        "cannot acknowledge the request: the client has stopped"
                    ),
                    _ => {}
                }
                inflight.done(&ctx.key);
            }
        }
    }
}

/// The properties of an answer: none for a request without a response topic (see [`Ctx`]).
fn answer_properties(properties: bool, correlation: Option<Bytes>) -> Option<Props> {
    properties.then_some(Props { correlation })
}

/// Reconnect delays: 250 ms doubling to 30 s, reset by a ConnAck.
struct Backoff(Duration);

impl Backoff {
    const FIRST: Duration = Duration::from_millis(250);
    const MAX: Duration = Duration::from_secs(30);
    fn new() -> Backoff {
        Backoff(Backoff::FIRST)
    }
    fn reset(&mut self) {
        self.0 = Backoff::FIRST;
    }
    fn next(&mut self) -> Duration {
        let d = self.0;
        self.0 = (self.0 * 2).min(Backoff::MAX);
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(id: &str) -> Out {
        let ctx = Ctx {
            id: id.to_owned(),
            topic: format!("edgellm/dev/response/{id}"),
            correlation: None,
            properties: false,
            stream: false,
            key: [0; 32],
            ack: None,
            session: 0,
        };
        Out::Reply(Arc::new(ctx), Vec::new())
    }

    fn id(out: &Out) -> &str {
        match out {
            Out::Reply(c, _) | Out::Event(c, _) => &c.id,
        }
    }

    #[test]
    fn a_refusal_that_finds_the_channel_full_waits_for_room_and_is_not_dropped() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let (tx, mut rx) = mpsc::channel::<Out>(2);
            for i in 0..5 {
                queue_reply(&tx, refusal(&format!("r{i}")));
            }
            let mut got = Vec::new();
            for _ in 0..5 {
                let out = tokio::time::timeout(Duration::from_secs(5), rx.recv())
                    .await
                    .expect("a refusal was dropped")
                    .unwrap();
                got.push(id(&out).to_owned());
            }
            got.sort();
            assert_eq!(got, ["r0", "r1", "r2", "r3", "r4"]);
            // Once the client stops, a refusal is let go: its request is delivered again.
            drop(rx);
            queue_reply(&tx, refusal("late"));
        });
    }
}
