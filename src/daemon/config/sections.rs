//! The configuration's tables, one struct each with its defaults, and the value types they hold.

use super::{Broker, default_device, parse_size};
use crate::kv::KvType;
use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

// ---------------------------------------------------------------------------------------------
// Value types

/// A password: never printed by `Debug`, so a logged config leaks nothing.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    pub fn new(s: impl Into<String>) -> Secret {
        Secret(s.into())
    }
    /// The password itself, for the one place that sends it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// MQTT protocol version spoken to the broker.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
pub enum Protocol {
    #[serde(rename = "v5")]
    V5,
    #[serde(rename = "v311")]
    V311,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Parity {
    None,
    Even,
    Odd,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
pub enum SerialFlow {
    #[serde(rename = "none")]
    None,
    #[serde(rename = "rtscts")]
    RtsCts,
    #[serde(rename = "xonxoff")]
    XonXoff,
}

/// What a serial port speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SerialMode {
    /// One prompt per line, the answer streamed back as lines.
    Line,
    /// Length-prefixed, checksummed frames.
    Frame,
    /// Modbus RTU slave.
    Modbus,
    /// An interactive console for a technician.
    Console,
}

/// A size key: a string with a binary suffix (`"64K"`) or a plain number of bytes.
fn de_size<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    struct SizeVisitor;
    impl Visitor<'_> for SizeVisitor {
        type Value = u64;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a size such as \"64K\", \"256M\" or a number of bytes")
        }
        fn visit_str<E: de::Error>(self, s: &str) -> Result<u64, E> {
            parse_size(s).map_err(E::custom)
        }
        fn visit_u64<E: de::Error>(self, n: u64) -> Result<u64, E> {
            Ok(n)
        }
        fn visit_i64<E: de::Error>(self, n: i64) -> Result<u64, E> {
            u64::try_from(n).map_err(|_| E::custom(format!("{n} is not a size")))
        }
    }
    d.deserialize_any(SizeVisitor)
}

fn de_listen_addr<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<std::net::SocketAddr>, D::Error> {
    let s = String::deserialize(d)?;
    parse_listen_addr(&s).map(Some).map_err(de::Error::custom)
}

/// A listening address: `ip:port`, `[ipv6]:port`, or `name:port` with the name resolved once,
/// now (`localhost`, a name of /etc/hosts), to its first address.
pub fn parse_listen_addr(s: &str) -> Result<std::net::SocketAddr, String> {
    use std::net::ToSocketAddrs;
    if let Ok(a) = s.parse() {
        return Ok(a);
    }
    let Some((host, port)) = s.rsplit_once(':') else {
        return Err(format!("{s:?} is not host:port"));
    };
    let Ok(port) = port.parse::<u16>() else {
        return Err(format!("{s:?} is not host:port (a port is 0 to 65535)"));
    };
    if host.is_empty() {
        return Err(format!("{s:?} is not host:port"));
    }
    match (host, port).to_socket_addrs().map(|mut a| a.next()) {
        Ok(Some(a)) => Ok(a),
        Ok(None) => Err(format!("{host:?} has no address")),
        Err(e) => Err(format!("cannot resolve {host:?}: {e}")),
    }
}

fn de_kv_type<'de, D: Deserializer<'de>>(d: D) -> Result<KvType, D::Error> {
    let s = String::deserialize(d)?;
    KvType::parse(&s).map_err(de::Error::custom)
}

// ---------------------------------------------------------------------------------------------
// Sections

/// Answers decoded together when neither the configuration nor the board profile says: a
/// step streams the weights once for all of them, and a few sessions' KV caches fit every
/// board's budget.
pub const DEFAULT_MAX_BATCH: usize = 4;

/// `[model]`: which model, and how the engine is sized.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelConfig {
    /// None: the default model of the models/ cache.
    pub path: Option<PathBuf>,
    /// None: the big cores of a big.LITTLE SoC, else every core we may run on.
    pub threads: Option<usize>,
    pub ctx: usize,
    pub chunk: usize,
    /// Answers decoded together in one step. None: the board profile's, else
    /// [`DEFAULT_MAX_BATCH`]; 1: one answer at a time.
    pub max_batch: Option<usize>,
    #[serde(deserialize_with = "de_kv_type")]
    pub kv_type: KvType,
    pub mlock: bool,
    /// A board profile's name (profiles come with the packaging).
    pub board: Option<String>,
    /// A chat template instead of the model's: a Jinja file, or a built-in name (`gemma`,
    /// `chatml`). None: the model file's, else the built-in one of its family.
    pub chat_template: Option<PathBuf>,
}

