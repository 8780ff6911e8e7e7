//! `edgellm ask`: one question to a daemon over MQTT 5, the answer streamed to stdout.

use super::CliResult;
use super::load;
use bytes::Bytes;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{Packet, PublishProperties};
use rumqttc::v5::{AsyncClient, Event, MqttOptions};
use serde_json::{Value, json};
use std::io::Write;
use std::time::Duration;

/// Ask a running `edgellm serve` a question over MQTT and print the answer as it streams.
///
/// Publishes a request on {prefix}/{device}/request with an MQTT 5 response topic and
/// correlation data (request/response as the MQTT 5 specification describes it), prints each
/// chunk of the answer as it arrives, and exits 0 on a finished answer, 1 on an error reply or
/// when no answer comes in time.
#[derive(clap::Args)]
#[command(after_help = "\
Examples:
  edgellm ask 'What is the boiling point of water?'          # the daemon on this machine
  edgellm ask --broker 10.0.0.5:1883 --device press-7 --session shift-a 'Status?'
  edgellm ask --json 'Hi'                                     # the final message, as JSON
  edgellm ask --repeat 200 --concurrency 4 -n 32 'Hi'        # a load test: the summary only

Load generator (--repeat N, with --concurrency C): the question is sent N times (each with
its own id and correlation data, streamed), never more than C at once, and a summary is
printed instead of the answers: requests ok, errors by code (busy, timeout, ...), requests
with no answer within --timeout, and over the ok answers p50/p99 of the queue wait
(timings.queue_ms), of the time to first chunk seen here (publish to first chunk), of the
daemon's time to first token (timings.ttft_ms) and of the overhead (the time to first chunk
minus the queue wait and the time to first token: the broker both ways, the daemon's I/O,
this client), then completion tokens per second of wall time and the mean of the answers'
decode tokens/s. --json prints the
summary as one JSON object. All requests share one response topic, so the daemon counts
them as one client (limits.per_source caps how many of them wait). Exit status 0 once the
summary is printed, whatever the answers were.")]
pub struct Args {
    /// The question (a user message; the model's chat template is applied).
    prompt: String,
    /// The broker the daemon listens on.
    #[arg(long, default_value = "127.0.0.1:1883")]
    broker: String,
    /// The daemon's device id (default: this host's name, as the daemon's default).
    #[arg(long)]
    device: Option<String>,
    /// The daemon's topic prefix.
    #[arg(long, default_value = "edgellm")]
    prefix: String,
    /// A named session on the daemon (its KV cache is kept between questions).
    #[arg(long)]
    session: Option<String>,
    /// A system prompt.
    #[arg(long)]
    system: Option<String>,
    /// Most tokens in the answer.
    #[arg(short = 'n', long = "max-tokens")]
    max_tokens: Option<usize>,
    /// Sampling temperature (0: greedy).
    #[arg(long = "temp")]
    temperature: Option<f32>,
    /// Seconds to wait for the whole answer (with --repeat: for each request, from its
    /// publish; and for the device to come online).
    #[arg(long, default_value_t = 120)]
    timeout: u64,
    /// Print the final message as JSON instead of streaming the text (with --repeat: the
    /// summary).
    #[arg(long)]
    json: bool,
    /// Load generator: send the question N times (1 to 100000) and print a summary of the
    /// answers instead of them.
    #[arg(long, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=i64::from(load::MAX_REPEAT)))]
    repeat: Option<u32>,
    /// With --repeat: requests in flight at most, 1 to 256 (default 1).
    #[arg(long, value_name = "C", requires = "repeat",
          value_parser = clap::value_parser!(u32).range(1..=i64::from(load::MAX_CONCURRENCY)))]
    concurrency: Option<u32>,
}

pub fn run(a: Args) -> CliResult {
    let (host, port) = a
        .broker
        .rsplit_once(':')
        .and_then(|(h, p)| {
            Some((
                h.trim_matches(['[', ']']).to_owned(),
                p.parse::<u16>().ok()?,
            ))
        })
        .ok_or_else(|| format!("--broker {:?}: expected HOST:PORT", a.broker))?;
    let device = a
        .device
        .clone()
        .unwrap_or_else(edgellm::daemon::config::default_device);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    if let Some(repeat) = a.repeat {
        let plan = load::Plan {
            template: request(&a, None, true),
            repeat: repeat as usize,
            concurrency: a.concurrency.unwrap_or(1) as usize,
            timeout: Duration::from_secs(a.timeout),
            json: a.json,
        };
        let target = load::Target {
            host,
            port,
            prefix: a.prefix,
            device,
        };
        return rt.block_on(load::run(target, plan));
    }
    rt.block_on(ask(a, host, port, device))
}

/// A client id and request id unlikely to meet another's: the time and the process id.
pub(super) fn nonce() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
        ^ u64::from(std::process::id()) << 40
}

/// The request JSON for these arguments (`id` left out when `None`).
fn request(a: &Args, id: Option<&str>, stream: bool) -> Value {
    let mut req = json!({ "prompt": a.prompt, "stream": stream });
    for (k, v) in [
        ("id", id.map(Value::from)),
        ("session", a.session.clone().map(Value::from)),
        ("system", a.system.clone().map(Value::from)),
        ("max_tokens", a.max_tokens.map(Value::from)),
        ("temperature", a.temperature.map(Value::from)),
    ] {
        if let Some(v) = v {
            req[k] = v;
        }
    }
    req
}

