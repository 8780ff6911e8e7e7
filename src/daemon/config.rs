//! The daemon's configuration: one TOML file (`edgellm.toml` at the repository root is the
//! commented example, `docs/config.md` the reference), every key defaulted, so no file at all
//! is a working appliance (the default model, an embedded broker on 127.0.0.1).
//!
//! Pure but for [`Config::load`], which reads the file (at most [`MAX_FILE_BYTES`]) and checks
//! that secrets are not readable by others. Every table refuses unknown keys, so a typo is an
//! error, not a default; every refusal is one line that names the file, the key and the reason:
//!
//! ```text
//! /etc/edgellm.toml:12: mqtt.keepalive_s: 2 is out of range 5..=3600
//! ```
//!
//! Relative paths in a file are taken from the file's directory (systemd starts the daemon in
//! `/`); paths given as [`Overrides`] are taken as they are (from the caller's directory).
//! Messages name keys, never command-line flags: the CLI maps its flags to [`Overrides`].

pub use super::broker::Broker;
use crate::board::Profile;
use crate::engine::store::StoreConfig;
use crate::engine::{EngineConfig, default_threads};
use crate::mqtt::contract::{Limits, MAX_NAME_LEN, NameError, Topics};
use crate::service::{ServiceConfig, Sessions, Shape};
use check::{Bad, bad};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::str::FromStr;

mod check;
mod lines;
mod sections;
use lines::{KeyLines, line_at};

pub use sections::{
    AuditSection, LimitsConfig, LogConfig, ModbusTcpConfig, ModelConfig, MqttConfig, Parity,
    Protocol, Secret, SerialConfig, SerialFlow, SerialMode, StateConfig, TlsConfig,
    parse_listen_addr,
};

/// Largest configuration file read: anything bigger is not a configuration.
pub const MAX_FILE_BYTES: u64 = 1 << 20;
/// Largest `mqtt.max_payload`.
pub const MAX_PAYLOAD: u64 = 16 << 20;
/// Largest password file read.
const MAX_PASSWORD_FILE_BYTES: u64 = 4096;

/// A parsed byte size: `4096`, `64K`, `256M`, `2G` (powers of 1024). The CLI's size flags and
/// the configuration's size keys share it.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, shift) = match s.char_indices().last() {
        Some((i, 'k' | 'K')) => (&s[..i], 10),
        Some((i, 'm' | 'M')) => (&s[..i], 20),
        Some((i, 'g' | 'G')) => (&s[..i], 30),
        _ => (s, 0),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(1 << shift))
        .ok_or_else(|| format!("{s:?} is not a size (e.g. 4096, 64K, 256M, 2G)"))
}

// ---------------------------------------------------------------------------------------------
// Errors

/// Where a setting came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    File(PathBuf),
    /// Text given to [`Config::from_str`].
    Text,
    /// A value of [`Overrides`].
    Override,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::File(p) => write!(f, "{}", p.display()),
            Origin::Text => f.write_str("configuration"),
            Origin::Override => f.write_str("override"),
        }
    }
}

/// Why a configuration was refused. Each message is one line: the file (and line where the
/// parser knows it), the key, the reason.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{}: cannot read: {source}", file.display())]
    Read {
        file: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: too large: more than {max} bytes", file.display())]
    TooLarge { file: PathBuf, max: u64 },
    /// Not TOML: there is no key to name, the line says where.
    #[error("{origin}{}: {reason}", line_suffix(*line))]
    Syntax {
        origin: Origin,
        line: Option<usize>,
        reason: String,
    },
    #[error("{origin}{}: {key}: {reason}", line_suffix(*line))]
    Invalid {
        origin: Origin,
        line: Option<usize>,
        /// The key's dotted path: `mqtt.keepalive_s`, `serial[1].baud`.
        key: String,
        reason: String,
    },
}

fn line_suffix(line: Option<usize>) -> String {
    line.map(|l| format!(":{l}")).unwrap_or_default()
}

impl ConfigError {
    /// The key the error is about, if any.
    pub fn key(&self) -> Option<&str> {
        match self {
            ConfigError::Invalid { key, .. } => Some(key),
            _ => None,
        }
    }
}

/// The default device id: this machine's host name made a valid topic level, else `edgellm`.
pub fn default_device() -> String {
    let host = nix::unistd::gethostname().unwrap_or_default();
    device_from_hostname(&host.to_string_lossy())
}