impl Default for ModelConfig {
    fn default() -> Self {
        ModelConfig {
            path: None,
            threads: None,
            ctx: 2048,
            chunk: 64,
            max_batch: None,
            kv_type: KvType::F16,
            mlock: false,
            board: None,
            chat_template: None,
        }
    }
}

/// `[state]`: where sessions are kept, and how much they may take.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StateConfig {
    /// None: no sessions survive a request (nor a restart).
    pub dir: Option<PathBuf>,
    #[serde(deserialize_with = "de_size")]
    pub disk_budget: u64,
    #[serde(deserialize_with = "de_size")]
    pub ram_budget: u64,
    /// Turns a named session's conversation keeps; older ones leave its log.
    pub conversation_turns: usize,
    /// Bytes of text a named session's conversation keeps; older turns leave its log.
    #[serde(deserialize_with = "de_size")]
    pub conversation_bytes: u64,
}

impl Default for StateConfig {
    fn default() -> Self {
        let bounds = crate::service::ConversationBounds::default();
        StateConfig {
            dir: None,
            disk_budget: 256 << 20,
            ram_budget: 64 << 20,
            conversation_turns: bounds.turns,
            conversation_bytes: bounds.bytes as u64,
        }
    }
}

/// `[mqtt.tls]`: its presence turns TLS on.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// The CA certificate(s), PEM, that sign the broker's certificate.
    pub ca_file: PathBuf,
    /// A client certificate (PEM), with its key.
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
}

/// `[mqtt]`: the broker and the device's topics.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MqttConfig {
    pub broker: Broker,
    pub protocol: Protocol,
    /// The device's topic level (`{prefix}/{device}/request`).
    pub device: String,
    pub username: Option<String>,
    pub password: Option<Secret>,
    /// A file holding the password (its first line), instead of `password`.
    pub password_file: Option<PathBuf>,
    pub tls: Option<TlsConfig>,
    pub allow_plaintext_credentials: bool,
    pub keepalive_s: u64,
    pub prefix: String,
    pub qos: u8,
    pub fleet_group: Option<String>,
    #[serde(deserialize_with = "de_size")]
    pub max_payload: u64,
    /// The embedded broker's MQTT 5 port on 127.0.0.1 (3.1.1 on the next one).
    pub embedded_port: u16,
}

impl Default for MqttConfig {
    fn default() -> Self {
        MqttConfig {
            broker: Broker::Embedded,
            protocol: Protocol::V5,
            device: default_device(),
            username: None,
            password: None,
            password_file: None,
            tls: None,
            allow_plaintext_credentials: false,
            keepalive_s: 30,
            prefix: "edgellm".to_owned(),
            qos: 1,
            fleet_group: None,
            max_payload: 64 << 10,
            embedded_port: 1883,
        }
    }
}

impl MqttConfig {
    pub fn keepalive(&self) -> Duration {
        Duration::from_secs(self.keepalive_s)
    }

    /// A username, a password or a password file is set.
    pub fn has_credentials(&self) -> bool {
        self.username.is_some() || self.password.is_some() || self.password_file.is_some()
    }
}

/// One `[[serial]]` port (the serial front end comes next; the section is validated now).
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SerialConfig {
    pub path: PathBuf,
    #[serde(default = "default_baud")]
    pub baud: u32,
    #[serde(default = "default_data_bits")]
    pub data_bits: u32,
    #[serde(default = "default_parity")]
    pub parity: Parity,
    #[serde(default = "default_stop_bits")]
    pub stop_bits: u32,
    #[serde(default = "default_flow")]
    pub flow: SerialFlow,
    #[serde(default = "default_mode")]
    pub mode: SerialMode,
    /// The Modbus slave address (mode `modbus`).
    #[serde(default = "default_unit_id")]
    pub unit_id: u32,
    /// Drive an RS-485 transceiver's direction line (the kernel's RS-485 mode).
    #[serde(default)]
    pub rs485: bool,
}

fn default_baud() -> u32 {
    115_200
}
fn default_data_bits() -> u32 {
    8
}
fn default_parity() -> Parity {
    Parity::None
}
fn default_stop_bits() -> u32 {
    1
}
fn default_flow() -> SerialFlow {
    SerialFlow::None
}
fn default_mode() -> SerialMode {
    SerialMode::Line
}
fn default_unit_id() -> u32 {
    1
}

/// `[modbus]`: the Modbus TCP server (the RTU ones are `[[serial]]` ports in mode `modbus`),
/// and the answer formats of every Modbus port.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModbusTcpConfig {
    /// Listen here for Modbus TCP masters (`"0.0.0.0:502"`, `"localhost:1502"`); none by
    /// default.
    #[serde(deserialize_with = "de_listen_addr")]
    pub tcp: Option<std::net::SocketAddr>,
    /// The unit id served over TCP (0xFF is served too).
    pub unit_id: u32,
    /// The answer formats (names of `[schemas]` and `[choices]`) a master selects by number
    /// in the `FORMAT` register, on every Modbus port: 1 is the first.
    pub formats: Vec<String>,
}

