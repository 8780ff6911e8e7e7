//! One MQTT connection, version 5 or 3.1.1: rumqttc's two clients behind one small interface,
//! so that the client loop ([`super::client`]) is written once.
//!
//! What 3.1.1 lacks, and how the loop lives without it: no response topic or correlation data
//! (answers go to `{prefix}/{device}/response/{id}`), no session expiry (a persistent session
//! lasts until the broker drops it), no maximum packet size announced to the broker (a bigger
//! packet is refused by rumqttc locally, and the connection drops).

use bytes::Bytes;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5 as m5;
use std::sync::Arc;
use std::time::Duration;

/// The protocol version of a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    V5,
    V311,
}

/// How to open a connection.
pub struct Options<'a> {
    pub version: Version,
    pub client_id: &'a str,
    pub host: &'a str,
    pub port: u16,
    pub keepalive: Duration,
    /// A session that outlives the connection (clean start / clean session off).
    pub persistent: bool,
    /// MQTT 5: how long the broker keeps a persistent session after the connection ends.
    pub session_expiry_s: u32,
    pub max_packet: usize,
    pub inflight: u16,
    /// Retained, QoS 1: `(topic, payload)`.
    pub will: Option<(&'a str, Vec<u8>)>,
    pub credentials: Option<(&'a str, &'a str)>,
    pub tls: Option<Arc<rustls::ClientConfig>>,
}

/// The client half: cheap to clone, used by every task that publishes.
#[derive(Clone)]
pub enum Link {
    V5(rumqttc::v5::AsyncClient),
    V4(rumqttc::AsyncClient),
}

/// The event loop half: polled by one task only.
pub enum Loop {
    V5(Box<rumqttc::v5::EventLoop>),
    V4(Box<rumqttc::EventLoop>),
}

/// What a poll brought that the client loop cares about.
pub enum Incoming {
    ConnAck {
        session_present: bool,
    },
    SubAck,
    Publish(Box<Message>),
    /// Our DISCONNECT went out.
    Disconnected,
    Other,
}

/// A message received.
pub struct Message {
    pub topic: String,
    pub payload: Bytes,
    /// A redelivery: the broker sent it before and saw no acknowledgement.
    pub dup: bool,
    pub response_topic: Option<String>,
    pub correlation: Option<Bytes>,
    pub ack: Ack,
}

/// What acknowledges a received message.
#[derive(Clone)]
pub enum Ack {
    V5(m5::Publish),
    V4(rumqttc::Publish),
}

/// A connection that failed: one line for a person ([`super::failure`]); `lasting` when the
/// broker said no or a certificate was refused, which no retry alone will fix.
#[derive(Debug)]
pub struct LinkError {
    pub message: String,
    pub lasting: bool,
}

impl std::fmt::Display for LinkError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

fn v4_qos(q: QoS) -> rumqttc::QoS {
    match q {
        QoS::AtMostOnce => rumqttc::QoS::AtMostOnce,
        QoS::AtLeastOnce => rumqttc::QoS::AtLeastOnce,
        QoS::ExactlyOnce => rumqttc::QoS::ExactlyOnce,
    }
}

/// TCP_NODELAY: with Nagle's algorithm an answer's first chunk waits behind the previous
/// unacknowledged segment (tens of ms with delayed ACKs): measured, p99 overhead 40 ms → 6 ms.
fn nodelay() -> rumqttc::NetworkOptions {
    let mut n = rumqttc::NetworkOptions::new();
    n.set_tcp_nodelay(true);
    n
}

