//! `edgellm ask --repeat N --concurrency C`: the question asked N times, at most C at once,
//! and a summary of the answers instead of the answers.
//!
//! Every request has its own id and MQTT 5 correlation data; all of them name one response
//! topic, this client's own, so the daemon sees one source (its `limits.per_source` applies,
//! as it would to one PLC). [`Tracker`] follows the requests in flight and turns what arrives
//! into [`Outcome`]s without any I/O; [`summarize`] turns those into the [`Summary`]; the loop
//! in [`run`] only connects, publishes and feeds the tracker.
//!
//! The client's time to first chunk runs from the publish call to the first streamed chunk of
//! the answer; the time between chunks, from one streamed chunk of an answer to its next (a
//! chunk is one token's text unless this client or the broker falls behind and the daemon
//! joins several): what a reader of the stream sees between tokens. The daemon reports, in the final message, how long the request waited in its
//! queue (`timings.queue_ms`, from arrival to the worker) and how long the worker took to the
//! first token (`timings.ttft_ms`); what is left of the client's figure is the overhead: the
//! broker both ways, the daemon's parsing and publishing, and this client's own processing.

use bytes::Bytes;
use edgellm::mqtt::contract::{self, Final, Reply, RequestBody, Topics};
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{Filter, Packet, PublishProperties};
use rumqttc::v5::{AsyncClient, Event, EventLoop, MqttOptions};
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt;
use std::time::{Duration, Instant};

/// Most requests one run sends: a run is bounded in memory (one outcome kept per request).
pub const MAX_REPEAT: u32 = 100_000;
/// Most requests in flight at once; more only measures the daemon's `busy` answers.
pub const MAX_CONCURRENCY: u32 = 256;
/// Most times between chunks one run keeps (8 MiB); later answers' are not measured.
pub const MAX_GAPS: usize = 1 << 20;

/// Where the daemon is.
pub struct Target {
    pub host: String,
    pub port: u16,
    pub prefix: String,
    pub device: String,
    /// TLS and credentials, as for a single ask.
    pub security: super::ask::Security,
}

/// What to send, how often.
pub struct Plan {
    /// The request without its id (set per request; `stream` is forced on).
    pub template: RequestBody,
    pub repeat: usize,
    pub concurrency: usize,
    /// For each request, from its publish to its final message; also the wait for the device.
    pub timeout: Duration,
    pub json: bool,
}

/// What became of one request.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    Answered(Answer),
    /// An error reply: its code (`busy`, `timeout`, …).
    Error(String),
    /// No final message within the timeout.
    Timeout,
    /// An answer this client cannot accept (not JSON, a chunk out of order, no timings).
    Invalid(String),
}

/// The figures of one finished answer.
#[derive(Clone, Debug, PartialEq)]
pub struct Answer {
    /// Publish → first streamed chunk (the final message when no chunk came), as seen here.
    pub client_ttfc_ms: f64,
    pub queue_ms: f64,
    pub ttft_ms: f64,
    pub decode_tps: f64,
    pub completion_tokens: u64,
    pub finish_reason: String,
}

/// A request sent and not yet finished.
struct InFlight {
    sent: Instant,
    first_chunk: Option<Instant>,
    last_chunk: Option<Instant>,
    /// Milliseconds between this answer's chunks, kept once it is answered.
    gaps_ms: Vec<f64>,
    next_seq: u64,
}

/// The requests in flight, fed what arrives; no I/O, no clock of its own.
pub struct Tracker {
    timeout: Duration,
    pending: HashMap<Bytes, InFlight>,
    /// Deadlines in send order, which is deadline order (one timeout for all); entries of
    /// requests already finished are dropped when they reach the front.
    deadlines: VecDeque<(Instant, Bytes)>,
    pub outcomes: Vec<Outcome>,
    /// Milliseconds between the chunks of the answered requests (at most [`MAX_GAPS`]).
    pub gaps_ms: Vec<f64>,
}

impl Tracker {
    pub fn new(timeout: Duration) -> Tracker {
        Tracker {
            timeout,
            pending: HashMap::new(),
            deadlines: VecDeque::new(),
            outcomes: Vec::new(),
            gaps_ms: Vec::new(),
        }
    }

