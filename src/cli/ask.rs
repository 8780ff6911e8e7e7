//! `edgellm ask`: one question to a daemon over MQTT 5, the answer streamed to stdout.

use super::CliResult;
use super::common::FormatArgs;
use super::load;
use bytes::Bytes;
use edgellm::daemon::{Broker, TlsConfig};
use edgellm::mqtt::contract::{self, Reply, RequestBody, Topics};
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{Packet, PublishProperties};
use rumqttc::v5::{AsyncClient, Event, MqttOptions};
use serde_json::Value;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
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
  edgellm ask --broker broker.plant.local:8883 --ca-file ca.pem \
      --username press-7 --password-file ~/.mqtt-pass 'Status?'   # TLS and a password
  edgellm ask --repeat 200 --concurrency 4 -n 32 'Hi'        # a load test: the summary only

Load generator (--repeat N, with --concurrency C): the question is sent N times (each with
its own id and correlation data, streamed), never more than C at once, and a summary is
printed instead of the answers: requests ok, errors by code (busy, timeout, ...), requests
with no answer within --timeout, and over the ok answers p50/p99 of the queue wait
(timings.queue_ms), of the time to first chunk seen here (publish to first chunk), of the
daemon's time to first token (timings.ttft_ms) and of the overhead (the time to first chunk
minus the queue wait and the time to first token: the broker both ways, the daemon's I/O,
this client) and of the time between an answer's chunks (what a reader of the stream sees
between tokens), then completion tokens per second of wall time and the mean of the answers'
decode tokens/s. --json prints the summary as one JSON object. All requests share one
response topic, so the daemon counts them as one client (limits.per_source caps how many of
them wait). Exit status 0 once the
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
    /// A named session on the daemon: the question is the next turn of its conversation, which
    /// the daemon keeps (every earlier question and answer is answered with it).
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
    /// TLS to the broker: the CA certificate(s), PEM, that signed its certificate (as the
    /// daemon's mqtt.tls.ca_file).
    #[arg(long, visible_alias = "cafile", value_name = "FILE")]
    ca_file: Option<PathBuf>,
    /// A client certificate (PEM) for a broker that wants one, with --key-file.
    #[arg(long, value_name = "FILE", requires_all = ["ca_file", "key_file"])]
    cert_file: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(long, value_name = "FILE", requires = "cert_file")]
    key_file: Option<PathBuf>,
    /// User name for the broker.
    #[arg(long)]
    username: Option<String>,
    /// A file whose first line is the broker password (never on the command line, where
    /// other users see it).
    #[arg(long, value_name = "FILE", requires = "username")]
    password_file: Option<PathBuf>,
    /// Send --username and the password to a broker on another machine without TLS.
    #[arg(long)]
    allow_plaintext_credentials: bool,
    /// Load generator: send the question N times (1 to 100000) and print a summary of the
    /// answers instead of them.
    #[arg(long, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=i64::from(load::MAX_REPEAT)))]
    repeat: Option<u32>,
    /// With --repeat: requests in flight at most, 1 to 256 (default 1).
    #[arg(long, value_name = "C", requires = "repeat",
          value_parser = clap::value_parser!(u32).range(1..=i64::from(load::MAX_CONCURRENCY)))]
    concurrency: Option<u32>,
    #[command(flatten)]
    format: FormatArgs,
    /// The answer has the shape of the daemon's configured format NAME ([schemas] or
    /// [choices] in its configuration).
    #[arg(long = "format", value_name = "NAME", conflicts_with = "answer_format")]
    format_name: Option<String>,
    /// What the two above ask for, as the request carries it.
    #[arg(skip)]
    response_format: Option<contract::ResponseFormat>,
}

/// The broker connection's security: TLS and credentials, checked as the daemon checks its own.
pub(super) struct Security {
    tls: Option<Arc<rustls::ClientConfig>>,
    credentials: Option<(String, String)>,
}

impl Security {
    pub(super) fn apply(&self, opts: &mut MqttOptions) {
        if let Some((u, p)) = &self.credentials {
            opts.set_credentials(u, p);
        }
        if let Some(tls) = &self.tls {
            opts.set_transport(rumqttc::Transport::tls_with_config(
                rumqttc::TlsConfiguration::Rustls(Arc::clone(tls)),
            ));
        }
    }
}

fn security(a: &Args, host: &str) -> Result<Security, String> {
    let tls = match &a.ca_file {
        Some(ca) => Some(
            edgellm::daemon::tls::client_config(&TlsConfig {
                ca_file: ca.clone(),
                cert_file: a.cert_file.clone(),
                key_file: a.key_file.clone(),
            })
            .map_err(|e| in_flags(&e))?,
        ),
        None => None,
    };
    let password = match &a.password_file {
        Some(p) => {
            let text = std::fs::read_to_string(p)
                .map_err(|e| format!("--password-file {}: {e}", p.display()))?;
            match text.lines().next() {
                Some(l) if !l.is_empty() => l.to_owned(),
                _ => {
                    return Err(format!(
                        "--password-file {}: holds no password",
                        p.display()
                    ));
                }
            }
        }
        None => String::new(),
    };
    let credentials = a.username.clone().map(|u| (u, password));
    let loopback = Broker::parse(&a.broker).is_ok_and(|b| b.is_loopback());
    if credentials.is_some() && tls.is_none() && !loopback && !a.allow_plaintext_credentials {
        return Err(format!(
            "--username: the credentials would cross the network in plaintext to {host}; add \
             --ca-file, or --allow-plaintext-credentials on a trusted network"
        ));
    }
    Ok(Security { tls, credentials })
}