/// Opens nothing yet: the first poll connects.
pub fn new(o: &Options) -> (Link, Loop) {
    let transport = o.tls.as_ref().map(|tls| {
        rumqttc::Transport::tls_with_config(rumqttc::TlsConfiguration::Rustls(Arc::clone(tls)))
    });
    match o.version {
        Version::V5 => {
            let mut opts = rumqttc::v5::MqttOptions::new(o.client_id, o.host, o.port);
            opts.set_keep_alive(o.keepalive)
                .set_clean_start(!o.persistent)
                .set_session_expiry_interval(o.persistent.then_some(o.session_expiry_s))
                .set_manual_acks(true)
                .set_max_packet_size(Some(u32::try_from(o.max_packet).unwrap_or(u32::MAX)))
                .set_outgoing_inflight_upper_limit(o.inflight);
            if let Some((topic, payload)) = &o.will {
                opts.set_last_will(m5::LastWill::new(
                    *topic,
                    payload.clone(),
                    QoS::AtLeastOnce,
                    true,
                    None,
                ));
            }
            if let Some((u, p)) = o.credentials {
                opts.set_credentials(u, p);
            }
            if let Some(t) = transport {
                opts.set_transport(t);
            }
            opts.set_network_options(nodelay());
            let (c, l) = rumqttc::v5::AsyncClient::new(opts, 64);
            (Link::V5(c), Loop::V5(Box::new(l)))
        }
        Version::V311 => {
            let mut opts = rumqttc::MqttOptions::new(o.client_id, o.host, o.port);
            opts.set_keep_alive(o.keepalive)
                .set_clean_session(!o.persistent)
                .set_manual_acks(true)
                // Outgoing: an answer may be longer than a request (up to the journal's bound).
                .set_max_packet_size(
                    o.max_packet,
                    o.max_packet.max(super::journal::MAX_ANSWER + 4096),
                )
                .set_inflight(o.inflight);
            if let Some((topic, payload)) = &o.will {
                opts.set_last_will(rumqttc::LastWill::new(
                    *topic,
                    payload.clone(),
                    rumqttc::QoS::AtLeastOnce,
                    true,
                ));
            }
            if let Some((u, p)) = o.credentials {
                opts.set_credentials(u, p);
            }
            if let Some(t) = transport {
                opts.set_transport(t);
            }
            let (c, mut l) = rumqttc::AsyncClient::new(opts, 64);
            l.network_options = nodelay();
            (Link::V4(c), Loop::V4(Box::new(l)))
        }
    }
}

impl Loop {
    /// Credentials for the next connection attempt (a rotated password).
    pub fn set_credentials(&mut self, user: &str, password: &str) {
        match self {
            Loop::V5(l) => {
                l.options.set_credentials(user, password);
            }
            Loop::V4(l) => {
                l.mqtt_options.set_credentials(user, password);
            }
        }
    }

    pub async fn poll(&mut self) -> Result<Incoming, LinkError> {
        match self {
            Loop::V5(l) => {
                use rumqttc::v5::Event;
                use rumqttc::v5::mqttbytes::v5::Packet;
                match l.poll().await {
                    Ok(Event::Incoming(Packet::ConnAck(a))) => Ok(Incoming::ConnAck {
                        session_present: a.session_present,
                    }),
                    Ok(Event::Incoming(Packet::SubAck(_))) => Ok(Incoming::SubAck),
                    Ok(Event::Incoming(Packet::Publish(p))) => {
                        let props = p.properties.clone().unwrap_or_default();
                        Ok(Incoming::Publish(Box::new(Message {
                            topic: String::from_utf8_lossy(&p.topic).into_owned(),
                            payload: p.payload.clone(),
                            dup: p.dup,
                            response_topic: props.response_topic,
                            correlation: props.correlation_data,
                            ack: Ack::V5(p),
                        })))
                    }
                    Ok(Event::Outgoing(rumqttc::Outgoing::Disconnect)) => {
                        Ok(Incoming::Disconnected)
                    }
                    Ok(_) => Ok(Incoming::Other),
                    Err(e) => Err(LinkError {
                        message: super::failure::describe(&e),
                        lasting: super::failure::lasting(&e),
                    }),
                }
            }
            Loop::V4(l) => {
                use rumqttc::{Event, Packet};
                match l.poll().await {
                    Ok(Event::Incoming(Packet::ConnAck(a))) => Ok(Incoming::ConnAck {
                        session_present: a.session_present,
                    }),
                    Ok(Event::Incoming(Packet::SubAck(_))) => Ok(Incoming::SubAck),
                    Ok(Event::Incoming(Packet::Publish(p))) => {
                        Ok(Incoming::Publish(Box::new(Message {
                            topic: p.topic.clone(),
                            payload: p.payload.clone(),
                            dup: p.dup,
                            response_topic: None,
                            correlation: None,
                            ack: Ack::V4(p),
                        })))
                    }
                    Ok(Event::Outgoing(rumqttc::Outgoing::Disconnect)) => {
                        Ok(Incoming::Disconnected)
                    }
                    Ok(_) => Ok(Incoming::Other),
                    Err(e) => Err(LinkError {
                        message: super::failure::describe_v4(&e),
                        lasting: super::failure::lasting_v4(&e),
                    }),
                }
            }
        }
    }
}

