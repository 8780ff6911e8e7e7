//! A start that is refused (a corrupt or truncated model, a board budget the model does not fit)
//! is said where the plant looks, not only in the journal: the retained status becomes
//! `{"state": "error", "error": "…"}` on the configured broker, before the daemon exits.
//!
//! Only on a broker of the site's (`mqtt.broker = "host:port"`): the embedded broker is not
//! running yet, and there is nothing to publish to with `off`. One short connection of its own
//! (another client id, a clean session, so the device's persistent session is left as it is),
//! bounded in time: a broker that is away does not hold up the exit, and so the restart limit.

use super::config::{Broker, Config};
use crate::mqtt::link::{self, Incoming};
use rumqttc::v5::mqttbytes::QoS;
use serde_json::json;
use std::time::Duration;

/// How long the refusal may take to reach the broker.
const WITHIN: Duration = Duration::from_secs(5);

/// Publishes `why` as the device's retained status, if a site broker is configured and answers
/// within a few seconds. Never fails: the exit that follows is what matters.
pub fn publish(cfg: &Config, model: &std::path::Path, why: &str) {
    if !matches!(cfg.mqtt.broker, Broker::Remote { .. }) {
        return;
    }
    let settings = match super::serve::settings(cfg) {
        Ok(Some(s)) => s,
        Ok(None) => return,
        Err(e) => {
            tracing::warn!("the refusal is not published: {e}");
            return;
        }
    };
    let payload = json!({
        "state": "error",
        "error": why,
        "model": { "file": model },
    })
    .to_string()
    .into_bytes();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::warn!("the refusal is not published: {e}");
            return;
        }
    };
    let client_id = format!("{}-refused", settings.client_id);
    let opts = link::Options {
        version: settings.version,
        client_id: &client_id,
        host: &settings.host,
        port: settings.port,
        keepalive: Duration::from_secs(10),
        persistent: false,
        session_expiry_s: 0,
        max_packet: 64 << 10,
        inflight: 4,
        will: None,
        credentials: settings
            .credentials
            .as_ref()
            .map(|(u, p)| (u.as_str(), p.as_str())),
        tls: settings.tls.clone(),
    };
    let topic = settings.topics.status.clone();
    let sent = rt.block_on(async {
        let (client, mut events) = link::new(&opts);
        tokio::time::timeout(WITHIN, async {
            loop {
                match events.poll().await {
                    Ok(Incoming::ConnAck { .. }) => {
                        // In order on the one connection: the broker has the status before
                        // it sees the DISCONNECT.
                        let published = client
                            .try_publish(&topic, QoS::AtLeastOnce, true, payload.clone(), None)
                            .is_ok();
                        if !published || client.try_disconnect().is_err() {
                            return false;
                        }
                    }
                    Ok(Incoming::Disconnected) => return true,
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!("the refusal is not published: {e}");
                        return false;
                    }
                }
            }
        })
        .await
        .unwrap_or(false)
    });
    if sent {
        tracing::info!(topic, "refusal published as the retained status");
    }
}