    pub fn in_flight(&self) -> usize {
        self.pending.len()
    }

    /// The request `key` (its correlation data) was published at `now`.
    pub fn sent(&mut self, key: Bytes, now: Instant) {
        self.deadlines.push_back((now + self.timeout, key.clone()));
        let f = InFlight {
            sent: now,
            first_chunk: None,
            last_chunk: None,
            gaps_ms: Vec::new(),
            next_seq: 0,
        };
        self.pending.insert(key, f);
    }

    /// The earliest deadline of a request in flight.
    pub fn next_deadline(&mut self) -> Option<Instant> {
        while let Some((d, k)) = self.deadlines.front() {
            if self.pending.contains_key(k) {
                return Some(*d);
            }
            self.deadlines.pop_front();
        }
        None
    }

    /// Requests whose deadline is past `now` time out.
    pub fn expire(&mut self, now: Instant) {
        while let Some(d) = self.next_deadline() {
            if d > now {
                break;
            }
            if let Some((_, k)) = self.deadlines.pop_front() {
                self.pending.remove(&k);
                self.outcomes.push(Outcome::Timeout);
            }
        }
    }

    /// A message on the response topic: `key` is its correlation data (none from a daemon
    /// that dropped it: the payload's id is used then). Messages of no request in flight (a
    /// late answer to one that timed out, a stranger's) are ignored.
    pub fn message(&mut self, key: Option<Bytes>, payload: &[u8], now: Instant) {
        let reply = contract::parse_reply(payload);
        let key = key.or_else(|| {
            let id = reply.as_ref().ok()?.id()?;
            Some(Bytes::copy_from_slice(id.as_bytes()))
        });
        let Some(key) = key else { return };
        let Some(f) = self.pending.get_mut(&key) else {
            return;
        };
        let outcome = match reply {
            Err(e) => Outcome::Invalid(e.to_string()),
            Ok(Reply::Error { error, .. }) => Outcome::Error(error.code.as_str().to_owned()),
            Ok(Reply::Chunk(c)) if c.seq != f.next_seq => {
                Outcome::Invalid(format!("chunk {} arrived, {} expected", c.seq, f.next_seq))
            }
            Ok(Reply::Chunk(_)) => {
                f.next_seq += 1;
                f.first_chunk.get_or_insert(now);
                if let Some(last) = f.last_chunk.replace(now) {
                    f.gaps_ms.push(ms(now.saturating_duration_since(last)));
                }
                return;
            }
            Ok(Reply::Final(a)) => {
                let room = MAX_GAPS - self.gaps_ms.len();
                self.gaps_ms.extend(f.gaps_ms.iter().take(room).copied());
                Outcome::Answered(answer_of(&a, f, now))
            }
        };
        self.pending.remove(&key);
        self.outcomes.push(outcome);
    }
}