/// The `state` of a retained status payload ("" when it cannot be read).
pub(super) fn status_state(payload: &[u8]) -> String {
    serde_json::from_slice::<Value>(payload)
        .ok()
        .and_then(|v| v["state"].as_str().map(str::to_owned))
        .unwrap_or_default()
}

async fn ask(a: Args, host: String, port: u16, device: String) -> CliResult {
    let id = format!("ask-{:x}", nonce());
    let reply = format!("{}/{device}/response/{id}", a.prefix);
    let mut opts = MqttOptions::new(&id, &host, port);
    opts.set_keep_alive(Duration::from_secs(30))
        .set_clean_start(true)
        .set_max_packet_size(Some(1 << 20));
    let (client, mut events) = AsyncClient::new(opts, 16);
    let req = request(&a, Some(&id), !a.json);
    let request_topic = format!("{}/{device}/request", a.prefix);
    let status_topic = format!("{}/{device}/status", a.prefix);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(a.timeout);
    let mut out = std::io::stdout().lock();
    let mut subscribed = false;
    let mut asked = false;
    let mut said_offline = false;
    let mut online = false;
    let mut last_error: Option<String> = None;
    let mut expect_seq = 0u64;
    loop {
        let ev = match tokio::time::timeout_at(deadline, events.poll()).await {
            Err(_) if !asked => {
                let why = match &last_error {
                    Some(e) if !subscribed => format!("MQTT broker {host}:{port}: {e}"),
                    _ => format!("no online status on {status_topic}"),
                };
                return Err(format!("{device} is not online within {} s: {why}", a.timeout).into());
            }
            Err(_) => return Err(format!("no answer from {device} within {} s", a.timeout).into()),
            // A broker not up yet (the daemon's embedded one, starting): try again until the
            // deadline; once asked, a lost connection loses the answer.
            Ok(Err(e)) if !asked => {
                last_error = Some(e.to_string());
                subscribed = false;
                tokio::time::sleep(Duration::from_millis(250)).await;
                continue;
            }
            Ok(Err(e)) => return Err(format!("MQTT broker {host}:{port}: {e}").into()),
            Ok(Ok(ev)) => ev,
        };
        match ev {
            Event::Incoming(Packet::ConnAck(_)) if !subscribed => {
                let topics = [&reply, &status_topic]
                    .map(|t| rumqttc::v5::mqttbytes::v5::Filter::new(t.as_str(), QoS::AtLeastOnce));
                client.subscribe_many(topics).await?;
            }
            Event::Incoming(Packet::SubAck(_)) => subscribed = true,
            Event::Incoming(Packet::Publish(p)) if p.topic == status_topic.as_bytes() => {
                let state = status_state(&p.payload);
                online = state == "online" || state == "busy";
                if !online && !said_offline && !asked {
                    eprintln!("edgellm: {device} is {state}; waiting for it to come online");
                    said_offline = true;
                }
            }
            Event::Incoming(Packet::Publish(p)) => {
                let v: Value = serde_json::from_slice(&p.payload)
                    .map_err(|e| format!("the daemon's answer is not JSON: {e}"))?;
                if v["id"] != json!(id) && !v["id"].is_null() {
                    continue;
                }
                if let Some(e) = v.get("error") {
                    let _ = client.disconnect().await;
                    return Err(format!(
                        "{}: {}",
                        e["code"].as_str().unwrap_or("error"),
                        e["message"].as_str().unwrap_or("")
                    )
                    .into());
                }
                if v["done"] == json!(false) {
                    if v["seq"] != json!(expect_seq) {
                        return Err(
                            format!("chunk {} arrived, {expect_seq} expected", v["seq"]).into()
                        );
                    }
                    expect_seq += 1;
                    out.write_all(v["delta"].as_str().unwrap_or("").as_bytes())?;
                    out.flush()?;
                    continue;
                }
                if a.json {
                    writeln!(out, "{v}")?;
                } else if !a.json && expect_seq == 0 {
                    // The daemon sent no chunks (nothing streamed): the whole text now.
                    writeln!(out, "{}", v["text"].as_str().unwrap_or(""))?;
                } else {
                    writeln!(out)?;
                }
                let _ = client.disconnect().await;
                return Ok(());
            }
            _ => {}
        }
        // Ask once the device says it is online (its retained status; a request sent before
        // the daemon subscribed would be lost) and our subscriptions are in place (so nothing
        // of the answer can be missed), whichever of the two came first.
        if subscribed && online && !asked {
            asked = true;
            let props = PublishProperties {
                response_topic: Some(reply.clone()),
                correlation_data: Some(Bytes::from(id.clone().into_bytes())),
                content_type: Some("application/json".into()),
                ..Default::default()
            };
            client
                .publish_with_properties(
                    &request_topic,
                    QoS::AtLeastOnce,
                    false,
                    req.to_string(),
                    props,
                )
                .await?;
        }
    }
}