/// A host name as a topic level: characters other than letters, digits, `.`, `-` and `_`
/// become `_` (so no wildcard, `/` or `$`), at most [`MAX_NAME_LEN`] bytes; `edgellm` when
/// nothing is left.
pub fn device_from_hostname(host: &str) -> String {
    let keep = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_');
    let s: String = host
        .trim()
        .chars()
        .map(|c| if keep(c) { c } else { '_' })
        .take(MAX_NAME_LEN)
        .collect();
    if s.is_empty() {
        "edgellm".to_owned()
    } else {
        s
    }
}

// ---------------------------------------------------------------------------------------------
// The whole

/// The daemon's configuration. [`Config::default`] is the embedded default (no file).
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub model: ModelConfig,
    pub state: StateConfig,
    pub mqtt: MqttConfig,
    pub serial: Vec<SerialConfig>,
    pub modbus: ModbusTcpConfig,
    pub limits: LimitsConfig,
    pub audit: AuditSection,
    pub log: LogConfig,
    /// `[schemas]`: answer formats by name, each a JSON Schema file (`alarm = "alarm.json"`).
    pub schemas: BTreeMap<String, PathBuf>,
    /// `[choices]`: answer formats by name, each a list of the answers allowed
    /// (`severity = ["low", "high"]`).
    pub choices: BTreeMap<String, Vec<String>>,
    /// The file it was loaded from.
    #[serde(skip)]
    file: Option<PathBuf>,
    /// Keys set by [`Config::apply`]: their errors name the override, not the file.
    #[serde(skip)]
    overridden: Vec<&'static str>,
    /// The line of each key of the file, for the errors found after parsing.
    #[serde(skip)]
    lines: KeyLines,
}

/// The settings the command line may override (flags win over the file).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Overrides {
    pub model: Option<PathBuf>,
    /// `host:port`, `embedded` or `off`, as `mqtt.broker`.
    pub mqtt: Option<String>,
    pub device: Option<String>,
    pub state_dir: Option<PathBuf>,
    pub threads: Option<usize>,
    pub ctx: Option<usize>,
    /// `PATH[:BAUD[:MODE]]` for each port: replaces the file's `[[serial]]` list.
    pub serial: Vec<String>,
    /// A board profile's name, as `model.board`.
    pub board: Option<String>,
    /// As `model.chat_template`.
    pub chat_template: Option<PathBuf>,
}

impl FromStr for Config {
    type Err = ConfigError;
    /// Parses and validates configuration text (no file is read: a `password_file` is only
    /// checked by [`Config::load`] and read by [`Config::password`]).
    fn from_str(text: &str) -> Result<Config, ConfigError> {
        let cfg = parse(text, &Origin::Text)?;
        cfg.check()?;
        Ok(cfg)
    }
}