/// The figures of a final message.
fn answer_of(a: &Final, f: &InFlight, now: Instant) -> Answer {
    let first = f.first_chunk.unwrap_or(now);
    Answer {
        client_ttfc_ms: ms(first.saturating_duration_since(f.sent)),
        queue_ms: a.timings.queue_ms,
        ttft_ms: a.timings.ttft_ms,
        decode_tps: a.timings.decode_tps,
        completion_tokens: a.usage.completion_tokens as u64,
        finish_reason: a.finish_reason.clone(),
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The `p`-th percentile (0 < p ≤ 100) of `sorted` (ascending) by the nearest-rank method:
/// always one of the samples, so a p99 of few samples is their largest, not an extrapolation.
/// `None` without samples.
pub fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    debug_assert!(p > 0.0 && p <= 100.0, "percentile {p}");
    if sorted.is_empty() {
        return None;
    }
    // p × n is exact for whole percents, so the rank of 50% of 2 samples is exactly 1.
    let rank = (p * sorted.len() as f64 / 100.0).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// p50 and p99 of some samples.
#[derive(Clone, Debug, PartialEq)]
pub struct Spread {
    pub n: usize,
    pub p50: Option<f64>,
    pub p99: Option<f64>,
}

impl Spread {
    pub fn of(mut samples: Vec<f64>) -> Spread {
        samples.sort_by(f64::total_cmp);
        Spread {
            n: samples.len(),
            p50: percentile(&samples, 50.0),
            p99: percentile(&samples, 99.0),
        }
    }

    fn json(&self) -> Value {
        json!({ "n": self.n, "p50": self.p50.map(round3), "p99": self.p99.map(round3) })
    }
}

/// What a run measured.
#[derive(Clone, Debug, PartialEq)]
pub struct Summary {
    pub requests: usize,
    pub concurrency: usize,
    pub ok: usize,
    pub errors_by_code: BTreeMap<String, usize>,
    pub timeouts: usize,
    pub invalid: usize,
    /// The reason of the first invalid answer.
    pub first_invalid: Option<String>,
    pub finish_reasons: BTreeMap<String, usize>,
    pub queue_ms: Spread,
    pub client_ttfc_ms: Spread,
    pub ttft_ms: Spread,
    /// Client time to first chunk − (queue_ms + ttft_ms), per answer.
    pub overhead_ms: Spread,
    /// Between one streamed chunk of an answer and its next.
    pub inter_chunk_ms: Spread,
    pub completion_tokens: u64,
    pub wall_s: f64,
    /// Completion tokens of every answer / wall time: the daemon's throughput.
    pub aggregate_tps: f64,
    /// Mean of the answers' own decode tokens/s (answers of 2 tokens or more: one token has
    /// no decode time).
    pub mean_decode_tps: Option<f64>,
}

impl Summary {
    pub fn errors(&self) -> usize {
        self.errors_by_code.values().sum()
    }

    pub fn to_json(&self) -> Value {
        json!({
            "requests": self.requests,
            "concurrency": self.concurrency,
            "ok": self.ok,
            "errors": self.errors(),
            "errors_by_code": self.errors_by_code,
            "timeouts": self.timeouts,
            "invalid": self.invalid,
            "first_invalid": self.first_invalid,
            "finish_reasons": self.finish_reasons,
            "queue_ms": self.queue_ms.json(),
            "client_ttfc_ms": self.client_ttfc_ms.json(),
            "ttft_ms": self.ttft_ms.json(),
            "overhead_ms": self.overhead_ms.json(),
            "inter_chunk_ms": self.inter_chunk_ms.json(),
            "completion_tokens": self.completion_tokens,
            "wall_s": round3(self.wall_s),
            "aggregate_tps": round3(self.aggregate_tps),
            "mean_decode_tps": self.mean_decode_tps.map(round3),
        })
    }
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// The summary of a run's outcomes and times between chunks (`gaps_ms`); `wall` from the
/// first publish to the last outcome.
pub fn summarize(
    outcomes: &[Outcome],
    gaps_ms: &[f64],
    concurrency: usize,
    wall: Duration,
) -> Summary {
    let mut s = Summary {
        requests: outcomes.len(),
        concurrency,
        ok: 0,
        errors_by_code: BTreeMap::new(),
        timeouts: 0,
        invalid: 0,
        first_invalid: None,
        finish_reasons: BTreeMap::new(),
        queue_ms: Spread::of(Vec::new()),
        client_ttfc_ms: Spread::of(Vec::new()),
        ttft_ms: Spread::of(Vec::new()),
        overhead_ms: Spread::of(Vec::new()),
        inter_chunk_ms: Spread::of(gaps_ms.to_vec()),
        completion_tokens: 0,
        wall_s: wall.as_secs_f64(),
        aggregate_tps: 0.0,
        mean_decode_tps: None,
    };
    let (mut queue, mut ttfc, mut ttft, mut over, mut tps) =
        (vec![], vec![], vec![], vec![], vec![]);
    for o in outcomes {
        match o {
            Outcome::Answered(a) => {
                s.ok += 1;
                *s.finish_reasons.entry(a.finish_reason.clone()).or_default() += 1;
                s.completion_tokens += a.completion_tokens;
                queue.push(a.queue_ms);
                ttfc.push(a.client_ttfc_ms);
                ttft.push(a.ttft_ms);
                over.push(a.client_ttfc_ms - (a.queue_ms + a.ttft_ms));
                if a.completion_tokens >= 2 {
                    tps.push(a.decode_tps);
                }
            }
            Outcome::Error(code) => *s.errors_by_code.entry(code.clone()).or_default() += 1,
            Outcome::Timeout => s.timeouts += 1,
            Outcome::Invalid(why) => {
                s.invalid += 1;
                s.first_invalid.get_or_insert_with(|| why.clone());
            }
        }
    }
    if !tps.is_empty() {
        s.mean_decode_tps = Some(tps.iter().sum::<f64>() / tps.len() as f64);
    }
    if s.wall_s > 0.0 {
        s.aggregate_tps = s.completion_tokens as f64 / s.wall_s;
    }
    s.queue_ms = Spread::of(queue);
    s.client_ttfc_ms = Spread::of(ttfc);
    s.ttft_ms = Spread::of(ttft);
    s.overhead_ms = Spread::of(over);
    s
}

/// `busy 3, timeout 1`: counts by name, in the map's order.
fn tally(counts: &BTreeMap<String, usize>) -> String {
    let parts: Vec<String> = counts.iter().map(|(c, n)| format!("{c} {n}")).collect();
    parts.join(", ")
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} requests, at most {} at once, in {:.2} s: {} ok, {} errors, {} timeouts, {} invalid",
            self.requests,
            self.concurrency,
            self.wall_s,
            self.ok,
            self.errors(),
            self.timeouts,
            self.invalid
        )?;
        if !self.errors_by_code.is_empty() {
            writeln!(f, "errors by code: {}", tally(&self.errors_by_code))?;
        }
        if let Some(why) = &self.first_invalid {
            writeln!(f, "first invalid answer: {why}")?;
        }
        if !self.finish_reasons.is_empty() {
            writeln!(f, "finish reasons: {}", tally(&self.finish_reasons))?;
        }
        let cell = |x: Option<f64>| x.map_or_else(|| "-".to_owned(), |v| format!("{v:.3}"));
        writeln!(
            f,
            "{:<44} {:>10} {:>10}",
            "ms, over the ok answers", "p50", "p99"
        )?;
        for (name, s) in [
            ("queue wait (daemon: timings.queue_ms)", &self.queue_ms),
            ("time to first chunk (client)", &self.client_ttfc_ms),
            ("time to first token (daemon: ttft_ms)", &self.ttft_ms),
            ("overhead: client - (queue_ms + ttft_ms)", &self.overhead_ms),
            ("between chunks of an answer (client)", &self.inter_chunk_ms),
        ] {
            writeln!(f, "{name:<44} {:>10} {:>10}", cell(s.p50), cell(s.p99))?;
        }
        write!(
            f,
            "{} completion tokens: {:.1} tokens/s aggregate; mean decode {} tokens/s per answer",
            self.completion_tokens,
            self.aggregate_tps,
            self.mean_decode_tps
                .map_or_else(|| "-".to_owned(), |v| format!("{v:.1}"))
        )
    }
}

