//! Validation: every range and every rule between keys, each refusal a [`Bad`].

use super::{Broker, Config, ConfigError, MAX_PAYLOAD, SerialConfig, SerialMode};
use crate::engine::{MAX_CHUNK, MAX_CTX};
use crate::runtime::MAX_THREADS;
use std::fmt;
use std::ops::RangeInclusive;

/// Most formats `modbus.formats` lists (the `FORMAT` register's values).
const MAX_MODBUS_FORMATS: usize = 64;

/// A refusal found by validation, before the origin is known.
#[derive(Debug)]
pub(super) struct Bad {
    pub(super) key: String,
    pub(super) reason: String,
}

pub(super) fn bad(key: impl Into<String>, reason: impl Into<String>) -> Bad {
    Bad {
        key: key.into(),
        reason: reason.into(),
    }
}

fn in_range<T>(key: &str, v: T, range: RangeInclusive<T>) -> Result<(), Bad>
where
    T: PartialOrd + fmt::Display,
{
    if range.contains(&v) {
        Ok(())
    } else {
        Err(bad(
            key,
            format!("{v} is out of range {}..={}", range.start(), range.end()),
        ))
    }
}

impl Config {
    pub(super) fn check(&self) -> Result<(), ConfigError> {
        self.validate().map_err(|b| self.invalid(b))
    }

    /// Every range and every rule between keys.
    fn validate(&self) -> Result<(), Bad> {
        self.validate_model()?;
        self.validate_state()?;
        self.validate_mqtt()?;
        for (i, s) in self.serial.iter().enumerate() {
            validate_serial(i, s)?;
            if let Some(j) = self.serial[..i].iter().position(|o| o.path == s.path) {
                return Err(bad(
                    format!("serial[{i}].path"),
                    format!("{} is already serial[{j}]", s.path.display()),
                ));
            }
        }
        in_range("modbus.unit_id", self.modbus.unit_id, 1..=247)?;
        self.validate_limits()?;
        self.validate_formats()?;
        let level = &self.log.level;
        if level.trim().is_empty() {
            return Err(bad("log.level", "is empty (e.g. \"info\")"));
        }
        if let Err(e) = tracing_subscriber::EnvFilter::try_new(level) {
            return Err(bad("log.level", format!("{level:?}: {e}")));
        }
        Ok(())
    }

    fn validate_model(&self) -> Result<(), Bad> {
        let m = &self.model;
        if m.path.as_ref().is_some_and(|p| p.as_os_str().is_empty()) {
            return Err(bad("model.path", "is empty"));
        }
        if let Some(t) = m.threads {
            in_range("model.threads", t, 1..=MAX_THREADS)?;
        }
        in_range("model.ctx", m.ctx, 1..=MAX_CTX)?;
        in_range("model.chunk", m.chunk, 1..=MAX_CHUNK)?;
        if let Some(b) = m.max_batch {
            in_range("model.max_batch", b, 1..=crate::engine::MAX_BATCH)?;
            if b > m.chunk {
                return Err(bad(
                    "model.max_batch",
                    format!(
                        "{b} is more than model.chunk {}: a step's tokens are one chunk",
                        m.chunk
                    ),
                ));
            }
        }
        if let Some(b) = &m.board {
            let ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_');
            if b.is_empty() || b.len() > 64 || !b.chars().all(ok) {
                return Err(bad(
                    "model.board",
                    format!("{b:?}: a profile name is 1 to 64 letters, digits, . - or _"),
                ));
            }
            crate::board::get(b).map_err(|e| bad("model.board", e.to_string()))?;
        }
        if m.chat_template
            .as_ref()
            .is_some_and(|p| p.as_os_str().is_empty())
        {
            return Err(bad("model.chat_template", "is empty"));
        }
        Ok(())
    }

