//! The MQTT client loop (rumqttc, MQTT 5): a thin tokio wrapper around [`super::core`], which
//! holds every delivery rule (duplicates, epochs, sequence numbers, ack after publish). This
//! file only polls, feeds the core and executes the actions it returns.
//!
//! One task polls the connection and does nothing else: it never awaits a publish (rumqttc's
//! request channel is drained by that same poll, so awaiting it there can deadlock); it
//! subscribes, submits requests and cancels them. Each request's [`Ticket`] is read by a task
//! of its own that hands the events to the publisher task, which publishes what the core makes
//! of them: chunks, and final messages journaled, published and only then acknowledged. Every
//! channel on the way is bounded: a stalled broker holds the answer back through the ticket,
//! where the service's one backpressure policy applies. So a request in flight when the
//! daemon dies is delivered again (QoS 1, a persistent session), and a redelivered one whose
//! answer was already published is answered from the [`Journal`], not recomputed.
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

use super::contract::{Limits, Topics};
pub use super::core::Role;
use super::core::{self, Action, Core, Delivery};
use super::journal::{Answer, Journal, Key};
use super::link::{self, Ack, Incoming, Link, Message, Version};
use crate::service::{Canceller, Event, Handle, Ticket};
use rumqttc::v5::mqttbytes::QoS;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
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

/// The retained status a device leaves when it goes: called for the will when the client
/// connects, and again when it stops, so the status it leaves has its last counters and uptime.
pub type Offline = Arc<dyn Fn() -> Vec<u8> + Send + Sync>;

/// The delivery rules of one connection, shared by the loop that polls and the task that
/// publishes (a `std` mutex: each call is a pure step, never held across an await).
type SharedCore = Arc<Mutex<Core<Ack>>>;

fn lock(c: &SharedCore) -> MutexGuard<'_, Core<Ack>> {
    // A step that panicked left the maps consistent (each mutation is one call): keep serving.
    c.lock().unwrap_or_else(|e| e.into_inner())
}

/// What the publisher task is asked to do.
enum Out {
    /// An event of the request of this token.
    Event(u64, Event),
    /// Publishes, acknowledgements and final messages the core asked for, in this order.
    Do(Vec<Action<Ack>>),
}

/// What the core reads: the journal, fresh ids, the limits now, the clock.
struct CoreEnv<'a>(&'a Shared);

impl core::Env for CoreEnv<'_> {
    fn stored(&self, key: &Key) -> Option<Answer> {
        let j = self.0.journal.lock().unwrap_or_else(|e| e.into_inner());
        j.get(key).cloned()
    }
    fn fresh_id(&mut self) -> String {
        (self.0.ids)()
    }
    fn limits(&self) -> Limits {
        self.0.limits.borrow().clone()
    }
    fn now(&self) -> Instant {
        Instant::now()
    }
}

fn delivery(m: Message) -> Delivery<Ack> {
    Delivery {
        topic: m.topic,
        payload: m.payload,
        dup: m.dup,
        response_topic: m.response_topic,
        correlation: m.correlation,
        ack: m.ack,
    }
}

/// Reads one request's ticket into the publisher's channel, waiting while that is full (a
/// stalled broker): the ticket then fills, and the worker waits for it as for any slow reader.
async fn forward(mut t: Ticket, token: u64, tx: mpsc::Sender<Out>) {
    while let Some(ev) = t.recv().await {
        if tx.send(Out::Event(token, ev)).await.is_err() {
            // The client is stopping: dropping the ticket cancels the answer.
            break;
        }
    }
}

/// What the polling loop executes of the core's actions itself (subscribe, submit, cancel);
/// the rest goes to the publisher.
struct Executor<'a> {
    client: &'a Link,
    service: &'a Handle,
    core: &'a SharedCore,
    tx: &'a mpsc::Sender<Out>,
    qos: QoS,
    /// The requests in the service, by token: their cancellers.
    cancels: HashMap<u64, Canceller>,
}