impl Default for ModbusTcpConfig {
    fn default() -> Self {
        ModbusTcpConfig {
            tcp: None,
            unit_id: default_unit_id(),
            formats: Vec::new(),
        }
    }
}

/// `[limits]`: the bounds every request is held to.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsConfig {
    #[serde(deserialize_with = "de_size")]
    pub max_prompt_bytes: u64,
    pub max_tokens: usize,
    pub queue_depth: usize,
    /// Waiting requests one source may hold; at most `queue_depth` is used.
    pub per_source: usize,
    pub request_timeout_s: u64,
    pub max_sessions: usize,
    /// A named session whose conversation outgrew the context: `slide` drops its oldest turns,
    /// `refuse` answers `context_full`.
    pub context_full: crate::service::ContextFull,
    /// Most bytes of one answer format (a schema, pattern, grammar or choice list).
    #[serde(deserialize_with = "de_size")]
    pub format_max_bytes: u64,
    /// Deepest nesting of a JSON schema.
    pub format_max_depth: usize,
    /// Work allowed to compile one format (about 50 000 units a millisecond).
    pub format_compile_fuel: u64,
    /// Work allowed for one token's mask under a format (about 14 000 units a millisecond).
    pub format_step_fuel: u64,
    /// Most lexer states of one format (1–2 KB each).
    pub format_max_states: usize,
    /// Most parse items at one position of a format (an ambiguous grammar's rows grow with
    /// every token, and each token costs in proportion).
    pub format_max_row_items: usize,
}

impl LimitsConfig {
    /// The limits that changed from `self` to `new` and that serial ports and Modbus servers
    /// keep until a restart: their protocol cores are built with them when they start (the
    /// line bound and the Modbus prompt registers are sized from `max_prompt_bytes`).
    pub fn kept_by_ports(&self, new: &LimitsConfig) -> Vec<&'static str> {
        let mut d = Vec::new();
        if self.max_tokens != new.max_tokens {
            d.push("limits.max_tokens (serial, Modbus)");
        }
        if self.request_timeout_s != new.request_timeout_s {
            d.push("limits.request_timeout_s (serial, Modbus)");
        }
        if self.max_prompt_bytes != new.max_prompt_bytes {
            d.push("limits.max_prompt_bytes (serial, Modbus)");
        }
        d
    }
}

impl Default for LimitsConfig {
    fn default() -> Self {
        let d = crate::service::FormatLimits::default();
        LimitsConfig {
            max_prompt_bytes: 16 << 10,
            max_tokens: 512,
            queue_depth: 16,
            per_source: 8,
            request_timeout_s: 120,
            max_sessions: 64,
            context_full: crate::service::ContextFull::Slide,
            format_max_bytes: d.max_bytes as u64,
            format_max_depth: d.max_depth,
            format_compile_fuel: d.compile_fuel,
            format_step_fuel: d.step_fuel,
            format_max_states: d.max_states,
            format_max_row_items: d.max_row_items,
        }
    }
}

impl LimitsConfig {
    /// What one answer format may cost.
    pub fn format_limits(&self) -> crate::service::FormatLimits {
        crate::service::FormatLimits {
            max_bytes: usize::try_from(self.format_max_bytes).unwrap_or(usize::MAX),
            max_depth: self.format_max_depth,
            compile_fuel: self.format_compile_fuel,
            step_fuel: self.format_step_fuel,
            max_states: self.format_max_states,
            max_row_items: self.format_max_row_items,
        }
    }

    pub fn request_timeout(&self) -> Duration {
        Duration::from_secs(self.request_timeout_s)
    }
}

/// `[audit]`: the record of every answer, in the state directory.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuditSection {
    /// Keep the trail (with a state directory; without one there is nowhere to keep it).
    pub enabled: bool,
    /// Most bytes the trail's segments take together; the oldest goes first.
    #[serde(deserialize_with = "de_size")]
    pub max_bytes: u64,
    /// Also keep the texts: the request, its prompt ids and the answer (what a replay needs).
    pub texts: bool,
}

impl Default for AuditSection {
    fn default() -> Self {
        AuditSection {
            enabled: true,
            max_bytes: 16 << 20,
            texts: false,
        }
    }
}

/// `[log]`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    /// A tracing filter: `info`, `edgellm=debug,warn`.
    pub level: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            level: "info".to_owned(),
        }
    }
}
