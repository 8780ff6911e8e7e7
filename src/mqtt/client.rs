//! The MQTT client loop (rumqttc, MQTT 5): a thin tokio wrapper around [`super::contract`].
//!
//! One task polls the connection and does nothing else: it never awaits a publish (rumqttc's
//! request channel is drained by that same poll, so awaiting it there can deadlock). Requests
//! go to the service with a [`Sink`] that hands each event to the publisher task, which
//! publishes chunks and the final answer and only then acknowledges the request to the broker.
//! So a request in flight when the daemon dies is delivered again (QoS 1, a persistent
//! session), and a redelivered one whose answer was already published is answered from the
//! [`Answered`] cache, not recomputed.
//!
//! What rumqttc needs, measured with it: the maximum packet size set from the payload limit
//! (its 10 KiB default drops the connection on a larger request); outgoing inflight capped
//! (the v5 default preallocates ~14 MB); a backoff between reconnects of our own (poll fails
//! at once and repeatedly while the broker is down); subscriptions renewed on every ConnAck
//! without a session present; the retained offline status published by us before a graceful
//! disconnect (a clean disconnect suppresses the will).

use super::contract::{self, Limits, Origin, Topics};
use crate::service::worker::Sink;
use crate::service::{Event, Handle};
use bytes::Bytes;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{LastWill, Packet, Publish, PublishProperties};
use rumqttc::v5::{AsyncClient, Event as MqttEvent, MqttOptions};
use std::collections::VecDeque;
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
    pub limits: Limits,
    /// Told of the connection: `None` once connected, `Some(why)` when an attempt failed
    /// (one line for a person, with the delay before the next attempt).
    pub on_link: Option<OnLink>,
}

/// See [`Settings::reread_password`].
pub type Reread = Arc<dyn Fn() -> Result<String, String> + Send + Sync>;

/// See [`Settings::on_link`].
pub type OnLink = Arc<dyn Fn(Option<&str>) + Send + Sync>;

/// Retained status JSON, written by the daemon, published here on change.
pub type StatusRx = watch::Receiver<Vec<u8>>;

/// Answers already published, by request id: a redelivered request is answered from here.
#[derive(Default)]
pub struct Answered {
    entries: VecDeque<(String, Vec<Publish>)>,
}

/// Most answers kept for redeliveries.
const ANSWERED: usize = 64;