    fn validate_state(&self) -> Result<(), Bad> {
        let s = &self.state;
        if s.dir.as_ref().is_some_and(|p| p.as_os_str().is_empty()) {
            return Err(bad("state.dir", "is empty"));
        }
        in_range("state.disk_budget", s.disk_budget, 1..=u64::MAX)?;
        in_range("state.ram_budget", s.ram_budget, 1..=u64::MAX)?;
        in_range("state.conversation_turns", s.conversation_turns, 1..=4096)?;
        in_range(
            "state.conversation_bytes",
            s.conversation_bytes,
            1 << 10..=16 << 20,
        )?;
        // Two segments of a quarter each at the least, so rotating one out keeps the other.
        in_range("audit.max_bytes", self.audit.max_bytes, 16 << 10..=u64::MAX)?;
        Ok(())
    }

    fn validate_mqtt(&self) -> Result<(), Bad> {
        let m = &self.mqtt;
        in_range("mqtt.keepalive_s", m.keepalive_s, 5..=3600)?;
        in_range("mqtt.qos", m.qos, 0..=2)?;
        in_range("mqtt.max_payload", m.max_payload, 1024..=MAX_PAYLOAD)?;
        in_range("mqtt.embedded_port", m.embedded_port, 1..=65534)?;
        if let Err(e) = self.topics() {
            let key = match e.what {
                "topic prefix" => "mqtt.prefix",
                "device id" => "mqtt.device",
                _ => "mqtt.fleet_group",
            };
            return Err(bad(key, format!("{:?}: {}", e.value, e.why)));
        }
        if m.username.as_deref() == Some("") {
            return Err(bad("mqtt.username", "is empty"));
        }
        if m.password.is_some() && m.password_file.is_some() {
            return Err(bad(
                "mqtt.password_file",
                "set mqtt.password or mqtt.password_file, not both",
            ));
        }
        if (m.password.is_some() || m.password_file.is_some()) && m.username.is_none() {
            let key = if m.password.is_some() {
                "mqtt.password"
            } else {
                "mqtt.password_file"
            };
            return Err(bad(key, "a password needs mqtt.username"));
        }
        if let Some(t) = &m.tls {
            match (&t.cert_file, &t.key_file) {
                (Some(_), None) => {
                    return Err(bad(
                        "mqtt.tls.key_file",
                        "mqtt.tls.cert_file is set: a client certificate needs its key",
                    ));
                }
                (None, Some(_)) => {
                    return Err(bad(
                        "mqtt.tls.cert_file",
                        "mqtt.tls.key_file is set: a client key needs its certificate",
                    ));
                }
                _ => {}
            }
            if m.broker == Broker::Embedded {
                return Err(bad(
                    "mqtt.tls",
                    "the embedded broker listens in plaintext on 127.0.0.1; \
                     TLS needs mqtt.broker = \"host:port\"",
                ));
            }
        }
        if m.has_credentials()
            && m.tls.is_none()
            && !m.broker.is_loopback()
            && !m.allow_plaintext_credentials
        {
            let key = if m.password.is_some() {
                "mqtt.password"
            } else if m.password_file.is_some() {
                "mqtt.password_file"
            } else {
                "mqtt.username"
            };
            return Err(bad(
                key,
                format!(
                    "credentials would cross the network in plaintext to {}; add [mqtt.tls] \
                     (ca_file), or set mqtt.allow_plaintext_credentials = true on a trusted network",
                    m.broker
                ),
            ));
        }
        Ok(())
    }