/// A message written for the daemon, in this command's words: its flags for the daemon's keys.
fn in_flags(s: &str) -> String {
    [
        ("mqtt.tls.ca_file", "--ca-file"),
        ("mqtt.tls.cert_file", "--cert-file"),
        ("mqtt.tls.key_file", "--key-file"),
        ("mqtt.password or mqtt.password_file", "--password-file"),
        ("mqtt.username", "--username"),
        ("mqtt.broker", "--broker"),
    ]
    .iter()
    .fold(s.to_owned(), |s, (key, flag)| s.replace(key, flag))
}

pub fn run(mut a: Args) -> CliResult {
    a.response_format = match (&a.format_name, a.format.shape()?) {
        (Some(name), _) => Some(contract::ResponseFormat {
            schema_ref: Some(name.clone()),
            ..Default::default()
        }),
        (None, Some(shape)) => Some(contract::ResponseFormat::of(&shape)),
        (None, None) => None,
    };
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
    let sec = security(&a, &host)?;
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
            security: sec,
        };
        return rt.block_on(load::run(target, plan));
    }
    rt.block_on(ask(a, host, port, device, sec))
}

/// A client id and request id unlikely to meet another's: the time and the process id.
pub(super) fn nonce() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
        ^ u64::from(std::process::id()) << 40
}

/// The request for these arguments (`id` left out when `None`): the daemon's own contract.
fn request(a: &Args, id: Option<&str>, stream: bool) -> RequestBody {
    RequestBody {
        response_format: a.response_format.clone(),
        id: id.map(str::to_owned),
        session: a.session.clone(),
        system: a.system.clone(),
        max_tokens: a.max_tokens,
        temperature: a.temperature,
        stream,
        ..RequestBody::prompt(a.prompt.clone())
    }
}

/// The `state` of a retained status payload ("" when it cannot be read).
pub(super) fn status_state(payload: &[u8]) -> String {
    serde_json::from_slice::<Value>(payload)
        .ok()
        .and_then(|v| v["state"].as_str().map(str::to_owned))
        .unwrap_or_default()
}

async fn ask(a: Args, host: String, port: u16, device: String, sec: Security) -> CliResult {
    let id = format!("ask-{:x}", nonce());
    let topics = Topics::new(&a.prefix, &device, None).map_err(|e| e.to_string())?;
    let reply = topics.response(&id);
    let mut opts = MqttOptions::new(&id, &host, port);
    opts.set_keep_alive(Duration::from_secs(30))
        .set_clean_start(true)
        .set_max_packet_size(Some(1 << 20));
    sec.apply(&mut opts);
    let (client, mut events) = AsyncClient::new(opts, 16);
    let req = request(&a, Some(&id), !a.json);
    let Topics {
        request: request_topic,
        status: status_topic,
        ..
    } = topics;
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
            // A broker that refused us (credentials) or a failed TLS handshake (a
            // certificate) stays so: say it at once.
            Ok(Err(e)) if edgellm::mqtt::failure::lasting(&e) => {
                let why = in_flags(&edgellm::mqtt::failure::describe(&e));
                return Err(format!("MQTT broker {host}:{port}: {why}").into());
            }
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
                let r = contract::parse_reply(&p.payload).map_err(|e| e.to_string())?;
                if r.id().is_some_and(|i| i != id) {
                    continue;
                }
                let invalid = matches!(&r, Reply::Final(f) if f.valid == Some(false));
                match r {
                    Reply::Error { error, .. } => {
                        let _ = client.disconnect().await;
                        return Err(format!("{}: {}", error.code, error.message).into());
                    }
                    Reply::Chunk(c) => {
                        if c.seq != expect_seq {
                            let seq = c.seq;
                            return Err(
                                format!("chunk {seq} arrived, {expect_seq} expected").into()
                            );
                        }
                        expect_seq += 1;
                        out.write_all(c.delta.as_bytes())?;
                        out.flush()?;
                        continue;
                    }
                    // The final message as the daemon sent it.
                    Reply::Final(_) if a.json => {
                        writeln!(out, "{}", String::from_utf8_lossy(&p.payload))?
                    }
                    // The daemon sent no chunks (nothing streamed): the whole text now.
                    Reply::Final(f) if expect_seq == 0 => writeln!(out, "{}", f.text)?,
                    Reply::Final(_) => writeln!(out)?,
                }
                if invalid {
                    let _ = client.disconnect().await;
                    return Err(
                        "the answer does not have the asked-for shape: it ended before \
                                the format was complete (raise -n)"
                            .into(),
                    );
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
                    req.to_json(),
                    props,
                )
                .await?;
        }
    }
}