impl Config {
    /// Reads, parses and validates a configuration file, and checks its secrets: a file that
    /// holds `mqtt.password` must not be readable by group or others, nor may the
    /// `mqtt.password_file` or the TLS key.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let (text, access) = read_bounded(path, MAX_FILE_BYTES)?;
        let origin = Origin::File(path.to_owned());
        let text = String::from_utf8(text).map_err(|_| ConfigError::Syntax {
            origin: origin.clone(),
            line: None,
            reason: "not UTF-8 text".to_owned(),
        })?;
        let mut cfg = parse(&text, &origin)?;
        cfg.file = Some(path.to_owned());
        if let Some(dir) = path.parent() {
            cfg.resolve_paths(dir);
        }
        cfg.check()?;
        if cfg.mqtt.password.is_some()
            && let Some(why) = access.exposed()
        {
            return Err(cfg.invalid(bad(
                "mqtt.password",
                format!(
                    "the file holds a password but {why}; make it 0600, or 0640 in the \
                     daemon's group (chgrp edgellm), or move the password to \
                     mqtt.password_file"
                ),
            )));
        }
        if let Some(pw) = &cfg.mqtt.password_file {
            cfg.private_file("mqtt.password_file", pw)?;
        }
        if let Some(key) = cfg.mqtt.tls.as_ref().and_then(|t| t.key_file.as_ref()) {
            cfg.private_file("mqtt.tls.key_file", key)?;
        }
        Ok(cfg)
    }

    /// The file this configuration was loaded from.
    pub fn file(&self) -> Option<&Path> {
        self.file.as_deref()
    }

    /// Overrides keys (flags win over the file), validated as the file is. On error the
    /// configuration is unchanged.
    pub fn apply(&mut self, o: &Overrides) -> Result<(), ConfigError> {
        let mut next = self.clone();
        let mut set = |key: &'static str| {
            if !next.overridden.contains(&key) {
                next.overridden.push(key);
            }
        };
        if o.model.is_some() {
            set("model.path");
        }
        if o.threads.is_some() {
            set("model.threads");
        }
        if o.ctx.is_some() {
            set("model.ctx");
        }
        if o.mqtt.is_some() {
            set("mqtt.broker");
        }
        if o.device.is_some() {
            set("mqtt.device");
        }
        if o.state_dir.is_some() {
            set("state.dir");
        }
        if !o.serial.is_empty() {
            set("serial");
        }
        if o.board.is_some() {
            set("model.board");
        }
        if o.chat_template.is_some() {
            set("model.chat_template");
        }
        if let Some(t) = &o.chat_template {
            next.model.chat_template = Some(t.clone());
        }
        if let Some(b) = &o.board {
            next.model.board = Some(b.clone());
        }
        if let Some(m) = &o.model {
            next.model.path = Some(m.clone());
        }
        if let Some(t) = o.threads {
            next.model.threads = Some(t);
        }
        if let Some(c) = o.ctx {
            next.model.ctx = c;
        }
        if let Some(b) = &o.mqtt {
            next.mqtt.broker = Broker::parse(b).map_err(|r| next.invalid(bad("mqtt.broker", r)))?;
        }
        if let Some(d) = &o.device {
            next.mqtt.device = d.clone();
        }
        if let Some(s) = &o.state_dir {
            next.state.dir = Some(s.clone());
        }
        if !o.serial.is_empty() {
            next.serial = o
                .serial
                .iter()
                .enumerate()
                .map(|(i, s)| {
                    parse_serial(s).map_err(|r| next.invalid(bad(format!("serial[{i}]"), r)))
                })
                .collect::<Result<_, _>>()?;
        }
        next.check()?;
        *self = next;
        Ok(())
    }

    /// The MQTT password: `mqtt.password`, or the first line of `mqtt.password_file` (read
    /// now, so a rotated password is used at the next connection).
    pub fn password(&self) -> Result<Option<Secret>, ConfigError> {
        if let Some(p) = &self.mqtt.password {
            return Ok(Some(p.clone()));
        }
        let Some(path) = &self.mqtt.password_file else {
            return Ok(None);
        };
        let (bytes, access) = read_bounded(path, MAX_PASSWORD_FILE_BYTES)
            .map_err(|e| self.invalid(bad("mqtt.password_file", e.to_string())))?;
        self.check_private("mqtt.password_file", path, access)?;
        let text = String::from_utf8(bytes)
            .map_err(|_| self.invalid(bad("mqtt.password_file", "the file is not UTF-8 text")))?;
        let line = text.lines().next().unwrap_or("");
        if line.is_empty() {
            return Err(self.invalid(bad(
                "mqtt.password_file",
                format!("{} holds no password", path.display()),
            )));
        }
        Ok(Some(Secret::new(line)))
    }

    /// The engine's sizes. Threads: `model.threads`, else the board profile's, else the
    /// default (the big cores, or every core). The batch likewise (at most the chunk).
    pub fn engine_config(&self) -> EngineConfig {
        EngineConfig {
            n_ctx: self.model.ctx,
            chunk: self.model.chunk,
            threads: self
                .model
                .threads
                .or_else(|| self.board().and_then(|b| b.threads))
                .unwrap_or_else(default_threads),
            kv_type: self.model.kv_type,
            max_batch: self.model.max_batch.unwrap_or_else(|| {
                self.board()
                    .and_then(|b| b.max_batch)
                    .unwrap_or(sections::DEFAULT_MAX_BATCH)
                    .clamp(1, self.model.chunk.min(crate::engine::MAX_BATCH))
            }),
        }
    }

    /// The board profile `model.board` names (validated: an unknown name is refused).
    pub fn board(&self) -> Option<&'static Profile> {
        self.model
            .board
            .as_deref()
            .and_then(|b| crate::board::get(b).ok())
    }

    /// The session store, when a state directory is set.
    pub fn store_config(&self) -> Option<StoreConfig> {
        self.state.dir.as_ref().map(|dir| StoreConfig {
            dir: dir.clone(),
            ram_bytes: self.state.ram_budget,
            disk_bytes: self.state.disk_budget,
            max_sessions: Some(self.limits.max_sessions),
        })
    }

    /// The audit trail's settings: `None` when it is off or there is no state directory.
    pub fn audit_config(&self) -> Option<crate::audit::AuditConfig> {
        let dir = self.state.dir.as_ref().filter(|_| self.audit.enabled)?;
        Some(crate::audit::AuditConfig {
            dir: dir.join(crate::audit::DIR),
            max_bytes: self.audit.max_bytes,
            texts: self.audit.texts,
        })
    }

    /// The sections that differ from `other`, but for `[limits]` and `[log]` (a reload applies
    /// those): what a restart is needed for.
    pub fn differs_from(&self, other: &Config) -> Vec<&'static str> {
        let mut d = Vec::new();
        if self.model != other.model {
            d.push("model");
        }
        if self.state != other.state {
            d.push("state");
        }
        if self.mqtt != other.mqtt {
            d.push("mqtt");
        }
        if self.serial != other.serial {
            d.push("serial");
        }
        if self.modbus != other.modbus {
            d.push("modbus");
        }
        if self.audit != other.audit {
            d.push("audit");
        }
        // The store is opened once with it.
        if self.limits.max_sessions != other.limits.max_sessions {
            d.push("limits.max_sessions");
        }
        // The worker is started with it.
        if self.limits.context_full != other.limits.context_full {
            d.push("limits.context_full");
        }
        // Formats are compiled, and their bounds set, when the worker starts.
        if self.schemas != other.schemas {
            d.push("schemas");
        }
        if self.choices != other.choices {
            d.push("choices");
        }
        if self.limits.format_limits() != other.limits.format_limits() {
            d.push("limits.format_*");
        }
        d
    }

    /// The service worker's sizes (`per_source` clamped to `queue_depth`) and sessions.
    pub fn service_config(&self) -> ServiceConfig {
        let l = &self.limits;
        ServiceConfig {
            queue_depth: l.queue_depth,
            per_source: l.per_source.min(l.queue_depth),
            max_prompt_bytes: usize::try_from(l.max_prompt_bytes).unwrap_or(usize::MAX),
            sessions: self.store_config().map_or(Sessions::None, Sessions::Dir),
            chat_template: self.model.chat_template.clone(),
            context_full: l.context_full,
            conversations: crate::service::ConversationBounds {
                turns: self.state.conversation_turns,
                bytes: usize::try_from(self.state.conversation_bytes).unwrap_or(usize::MAX),
            },
            format_limits: l.format_limits(),
            ..ServiceConfig::default()
        }
    }

    /// The MQTT contract's bounds on a request.
    pub fn limits(&self) -> Limits {
        Limits {
            max_payload: usize::try_from(self.mqtt.max_payload).unwrap_or(usize::MAX),
            max_tokens: self.limits.max_tokens,
            timeout: Some(self.limits.request_timeout()),
        }
    }

    /// The device's topics.
    pub fn topics(&self) -> Result<Topics, NameError> {
        let m = &self.mqtt;
        Topics::new(&m.prefix, &m.device, m.fleet_group.as_deref())
    }

    fn origin_of(&self, key: &str) -> Origin {
        match &self.file {
            // `serial` overridden covers `serial[0].baud`.
            _ if self.overridden.iter().any(|o| {
                key.strip_prefix(o)
                    .is_some_and(|r| r.is_empty() || r.starts_with(['[', '.']))
            }) =>
            {
                Origin::Override
            }
            Some(f) => Origin::File(f.clone()),
            None => Origin::Text,
        }
    }

    fn invalid(&self, b: Bad) -> ConfigError {
        let origin = self.origin_of(&b.key);
        ConfigError::Invalid {
            line: match origin {
                Origin::Override => None,
                _ => self.lines.line(&b.key),
            },
            origin,
            key: b.key,
            reason: b.reason,
        }
    }

    /// A secret file must exist and be readable by its owner only.
    fn private_file(&self, key: &str, path: &Path) -> Result<(), ConfigError> {
        let meta = std::fs::metadata(path)
            .map_err(|e| self.invalid(bad(key, format!("cannot read {}: {e}", path.display()))))?;
        self.check_private(key, path, Access::of(&meta))
    }

    fn check_private(&self, key: &str, path: &Path, access: Access) -> Result<(), ConfigError> {
        match access.exposed() {
            None => Ok(()),
            Some(why) => Err(self.invalid(bad(
                key,
                format!(
                    "{}: {why}; make it 0600, or 0640 in the daemon's group (chgrp edgellm)",
                    path.display()
                ),
            ))),
        }
    }

    fn resolve_paths(&mut self, dir: &Path) {
        let fix = |p: &mut PathBuf| {
            if p.is_relative() && !p.as_os_str().is_empty() {
                *p = dir.join(&*p);
            }
        };
        self.model.path.iter_mut().for_each(fix);
        // A built-in template's name is not a path.
        if let Some(t) = &mut self.model.chat_template
            && !t
                .to_str()
                .is_some_and(|n| crate::tokenizer::built_in_names().contains(&n))
        {
            fix(t);
        }
        self.state.dir.iter_mut().for_each(fix);
        self.mqtt.password_file.iter_mut().for_each(fix);
        if let Some(t) = &mut self.mqtt.tls {
            fix(&mut t.ca_file);
            t.cert_file.iter_mut().for_each(fix);
            t.key_file.iter_mut().for_each(fix);
        }
        self.serial.iter_mut().for_each(|s| fix(&mut s.path));
        self.schemas.values_mut().for_each(fix);
    }

    /// The named answer formats of `[schemas]` (each file read and parsed) and `[choices]`.
    pub fn formats(&self) -> Result<BTreeMap<String, Shape>, ConfigError> {
        let mut out = BTreeMap::new();
        for (name, path) in &self.schemas {
            let key = format!("schemas.{name}");
            let max = self.limits.format_max_bytes;
            let (text, _) = read_bounded(path, max)?;
            let schema: serde_json::Value = serde_json::from_slice(&text).map_err(|e| {
                self.invalid(bad(
                    &key,
                    format!("{}: not a JSON schema: {e}", path.display()),
                ))
            })?;
            out.insert(name.clone(), Shape::JsonSchema(schema));
        }
        for (name, options) in &self.choices {
            out.insert(name.clone(), Shape::Choice(options.clone()));
        }
        Ok(out)
    }
}