impl Answered {
    fn get(&self, id: &str) -> Option<&[Publish]> {
        self.entries
            .iter()
            .find(|(i, _)| i == id)
            .map(|(_, p)| p.as_slice())
    }
    fn insert(&mut self, id: String, answer: Vec<Publish>) {
        if self.entries.len() >= ANSWERED {
            self.entries.pop_front();
        }
        self.entries.push_back((id, answer));
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
    ack: Option<Publish>,
}

/// The service's sink for one request: events go to the publisher task. Called on the worker
/// thread, so it may block (the channel is bounded: a stalled broker slows the answer down
/// instead of growing memory).
struct ToPublisher {
    ctx: Arc<Ctx>,
    tx: mpsc::Sender<Out>,
}

impl Sink for ToPublisher {
    fn send(&mut self, ev: Event) -> bool {
        self.tx
            .blocking_send(Out::Event(Arc::clone(&self.ctx), ev))
            .is_ok()
    }
}

/// Runs the client until `stop` turns true: connects (again and again, with backoff),
/// subscribes, feeds requests to `service`, publishes answers and the status. Before it
/// returns it publishes `offline` (retained) and disconnects.
pub async fn run(
    s: Settings,
    service: Handle,
    mut status: StatusRx,
    offline: Vec<u8>,
    mut stop: watch::Receiver<bool>,
    ids: Arc<dyn Fn() -> String + Send + Sync>,
    ready: tokio::sync::oneshot::Sender<()>,
) {
    // Fired once requests can arrive: subscribed, or the broker kept our subscriptions.
    let mut ready = Some(ready);
    let mut opts = MqttOptions::new(&s.client_id, &s.host, s.port);
    opts.set_keep_alive(s.keepalive)
        .set_clean_start(false)
        // A day: requests published while the daemon restarts wait for it at the broker.
        .set_session_expiry_interval(Some(86_400))
        .set_manual_acks(true)
        // Twice the payload limit: a request somewhat over it is still received, and answered
        // too_large; the broker discards a bigger one (MQTT 5 maximum packet size).
        .set_max_packet_size(Some(
            u32::try_from(s.limits.max_payload.saturating_mul(2).saturating_add(4096))
                .unwrap_or(u32::MAX),
        ))
        .set_outgoing_inflight_upper_limit(32)
        .set_last_will(LastWill::new(
            &s.topics.status,
            offline.clone(),
            QoS::AtLeastOnce,
            true,
            None,
        ));
    if let Some((u, p)) = &s.credentials {
        opts.set_credentials(u, p);
    }
    if let Some(tls) = &s.tls {
        opts.set_transport(rumqttc::Transport::tls_with_config(
            rumqttc::TlsConfiguration::Rustls(Arc::clone(tls)),
        ));
    }
    let (client, mut eventloop) = AsyncClient::new(opts, 64);
    let (tx, rx) = mpsc::channel::<Out>(256);
    let answered = Arc::new(Mutex::new(Answered::default()));
    let publisher = tokio::spawn(publish_answers(
        client.clone(),
        rx,
        Arc::clone(&answered),
        s.qos,
    ));
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
            if *up.borrow_and_update() == 0 {
                continue;
            }
            let body = status.borrow_and_update().clone();
            if status_client
                .publish(&status_topic, QoS::AtLeastOnce, true, body)
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
            Ok(MqttEvent::Incoming(Packet::ConnAck(ack))) => {
                backoff.reset();
                if let Some(f) = &s.on_link {
                    f(None);
                }
                tracing::info!(broker = %format!("{}:{}", s.host, s.port), session_present = ack.session_present, "MQTT connected");
                if ack.session_present {
                    connected(&mut ready);
                } else {
                    subscribe(&client, &s.topics, s.qos);
                }
            }
            // Our only SUBSCRIBE of a connection: every topic is in place.
            Ok(MqttEvent::Incoming(Packet::SubAck(_))) => connected(&mut ready),
            Ok(MqttEvent::Incoming(Packet::Publish(p))) => {
                on_publish(&s, &service, &client, &tx, &answered, &ids, p);
            }
            Ok(_) => {}
            Err(e) => {
                let wait = backoff.next();
                let (why, ms) = (super::failure::describe(&e), wait.as_millis() as u64);
                let broker = format!("{}:{}", s.host, s.port);
                // The broker said no, or a certificate: that lasts until someone fixes it.
                if super::failure::lasting(&e) {
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
                            eventloop.options.set_credentials(user, p);
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
    let _ = client.try_publish(&s.topics.status, QoS::AtLeastOnce, true, offline);
    let _ = client.try_disconnect();
    let until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < until {
        match tokio::time::timeout(Duration::from_millis(500), eventloop.poll()).await {
            Ok(Ok(MqttEvent::Outgoing(rumqttc::Outgoing::Disconnect))) | Ok(Err(_)) | Err(_) => {
                break;
            }
            Ok(Ok(_)) => {}
        }
    }
}

/// Subscribes to every topic in one SUBSCRIBE, so one SUBACK says all of them are in place.
fn subscribe(client: &AsyncClient, t: &Topics, qos: QoS) {
    let mut topics = vec![t.request.clone(), t.cancel.clone()];
    topics.extend(t.fleet_request.clone());
    let filters = topics
        .iter()
        .map(|topic| rumqttc::v5::mqttbytes::v5::Filter::new(topic, qos));
    if let Err(e) = client.try_subscribe_many(filters) {
        tracing::error!(?topics, "cannot subscribe: {e}");
    }
}

/// A message arrived: a request (queued, or answered at once when refused) or a cancel.
fn on_publish(
    s: &Settings,
    service: &Handle,
    client: &AsyncClient,
    tx: &mpsc::Sender<Out>,
    answered: &Mutex<Answered>,
    ids: &Arc<dyn Fn() -> String + Send + Sync>,
    p: Publish,
) {
    let topic = String::from_utf8_lossy(&p.topic).into_owned();
    if topic == s.topics.cancel {
        match contract::parse_cancel(&p.payload) {
            // Off this task: cancelling a waiting request answers it through its sink, which
            // blocks (a blocking send on the runtime's own thread panics, and took the MQTT
            // loop down with it).
            Ok(id) => {
                let service = service.clone();
                tokio::task::spawn_blocking(move || {
                    let found = service.cancel(&id);
                    tracing::info!(request = id, found, "cancel");
                });
            }
            Err(e) => tracing::warn!("cancel refused: {e}"),
        }
        let _ = client.try_ack(&p);
        return;
    }
    let origin = if s.topics.fleet_topic.as_deref() == Some(topic.as_str()) {
        Origin::Fleet
    } else if topic == s.topics.request {
        Origin::Device
    } else {
        tracing::warn!(topic, "message on a topic we did not subscribe to: ignored");
        let _ = client.try_ack(&p);
        return;
    };
    let props = p.properties.clone().unwrap_or_default();
    // The client's own response topic keys the queue's fairness between clients.
    let source = props
        .response_topic
        .clone()
        .unwrap_or_else(|| "mqtt".to_owned());
    let ids = Arc::clone(ids);
    let parsed = contract::parse_request(
        &p.payload,
        origin,
        &source,
        move || ids(),
        &s.limits,
        Instant::now(),
    );
    let reply_to = |id: &str| {
        props
            .response_topic
            .clone()
            .unwrap_or_else(|| s.topics.response(id))
    };
    let ctx = |id: &str, stream: bool| {
        Arc::new(Ctx {
            id: id.to_owned(),
            topic: reply_to(id),
            correlation: props.correlation_data.clone(),
            properties: props.response_topic.is_some(),
            stream,
            ack: Some(p.clone()),
        })
    };
    match parsed {
        Err(refused) => {
            tracing::info!(id = refused.id.as_deref().unwrap_or("?"), code = %refused.error.code, "request refused: {}", refused.error);
            let id = refused.id.clone().unwrap_or_default();
            let body = contract::error_json(refused.id.as_deref(), &refused.error);
            // An unreadable id gets the answer on the response topic, or a shared error topic.
            let c = ctx(if id.is_empty() { "error" } else { &id }, false);
            let _ = tx.try_send(Out::Reply(c, body));
        }
        Ok(parsed) => {
            let id = parsed.request.id.clone();
            if p.dup
                && let Some(answer) = answered.lock().unwrap_or_else(|e| e.into_inner()).get(&id)
            {
                tracing::info!(
                    request = id,
                    "redelivered request answered again from the cache"
                );
                for a in answer {
                    let topic = String::from_utf8_lossy(&a.topic).into_owned();
                    let _ = match a.properties.clone() {
                        Some(p) => client.try_publish_with_properties(
                            topic,
                            a.qos,
                            false,
                            a.payload.clone(),
                            p,
                        ),
                        None => client.try_publish(topic, a.qos, false, a.payload.clone()),
                    };
                }
                let _ = client.try_ack(&p);
                return;
            }
            let c = ctx(&id, parsed.stream);
            let sink = ToPublisher {
                ctx: Arc::clone(&c),
                tx: tx.clone(),
            };
            if let Err(e) = service.submit(parsed.request, Box::new(sink)) {
                let _ = tx.try_send(Out::Reply(c, contract::error_json(Some(&id), &e)));
            }
        }
    }
}

/// Publishes the events of every request in the order they come; after a request's last
/// event, acknowledges it to the broker and remembers the answer for redeliveries.
async fn publish_answers(
    client: AsyncClient,
    mut rx: mpsc::Receiver<Out>,
    answered: Arc<Mutex<Answered>>,
    qos: QoS,
) {
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
        let props = ctx.properties.then(|| PublishProperties {
            correlation_data: ctx.correlation.clone(),
            content_type: Some("application/json".into()),
            ..Default::default()
        });
        let publish = Publish::new(&ctx.topic, qos, body.clone(), props.clone());
        let sent = match props {
            Some(p) => {
                client
                    .publish_with_properties(&ctx.topic, qos, false, body, p)
                    .await
            }
            None => client.publish(&ctx.topic, qos, false, body).await,
        };
        if sent.is_err() {
            tracing::error!(
                request = ctx.id,
                "cannot publish the answer: the client has stopped"
            );
            return;
        }
        if last {
            seqs.retain(|(i, _)| *i != ctx.id);
            answered
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(ctx.id.clone(), vec![publish]);
            if let Some(ack) = &ctx.ack
                && let Err(e) = client.ack(ack).await
            {
                tracing::warn!(request = ctx.id, "cannot acknowledge the request: {e}");
            }
        }
    }
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
