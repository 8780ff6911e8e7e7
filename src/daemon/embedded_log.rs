//! Why the embedded broker dropped a client, in the daemon's own log.
//!
//! rumqttd closes a client's connection without a word to it when the client sends a packet
//! over the broker's limit or a CONNECT of the other MQTT version than the port serves, and
//! when it refuses a CONNECT for another reason. The client sees a closed connection and
//! usually tries again, in a loop. rumqttd gives the reason only in its own log, which the
//! daemon's filter turns off (it also logs every connection at info and every disconnect as an
//! error). This [`Layer`] watches rumqttd's events whatever that filter says and says these
//! refusals as a WARN of edgellm's own target, naming the client when the CONNECT got far
//! enough to name it, the packet's size and the limit, or the port to use instead; at most one
//! line per client and kind of refusal every [`Limiter::EVERY`].
//!
//! What rumqttd 0.20 logs, all at ERROR, in the span `remote_link` (whose `client_id` it
//! records once the CONNECT is read), the reason in a Debug-formatted `error` field:
//! - `"Error while handling MQTT connect packet"`: the CONNECT was refused, e.g.
//!   `Network(Protocol(InvalidProtocolLevel(4)))` (3.1.1 on the MQTT 5 port; 5 on the 3.1.1
//!   port), `Network(Protocol(InvalidProtocol))` (MQTT 3.1's `MQIsdp`), `ZeroKeepAlive`,
//!   `Timeout(Elapsed(()))` (no CONNECT within 10 s), or the peer closing first
//!   (`ConnectionAborted`: a port probe, not a refusal);
//! - `"Remote link error"`: the router refused the connection;
//! - `"disconnected"`: a connected client's link ended, over the limit with
//!   `Network(Protocol(PayloadSizeLimitExceeded(N)))`, or with
//!   `Network(Io(Custom { kind: InvalidData, error: "Payload size has been exceeded by N bytes" }))`
//!   when the packet came behind others in one read. N is the packet's remaining length: its
//!   topic, properties and payload.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::Layer;
use tracing_subscriber::filter::filter_fn;
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;

/// The running broker, as a refusal is explained with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Broker {
    pub v5_port: u16,
    pub v311_port: u16,
    /// `mqtt.max_payload`.
    pub max_payload: usize,
    /// The broker's limit on a packet's remaining length.
    pub max_packet: usize,
}

static BROKER: Mutex<Option<Broker>> = Mutex::new(None);

/// Tells the layer which broker it explains (set as the broker starts).
pub(super) fn serving(b: Broker) {
    *BROKER.lock().unwrap_or_else(PoisonError::into_inner) = Some(b);
}

fn broker() -> Option<Broker> {
    BROKER
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone()
}

/// A refusal worth telling the client's owner about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// A packet of this many bytes (remaining length) over the limit.
    TooLarge { size: usize },
    /// A CONNECT of this protocol level (4: 3.1.1, 5: MQTT 5), or `None` for a protocol name
    /// other than `MQTT` (MQTT 3.1 says `MQIsdp`).
    Version { level: Option<u8> },
    /// A CONNECT refused for another reason, in rumqttd's words or ours.
    Connect { reason: String },
}

impl Refusal {
    /// What the rate limit tells apart, besides the client: the kind, and for a CONNECT of
    /// the wrong version its level (such a client has no id yet, and each level is its own
    /// advice).
    fn kind(&self) -> (u8, u8) {
        match self {
            Refusal::TooLarge { .. } => (0, 0),
            Refusal::Version { level } => (1, level.unwrap_or(0)),
            Refusal::Connect { .. } => (2, 0),
        }
    }
}

const CONNECT_FAILED: &str = "Error while handling MQTT connect packet";
const LINK_REFUSED: &str = "Remote link error";