/// A port given as `PATH[:BAUD[:MODE]]`, read from the right so that a path with colons
/// (`/dev/serial/by-path/…-usb-0:1.3:1.0-port0`) stays whole: a last part that is a mode is
/// the mode, a last part of digits the baud rate.
pub fn parse_serial(arg: &str) -> Result<SerialConfig, String> {
    let mut s: SerialConfig = toml::from_str("path = \"-\"").map_err(|e| e.to_string())?;
    let mut rest = arg;
    if let Some((head, last)) = rest.rsplit_once(':') {
        let mode = match last {
            "line" => Some(SerialMode::Line),
            "frame" => Some(SerialMode::Frame),
            "modbus" => Some(SerialMode::Modbus),
            "console" => Some(SerialMode::Console),
            _ => None,
        };
        if let Some(m) = mode {
            s.mode = m;
            rest = head;
        }
    }
    if let Some((head, last)) = rest.rsplit_once(':')
        && !last.is_empty()
        && last.bytes().all(|b| b.is_ascii_digit())
    {
        s.baud = last
            .parse()
            .map_err(|_| format!("{last}: not a baud rate"))?;
        rest = head;
    }
    if rest.is_empty() {
        return Err(format!(
            "{arg:?}: give PATH[:BAUD[:MODE]], MODE one of line, frame, modbus, console"
        ));
    }
    s.path = PathBuf::from(rest);
    Ok(s)
}