    /// Format names are what a request sends (MQTT `schema_ref`, a serial `SET format=`): one
    /// namespace for `[schemas]` and `[choices]`, names a line protocol can carry.
    fn validate_formats(&self) -> Result<(), Bad> {
        let names = self.schemas.keys().map(|n| ("schemas", n));
        for (section, name) in names.chain(self.choices.keys().map(|n| ("choices", n))) {
            let key = format!("{section}.{name}");
            if !crate::service::valid_format_name(name) {
                return Err(bad(key, "a format name has 1 to 64 of A-Z a-z 0-9 _ -"));
            }
        }
        if let Some(n) = self.schemas.keys().find(|n| self.choices.contains_key(*n)) {
            return Err(bad(
                format!("choices.{n}"),
                format!("{n:?} is also in [schemas]: a format name is one or the other"),
            ));
        }
        let modbus = &self.modbus.formats;
        if modbus.len() > MAX_MODBUS_FORMATS {
            return Err(bad(
                "modbus.formats",
                format!("has at most {MAX_MODBUS_FORMATS} names"),
            ));
        }
        for (i, name) in modbus.iter().enumerate() {
            if !self.schemas.contains_key(name) && !self.choices.contains_key(name) {
                return Err(bad(
                    "modbus.formats",
                    format!("{name:?} is in neither [schemas] nor [choices]"),
                ));
            }
            if modbus[..i].contains(name) {
                return Err(bad("modbus.formats", format!("{name:?} is listed twice")));
            }
        }
        for (name, options) in &self.choices {
            if options.is_empty() || options.len() > 256 {
                return Err(bad(format!("choices.{name}"), "has 1 to 256 options"));
            }
            if let Some(i) = options.iter().position(|o| o.is_empty() || o.len() > 256) {
                return Err(bad(
                    format!("choices.{name}"),
                    format!("option {} must have 1 to 256 bytes", i + 1),
                ));
            }
        }
        Ok(())
    }

    fn validate_limits(&self) -> Result<(), Bad> {
        let l = &self.limits;
        in_range(
            "limits.max_prompt_bytes",
            l.max_prompt_bytes,
            1..=MAX_PAYLOAD,
        )?;
        in_range("limits.max_tokens", l.max_tokens, 1..=MAX_CTX)?;
        in_range("limits.queue_depth", l.queue_depth, 1..=4096)?;
        in_range("limits.per_source", l.per_source, 1..=usize::MAX)?;
        in_range("limits.request_timeout_s", l.request_timeout_s, 1..=86_400)?;
        in_range("limits.max_sessions", l.max_sessions, 1..=65_536)?;
        in_range("limits.format_max_bytes", l.format_max_bytes, 16..=16 << 20)?;
        in_range("limits.format_max_depth", l.format_max_depth, 1..=128)?;
        in_range(
            "limits.format_compile_fuel",
            l.format_compile_fuel,
            1000..=1_000_000_000,
        )?;
        in_range(
            "limits.format_step_fuel",
            l.format_step_fuel,
            1000..=1_000_000_000,
        )?;
        in_range(
            "limits.format_max_states",
            l.format_max_states,
            100..=10_000_000,
        )?;
        in_range(
            "limits.format_max_row_items",
            l.format_max_row_items,
            50..=100_000,
        )?;
        Ok(())
    }
}

fn validate_serial(i: usize, s: &SerialConfig) -> Result<(), Bad> {
    let key = |k: &str| format!("serial[{i}].{k}");
    if s.path.as_os_str().is_empty() {
        return Err(bad(key("path"), "is empty"));
    }
    in_range(&key("baud"), s.baud, 1200..=921_600)?;
    if crate::serial::port::baud_rate(s.baud).is_none() {
        return Err(bad(
            key("baud"),
            format!(
                "{}: not a rate a tty can be set to (1200, 2400, 4800, 9600, 19200, 38400, \
                 57600, 115200, 230400, 460800, 921600, …)",
                s.baud
            ),
        ));
    }
    in_range(&key("data_bits"), s.data_bits, 5..=8)?;
    in_range(&key("stop_bits"), s.stop_bits, 1..=2)?;
    in_range(&key("unit_id"), s.unit_id, 1..=247)?;
    if s.mode == SerialMode::Modbus && s.data_bits != 8 {
        return Err(bad(
            key("data_bits"),
            format!("{}: Modbus RTU uses 8 data bits", s.data_bits),
        ));
    }
    Ok(())
}