/// The digits right after `after` in `s`.
fn number_after(s: &str, after: &str) -> Option<usize> {
    let rest = &s[s.find(after)? + after.len()..];
    let end = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

/// What rumqttd's event with this `message` and (Debug-formatted) `error` refused, if it is
/// one of the refusals the daemon reports.
pub fn classify(message: &str, error: &str) -> Option<Refusal> {
    let size = number_after(error, "PayloadSizeLimitExceeded(")
        .or_else(|| number_after(error, "Payload size has been exceeded by "));
    if let Some(size) = size {
        return Some(Refusal::TooLarge { size });
    }
    if let Some(level) = number_after(error, "InvalidProtocolLevel(") {
        return Some(Refusal::Version {
            level: u8::try_from(level).ok(),
        });
    }
    if error.contains("InvalidProtocol") {
        return Some(Refusal::Version { level: None });
    }
    if message != CONNECT_FAILED && message != LINK_REFUSED {
        return None;
    }
    // The peer left before its CONNECT: a port probe, or a client that gave up.
    if ["ConnectionAborted", "ConnectionReset", "UnexpectedEof"]
        .iter()
        .any(|k| error.contains(k))
    {
        return None;
    }
    let reason = if error.starts_with("Timeout") {
        "it sent no CONNECT within 10 s (a TLS client on this plain-text port?)".to_owned()
    } else if error.starts_with("ZeroKeepAlive") {
        "its keep-alive is 0, which the broker refuses: give it one".to_owned()
    } else {
        format!("rumqttd says {error}")
    };
    Some(Refusal::Connect { reason })
}

/// The WARN line for `r` by `client` (`None`: the CONNECT did not get as far as its id).
pub fn describe(r: &Refusal, client: Option<&str>, b: &Broker) -> String {
    let who = match client {
        Some(c) => format!("client {c:?}"),
        None => "a client".to_owned(),
    };
    let mut s = String::from("embedded MQTT broker: ");
    // Writing to a String cannot fail.
    let _ = match r {
        Refusal::TooLarge { size } => write!(
            s,
            "closed the connection of {who}, which sent a packet of {size} bytes, over the \
             broker's limit of {} bytes (twice mqtt.max_payload of {}, plus 4096 for topic and \
             properties); the client gets no answer",
            b.max_packet, b.max_payload
        ),
        Refusal::Version { level: Some(4) } => write!(
            s,
            "refused an MQTT 3.1.1 CONNECT on its MQTT 5 port {}; 3.1.1 clients connect to port \
             {}",
            b.v5_port, b.v311_port
        ),
        Refusal::Version { level: Some(5) } => write!(
            s,
            "refused an MQTT 5 CONNECT on its MQTT 3.1.1 port {}; MQTT 5 clients connect to \
             port {}",
            b.v311_port, b.v5_port
        ),
        Refusal::Version { level } => {
            let what = match level {
                Some(3) | None => "an MQTT 3.1 CONNECT".to_owned(),
                Some(l) => format!("a CONNECT of protocol level {l}"),
            };
            write!(
                s,
                "refused {what}; it serves MQTT 5 on port {} and MQTT 3.1.1 on port {}",
                b.v5_port, b.v311_port
            )
        }
        Refusal::Connect { reason } => write!(s, "refused the connection of {who}: {reason}"),
    };
    s
}

/// At most one line per client and kind of refusal every [`Limiter::EVERY`]: a refused
/// client reconnects in a loop.
#[derive(Debug, Default)]
pub struct Limiter {
    last: HashMap<((u8, u8), Option<String>), Instant>,
}

impl Limiter {
    pub const EVERY: Duration = Duration::from_secs(10);
    /// Distinct clients remembered at once; past that, within one period, the rest are not
    /// logged (a flood of made-up client ids must not flood the log).
    const CAP: usize = 256;

    /// Whether a line for `r` by `client` may be written `now`.
    pub fn allow(&mut self, r: &Refusal, client: Option<&str>, now: Instant) -> bool {
        let key = (r.kind(), client.map(str::to_owned));
        if let Some(t) = self.last.get(&key) {
            if now.saturating_duration_since(*t) < Self::EVERY {
                return false;
            }
        } else if self.last.len() >= Self::CAP {
            self.last
                .retain(|_, t| now.saturating_duration_since(*t) < Self::EVERY);
            if self.last.len() >= Self::CAP {
                return false;
            }
        }
        self.last.insert(key, now);
        true
    }
}

/// The fields of rumqttd's events and spans that a refusal is read from.
#[derive(Default)]
struct Fields {
    message: String,
    error: String,
    client_id: Option<String>,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "client_id" => self.client_id = Some(value.to_owned()),
            _ => self.record_debug(field, &value),
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        match field.name() {
            "message" => self.message = format!("{value:?}"),
            "error" => self.error = format!("{value:?}"),
            "client_id" => self.client_id = Some(format!("{value:?}").trim_matches('"').to_owned()),
            _ => {}
        }
    }
}

/// A connection span's client id, once rumqttd has recorded it.
struct ClientId(String);

/// The layer: [`layer`] gives it its filter.
struct Watch {
    limiter: Mutex<Limiter>,
    warn: fn(&str),
}

impl<S> Layer<S> for Watch
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        self.on_fields(id, &ctx, |v| attrs.record(v));
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        self.on_fields(id, &ctx, |v| values.record(v));
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut v = Fields::default();
        event.record(&mut v);
        let Some(refusal) = classify(&v.message, &v.error) else {
            return;
        };
        let client = v.client_id.or_else(|| {
            ctx.event_scope(event)?
                .find_map(|span| span.extensions().get::<ClientId>().map(|c| c.0.clone()))
        });
        let Some(b) = broker() else {
            return;
        };
        let allowed = self
            .limiter
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .allow(&refusal, client.as_deref(), Instant::now());
        if allowed {
            (self.warn)(&describe(&refusal, client.as_deref(), &b));
        }
    }
}

impl Watch {
    fn on_fields<S>(&self, id: &Id, ctx: &Context<'_, S>, record: impl FnOnce(&mut Fields))
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
    {
        let mut v = Fields::default();
        record(&mut v);
        if let (Some(c), Some(span)) = (v.client_id, ctx.span(id)) {
            // rumqttd records an empty field until the CONNECT is read.
            if !c.is_empty() {
                span.extensions_mut().replace(ClientId(c));
            }
        }
    }
}

/// Logs at WARN under this module's target. Called from within rumqttd's event: the daemon's
/// subscriber is the process's global default, which takes an event from inside another, and
/// this layer is the outermost (it runs after the log writer is done with rumqttd's event).
fn warn(line: &str) {
    tracing::warn!("{line}");
}

/// The layer for the daemon's subscriber: it sees rumqttd's WARN and ERROR events (and its
/// connection spans) whatever the log filter says, and nothing else. Add it last.
pub fn layer<S>() -> impl Layer<S>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    layer_with(warn)
}

fn layer_with<S>(warn: fn(&str)) -> impl Layer<S>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    Watch {
        limiter: Mutex::new(Limiter::default()),
        warn,
    }
    .with_filter(
        filter_fn(|m| m.target().starts_with("rumqttd") && *m.level() <= Level::WARN)
            .with_max_level_hint(Level::WARN),
    )
}

#[cfg(test)]
mod tests;