/// Publish properties of an answer (MQTT 5 only; a 3.1.1 publish carries none).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Props {
    pub correlation: Option<Bytes>,
}

fn v5_props(p: Props) -> m5::PublishProperties {
    m5::PublishProperties {
        correlation_data: p.correlation,
        content_type: Some("application/json".into()),
        ..Default::default()
    }
}

/// The client has stopped (its event loop is gone).
#[derive(Debug)]
pub struct Stopped;

impl Link {
    pub async fn publish(
        &self,
        topic: &str,
        qos: QoS,
        retain: bool,
        payload: Vec<u8>,
        props: Option<Props>,
    ) -> Result<(), Stopped> {
        let r = match (self, props) {
            (Link::V5(c), Some(p)) => {
                c.publish_with_properties(topic, qos, retain, payload, v5_props(p))
                    .await
            }
            (Link::V5(c), None) => c.publish(topic, qos, retain, payload).await,
            (Link::V4(c), _) => {
                return c
                    .publish(topic, v4_qos(qos), retain, payload)
                    .await
                    .map_err(|_| Stopped);
            }
        };
        r.map_err(|_| Stopped)
    }

    /// Without waiting (from the poll loop, which must never await its own channel).
    pub fn try_publish(
        &self,
        topic: &str,
        qos: QoS,
        retain: bool,
        payload: Vec<u8>,
        props: Option<Props>,
    ) -> Result<(), Stopped> {
        let r = match (self, props) {
            (Link::V5(c), Some(p)) => {
                c.try_publish_with_properties(topic, qos, retain, payload, v5_props(p))
            }
            (Link::V5(c), None) => c.try_publish(topic, qos, retain, payload),
            (Link::V4(c), _) => {
                return c
                    .try_publish(topic, v4_qos(qos), retain, payload)
                    .map_err(|_| Stopped);
            }
        };
        r.map_err(|_| Stopped)
    }

    pub async fn ack(&self, a: &Ack) -> Result<(), Stopped> {
        match (self, a) {
            (Link::V5(c), Ack::V5(p)) => c.ack(p).await.map_err(|_| Stopped),
            (Link::V4(c), Ack::V4(p)) => c.ack(p).await.map_err(|_| Stopped),
            // An ack from the other version's connection: cannot happen (one link per loop).
            _ => Err(Stopped),
        }
    }

    pub fn try_ack(&self, a: &Ack) -> Result<(), Stopped> {
        match (self, a) {
            (Link::V5(c), Ack::V5(p)) => c.try_ack(p).map_err(|_| Stopped),
            (Link::V4(c), Ack::V4(p)) => c.try_ack(p).map_err(|_| Stopped),
            _ => Err(Stopped),
        }
    }

    /// All of `topics` in one SUBSCRIBE (one SUBACK says every one is in place).
    pub fn try_subscribe(&self, topics: &[String], qos: QoS) -> Result<(), Stopped> {
        match self {
            Link::V5(c) => c
                .try_subscribe_many(topics.iter().map(|t| m5::Filter::new(t, qos)))
                .map_err(|_| Stopped),
            Link::V4(c) => c
                .try_subscribe_many(
                    topics
                        .iter()
                        .map(|t| rumqttc::SubscribeFilter::new(t.clone(), v4_qos(qos))),
                )
                .map_err(|_| Stopped),
        }
    }

    pub fn try_disconnect(&self) -> Result<(), Stopped> {
        match self {
            Link::V5(c) => c.try_disconnect().map_err(|_| Stopped),
            Link::V4(c) => c.try_disconnect().map_err(|_| Stopped),
        }
    }
}