impl Executor<'_> {
    /// Executes `actions`; returns whether one of them was [`Action::Ready`].
    fn run(&mut self, actions: Vec<Action<Ack>>) -> bool {
        let (mut ready, mut out) = (false, Vec::new());
        for a in actions {
            match a {
                Action::Subscribe(topics) => {
                    if self.client.try_subscribe(&topics, self.qos).is_err() {
                        tracing::error!(?topics, "cannot subscribe: the client has stopped");
                    }
                }
                Action::Ready => ready = true,
                Action::Submit(token, req) => match self.service.submit(*req) {
                    Ok(t) => {
                        // Forget the answered ones: the map is bounded by the service's queue.
                        self.cancels.retain(|_, c| !c.is_ended());
                        self.cancels.insert(token, t.canceller());
                        tokio::spawn(forward(t, token, self.tx.clone()));
                    }
                    Err(e) => out.extend(lock(self.core).on_refused(token, &e)),
                },
                Action::Cancel(token) => {
                    if let Some(c) = self.cancels.get(&token) {
                        c.cancel();
                    }
                }
                Action::Refused(r) => self.service.refused(r),
                a @ (Action::Publish(_) | Action::Ack(_) | Action::Final { .. }) => out.push(a),
            }
        }
        if !out.is_empty() {
            queue_out(self.tx, Out::Do(out));
        }
        ready
    }
}

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
        // A request somewhat over the payload limit is still received, and answered
        // too_large; the broker discards a bigger one (MQTT 5 maximum packet size).
        max_packet: super::contract::max_packet(s.limits.max_payload),
        inflight: 32,
        will: device.then(|| (s.topics.status.as_str(), offline())),
        credentials: s
            .credentials
            .as_ref()
            .map(|(u, p)| (u.as_str(), p.as_str())),
        tls: s.tls.clone(),
    });
    let (tx, rx) = mpsc::channel::<Out>(256);
    let core: SharedCore = Arc::new(Mutex::new(Core::new(s.topics.clone(), s.role)));
    let publisher = tokio::spawn(
        Publisher {
            client: client.clone(),
            journal: Arc::clone(&shared.journal),
            qos: s.qos,
            core: Arc::clone(&core),
            #[cfg(feature = "test-hooks")]
            kill_after_journal: s.test_kill_after_journal.clone(),
        }
        .run(rx),
    );
    let mut exec = Executor {
        client: &client,
        service: &shared.service,
        core: &core,
        tx: &tx,
        qos: s.qos,
        cancels: HashMap::new(),
    };
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
    // Whether the broker has the connection now: stopping without one has nothing to flush.
    let mut linked = false;
    loop {
        let ev = tokio::select! {
            ev = eventloop.poll() => ev,
            _ = stop.changed() => break,
        };
        match ev {
            Ok(Incoming::ConnAck { session_present }) => {
                backoff.reset();
                linked = true;
                if let Some(f) = &s.on_link {
                    f(None);
                }
                tracing::info!(broker = %format!("{}:{}", s.host, s.port), role = ?s.role, version = ?s.version, session_present, "MQTT connected");
                let actions = lock(&core).on_connack(session_present);
                if exec.run(actions) {
                    connected(&mut ready);
                }
            }
            Ok(Incoming::SubAck) => {
                let actions = lock(&core).on_suback();
                if exec.run(actions) {
                    connected(&mut ready);
                }
            }
            Ok(Incoming::Publish(p)) => {
                let actions = lock(&core).on_publish(delivery(*p), &mut CoreEnv(&shared));
                exec.run(actions);
            }
            Ok(_) => {}
            Err(e) => {
                linked = false;
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
    drop(exec);
    drop(tx);
    let mut publisher = publisher;
    if !linked {
        // No broker to give anything to (it refused us, or is not there): stopping must not
        // wait on another connection attempt. Unacknowledged requests come again next start.
        publisher.abort();
        tracing::info!("stopping without a broker connection: nothing to publish");
        return;
    }
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
/// Executes what the core makes of the events: chunks are published; a final message is
/// journaled (synced), published, and then its request acknowledged if the core says so.
struct Publisher {
    client: Link,
    journal: SharedJournal,
    qos: QoS,
    core: SharedCore,
    #[cfg(feature = "test-hooks")]
    kill_after_journal: Option<String>,
}

impl Publisher {
    async fn run(self, mut rx: mpsc::Receiver<Out>) {
        while let Some(out) = rx.recv().await {
            let actions = match out {
                Out::Event(token, ev) => lock(&self.core).on_event(token, ev),
                Out::Do(actions) => actions,
            };
            for a in actions {
                if !self.execute(a).await {
                    return;
                }
            }
        }
    }

    /// Returns `false` once the client has stopped.
    async fn execute(&self, a: Action<Ack>) -> bool {
        match a {
            Action::Publish(p) => self.publish(p, None).await,
            Action::Ack(ack) => {
                self.ack(&ack, None).await;
                true
            }
            Action::Final {
                token,
                id,
                key,
                answer,
            } => {
                let p = core::publish_of(&answer);
                // The sync blocks: off the I/O thread.
                let j = Arc::clone(&self.journal);
                let kept = tokio::task::spawn_blocking(move || {
                    j.lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .record(key, answer)
                })
                .await;
                match kept {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => tracing::error!(
                        request = id,
                        "{e}: the answer is published, but a redelivery would compute it again"
                    ),
                    Err(e) => tracing::error!(request = id, "answer journal: {e}"),
                }
                #[cfg(feature = "test-hooks")]
                if self.kill_after_journal.as_deref() == Some(id.as_str()) {
                    tracing::warn!(request = id, "test hook: SIGKILL after the journal");
                    let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
                }
                if !self.publish(p, Some(&id)).await {
                    return false;
                }
                let after = lock(&self.core).on_published(token);
                for a in after {
                    if let Action::Ack(ack) = a {
                        self.ack(&ack, Some(&id)).await;
                    }
                }
                true
            }
            // The polling loop's own: never sent here.
            Action::Subscribe(_)
            | Action::Ready
            | Action::Submit(..)
            | Action::Cancel(_)
            | Action::Refused(_) => true,
        }
    }

    async fn publish(&self, p: core::Publish, id: Option<&str>) -> bool {
        let sent = self
            .client
            .publish(&p.topic, self.qos, false, p.payload, p.props);
        if sent.await.is_err() {
            let id = id.unwrap_or("-");
            tracing::error!(
                request = id,
                "cannot publish the answer: the client has stopped"
            );
            return false;
        }
        true
    }

    async fn ack(&self, ack: &Ack, id: Option<&str>) {
        if self.client.ack(ack).await.is_err() {
            let id = id.unwrap_or("-");
            tracing::warn!(
                request = id,
                "cannot acknowledge the request: the client has stopped"
            );
        }
    }
}

/// Hands the core's actions to the publisher without blocking the poll loop and without
/// dropping them.
///
/// The channel is full while the publisher waits on a slow broker. A refusal dropped there was
/// never published, so its request was never acknowledged either, and the broker sends only so
/// many unacknowledged requests (Mosquitto: 20) before it stops sending any: a burst of
/// refusals made the device deaf until it reconnected. What finds the channel full waits in a
/// task of its own; the broker's in-flight window bounds how many do.
fn queue_out(tx: &mpsc::Sender<Out>, out: Out) {
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

    fn token(out: &Out) -> u64 {
        match out {
            Out::Event(t, _) => *t,
            Out::Do(_) => u64::MAX,
        }
    }

    fn refusal(t: u64) -> Out {
        let e = crate::service::ServiceError::new(crate::service::ErrorCode::Busy, "busy");
        Out::Event(t, Event::Error(e))
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
                queue_out(&tx, refusal(i));
            }
            let mut got = Vec::new();
            for _ in 0..5 {
                let out = tokio::time::timeout(Duration::from_secs(5), rx.recv())
                    .await
                    .expect("a refusal was dropped")
                    .unwrap();
                got.push(token(&out));
            }
            got.sort();
            assert_eq!(got, [0, 1, 2, 3, 4]);
            // Once the client stops, a refusal is let go: its request is delivered again.
            drop(rx);
            queue_out(&tx, refusal(9));
        });
    }
}