/// Runs the load: waits for the device to be online, keeps `plan.concurrency` requests in
/// flight until `plan.repeat` have finished, prints the summary.
pub async fn run(t: Target, plan: Plan) -> super::CliResult {
    let run_id = format!("load-{:x}", super::ask::nonce());
    let topics = Topics::new(&t.prefix, &t.device, None).map_err(|e| e.to_string())?;
    let reply = topics.response(&run_id);
    let Topics {
        request: request_topic,
        status: status_topic,
        ..
    } = topics;
    let mut opts = MqttOptions::new(&run_id, &t.host, t.port);
    opts.set_keep_alive(Duration::from_secs(30))
        .set_clean_start(true)
        .set_max_packet_size(Some(1 << 20));
    // Nagle's algorithm would hold a request behind this client's unacknowledged PUBACKs
    // (tens of ms with delayed ACKs): the measuring client must not add its own delay.
    let mut net = rumqttc::NetworkOptions::new();
    net.set_tcp_nodelay(true);
    opts.set_network_options(net);
    t.security.apply(&mut opts);
    // The whole window may be handed to the event loop at once (try_publish, never awaited
    // inside the poll loop: the poll is what drains this channel), with room for the
    // subscription and the disconnect.
    let (client, mut events) = AsyncClient::new(opts, plan.concurrency + 8);
    wait_online(&t, &plan, &client, &mut events, &reply, &status_topic).await?;

    let mut tracker = Tracker::new(plan.timeout);
    let mut sent = 0usize;
    let start = Instant::now();
    while tracker.outcomes.len() < plan.repeat {
        // Here too, not only when a poll times out: a steady stream of messages would
        // otherwise keep a request past its deadline.
        tracker.expire(Instant::now());
        while sent < plan.repeat && tracker.in_flight() < plan.concurrency {
            let id = format!("{run_id}-{sent}");
            let req = RequestBody {
                id: Some(id.clone()),
                stream: true,
                ..plan.template.clone()
            };
            let key = Bytes::from(id.into_bytes());
            let props = PublishProperties {
                response_topic: Some(reply.clone()),
                correlation_data: Some(key.clone()),
                content_type: Some("application/json".into()),
                ..Default::default()
            };
            client.try_publish_with_properties(
                &request_topic,
                QoS::AtLeastOnce,
                false,
                req.to_json(),
                props,
            )?;
            tracker.sent(key, Instant::now());
            sent += 1;
        }
        let Some(deadline) = tracker.next_deadline() else {
            continue;
        };
        let polled = tokio::time::timeout_at(deadline.into(), events.poll()).await;
        match polled {
            Err(_) => tracker.expire(Instant::now()),
            Ok(Err(e)) => {
                return Err(format!(
                    "MQTT broker {}:{}: connection lost after {} of {} answers: {e}",
                    t.host,
                    t.port,
                    tracker.outcomes.len(),
                    plan.repeat
                )
                .into());
            }
            Ok(Ok(Event::Incoming(Packet::Publish(p)))) if p.topic == reply.as_bytes() => {
                let key = p.properties.and_then(|pr| pr.correlation_data);
                tracker.message(key, &p.payload, Instant::now());
            }
            Ok(Ok(_)) => {}
        }
    }
    let wall = start.elapsed();
    let _ = client.try_disconnect();
    // Let the disconnect go out (bounded: the summary does not depend on it).
    let _ = tokio::time::timeout(Duration::from_millis(500), events.poll()).await;
    let summary = summarize(&tracker.outcomes, &tracker.gaps_ms, plan.concurrency, wall);
    if plan.json {
        println!("{}", summary.to_json());
    } else {
        println!("{summary}");
    }
    Ok(())
}