/// Parses TOML into a [`Config`] (not yet validated); errors carry the key's path and the line.
fn parse(text: &str, origin: &Origin) -> Result<Config, ConfigError> {
    let line_of = |span: Option<std::ops::Range<usize>>| span.map(|s| line_at(text, s.start));
    let de = toml::Deserializer::parse(text).map_err(|e| ConfigError::Syntax {
        origin: origin.clone(),
        line: line_of(e.span()),
        reason: one_line(e.message()),
    })?;
    let parsed: Result<Config, _> = serde_path_to_error::deserialize(de);
    parsed
        .map(|c| Config {
            lines: KeyLines::of(text),
            ..c
        })
        .map_err(|e| {
            let mut key = e.path().to_string();
            let inner = e.into_inner();
            let line = line_of(inner.span());
            let mut reason = one_line(inner.message());
            // serde names a missing key in the message; the key belongs in the path.
            if let Some(field) = reason
                .strip_prefix("missing field `")
                .and_then(|r| r.strip_suffix('`'))
            {
                key = format!("{key}.{field}");
                reason = "is required".to_owned();
            }
            if key.is_empty() || key == "." {
                ConfigError::Syntax {
                    origin: origin.clone(),
                    line,
                    reason,
                }
            } else {
                ConfigError::Invalid {
                    origin: origin.clone(),
                    line,
                    key,
                    reason,
                }
            }
        })
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Who besides the owner may read a file that holds a secret.
#[derive(Clone, Copy, Debug)]
struct Access {
    mode: u32,
    gid: u32,
}

impl Access {
    fn of(meta: &std::fs::Metadata) -> Access {
        use std::os::unix::fs::MetadataExt;
        Access {
            mode: meta.mode(),
            gid: meta.gid(),
        }
    }

    /// Why the secret is exposed, if it is. One rule for every package: others have no
    /// access, and the group has none either unless it is the daemon's own. The .deb and
    /// the Yocto image install the configuration 0640 root:edgellm, so the unit (User=edgellm)
    /// reads it and nobody else does; 0600 owned by the daemon's user works too. Root reads
    /// every file anyway, and a technician checking the packaged file as root must be told
    /// what the unit will accept, so for root any group may read.
    fn exposed(self) -> Option<String> {
        let mode = self.mode & 0o777;
        if mode & 0o007 != 0 {
            return Some(format!("others may read it (mode {mode:03o})"));
        }
        if mode & 0o020 != 0 {
            return Some(format!("its group may write it (mode {mode:03o})"));
        }
        let own_group = self.gid == nix::unistd::getegid().as_raw();
        let root = nix::unistd::geteuid().is_root();
        if mode & 0o070 != 0 && !own_group && !root {
            return Some(format!(
                "group {} may read it (mode {mode:03o}) and is not the daemon's group",
                self.gid
            ));
        }
        None
    }
}

/// Reads at most `max` bytes of a file, with its mode and group (of the file opened, not of
/// a path that might change between a stat and the read).
fn read_bounded(path: &Path, max: u64) -> Result<(Vec<u8>, Access), ConfigError> {
    let read_err = |source| ConfigError::Read {
        file: path.to_owned(),
        source,
    };
    let file = std::fs::File::open(path).map_err(read_err)?;
    let meta = file.metadata().map_err(read_err)?;
    let too_large = || ConfigError::TooLarge {
        file: path.to_owned(),
        max,
    };
    if meta.len() > max {
        return Err(too_large());
    }
    let mut buf = Vec::new();
    file.take(max + 1).read_to_end(&mut buf).map_err(read_err)?;
    if buf.len() as u64 > max {
        return Err(too_large());
    }
    Ok((buf, Access::of(&meta)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_take_binary_suffixes_and_refuse_nonsense() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64K"), Ok(64 << 10));
        assert_eq!(parse_size("256m"), Ok(256 << 20));
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        for bad in ["", "M", "-1", "1.5G", "99999999999G", "12T"] {
            assert!(parse_size(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn host_names_become_valid_device_ids() {
        assert_eq!(device_from_hostname("gw-7.plant"), "gw-7.plant");
        assert_eq!(device_from_hostname("a/b+c#d$e f"), "a_b_c_d_e_f");
        assert_eq!(device_from_hostname("$SYS"), "_SYS");
        assert_eq!(device_from_hostname(""), "edgellm");
        assert_eq!(device_from_hostname(&"x".repeat(100)).len(), MAX_NAME_LEN);
        let d = default_device();
        assert!(Topics::new("edgellm", &d, None).is_ok(), "{d:?}");
    }
}
