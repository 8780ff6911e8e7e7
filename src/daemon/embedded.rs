//! The embedded broker of the out-of-the-box appliance: rumqttd on 127.0.0.1, MQTT 5 on one
//! port and 3.1.1 on the next (rumqttd serves one protocol version per listener). Its
//! sessions live in memory only and never expire; a site that keeps requests across a broker
//! restart points `mqtt.broker` at Mosquitto or EMQX, and edgellm is then a client only.

use super::DaemonError;
use super::config::MqttConfig;
use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};

/// The running broker (its threads end with the process).
pub struct Embedded;

/// Starts the broker; fails at once, naming the port, when a port is taken.
pub fn start(m: &MqttConfig) -> Result<Embedded, DaemonError> {
    let v5 = SocketAddr::from((Ipv4Addr::LOCALHOST, m.embedded_port));
    let port4 = m.embedded_port.checked_add(1).ok_or_else(|| {
        DaemonError::Broker("mqtt.embedded_port must leave room for the 3.1.1 port after it".into())
    })?;
    let v4 = SocketAddr::from((Ipv4Addr::LOCALHOST, port4));
    // rumqttd reports a taken port only in its log, on its own thread: try each first.
    for addr in [v5, v4] {
        TcpListener::bind(addr)
            .map_err(|e| DaemonError::Broker(format!("cannot listen on {addr}: {e}")))?;
    }
    // The daemon's own packet limit: a request up to twice `max_payload` reaches the daemon and
    // is answered `too_large`. rumqttd compares it with a packet's remaining length (topic and
    // properties included) and closes the connection of a client that sends more, without a
    // word to it (its CONNACK cannot carry a Maximum Packet Size): `embedded_log` tells the
    // daemon's log.
    let max_payload = usize::try_from(m.max_payload).unwrap_or(usize::MAX);
    let max_packet = crate::mqtt::contract::max_packet(max_payload);
    super::embedded_log::serving(super::embedded_log::Broker {
        v5_port: v5.port(),
        v311_port: v4.port(),
        max_payload,
        max_packet,
    });
    let connections = rumqttd::ConnectionSettings {
        connection_timeout_ms: 10_000,
        max_payload_size: max_packet,
        max_inflight_count: 100,
        auth: None,
        external_auth: None,
        dynamic_filters: true,
    };
    let server = |name: &str, listen| rumqttd::ServerSettings {
        name: name.into(),
        listen,
        tls: None,
        next_connection_delay_ms: 1,
        connections: connections.clone(),
    };
    let config = rumqttd::Config {
        id: 0,
        router: rumqttd::RouterConfig {
            max_connections: 64,
            max_outgoing_packet_count: 200,
            // In-memory logs per topic: small, an appliance's traffic is a few answers.
            max_segment_size: 1 << 20,
            max_segment_count: 2,
            custom_segment: None,
            initialized_filters: None,
            shared_subscriptions_strategy: Default::default(),
        },
        v4: Some(HashMap::from([("1".to_owned(), server("v311", v4))])),
        v5: Some(HashMap::from([("1".to_owned(), server("v5", v5))])),
        ws: None,
        cluster: None,
        console: None,
        bridge: None,
        prometheus: None,
        metrics: None,
    };
    let mut broker = rumqttd::Broker::new(config);
    std::thread::Builder::new()
        .name("edgellm-broker".into())
        .spawn(move || {
            if let Err(e) = broker.start() {
                tracing::error!("embedded broker stopped: {e}");
            }
        })
        .map_err(|e| DaemonError::Broker(format!("cannot start its thread: {e}")))?;
    // Connect only once it listens: the client's first attempt then succeeds.
    let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while std::net::TcpStream::connect(v5).is_err() && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    tracing::info!(v5 = %v5, v311 = %v4, "embedded MQTT broker listening");
    Ok(Embedded)
}