/// Connects, subscribes to the response and status topics, and returns once the device's
/// retained status says it is online (a request sent before the daemon subscribed would be
/// lost), within `plan.timeout`.
async fn wait_online(
    t: &Target,
    plan: &Plan,
    client: &AsyncClient,
    events: &mut EventLoop,
    reply: &str,
    status_topic: &str,
) -> super::CliResult {
    let deadline = tokio::time::Instant::now() + plan.timeout;
    let (mut subscribed, mut online, mut said) = (false, false, false);
    let mut last_error: Option<String> = None;
    while !(subscribed && online) {
        let ev = match tokio::time::timeout_at(deadline, events.poll()).await {
            Err(_) => {
                let why = match &last_error {
                    Some(e) if !subscribed => format!("MQTT broker {}:{}: {e}", t.host, t.port),
                    _ => format!("no online status on {status_topic}"),
                };
                return Err(format!(
                    "{} is not online within {} s: {why}",
                    t.device,
                    plan.timeout.as_secs()
                )
                .into());
            }
            // A broker not up yet: try again until the deadline, as a single ask does.
            Ok(Err(e)) => {
                last_error = Some(e.to_string());
                subscribed = false;
                tokio::time::sleep(Duration::from_millis(250)).await;
                continue;
            }
            Ok(Ok(ev)) => ev,
        };
        match ev {
            Event::Incoming(Packet::ConnAck(_)) => {
                let topics = [reply, status_topic].map(|t| Filter::new(t, QoS::AtLeastOnce));
                client.try_subscribe_many(topics)?;
            }
            Event::Incoming(Packet::SubAck(_)) => subscribed = true,
            Event::Incoming(Packet::Publish(p)) if p.topic == status_topic.as_bytes() => {
                let state = super::ask::status_state(&p.payload);
                online = state == "online" || state == "busy";
                if !online && !said {
                    eprintln!(
                        "edgellm: {} is {state}; waiting for it to come online",
                        t.device
                    );
                    said = true;
                }
            }
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
