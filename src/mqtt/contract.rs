//! The MQTT contract, pure: topics, and request / answer JSON to and from the service's
//! [`Request`] and [`Event`]s. No I/O and no clock of its own (the caller passes `now`), so
//! every byte of the contract is tested without a broker. `docs/mqtt.md` documents it.
//!
//! A request (`{prefix}/{device}/request`, or the fleet's shared topic):
//!
//! ```json
//! {"id": "r1", "prompt": "Status?", "system": "Be brief.", "session": "plc-7",
//!  "max_tokens": 64, "temperature": 0.0, "top_p": 0.95, "top_k": 40, "seed": 7, "stream": true}
//! ```
//!
//! `prompt` (one user message) or `messages` (`[{"role", "content"}]`) is required; everything
//! else is optional. Unknown fields are refused, so a typo is an error, not a default.
//!
//! Both sides use this module: the daemon parses a [`RequestBody`] and publishes the messages
//! of [`answer`]; `edgellm ask` builds a `RequestBody` and reads the answer with
//! [`parse_reply`]. So a field changes in one place for both.

mod answer;

pub use answer::{
    Chunk, Final, FinalTimings, Reply, ReplyError, chunk_json, done_json, error_json, finish_name,
    parse_reply,
};

use crate::engine::SamplingParams;
use crate::engine::store::SessionId;
use crate::service::{ErrorCode, Format, Prompt, Request, ServiceError, Shape, check_id};
use crate::tokenizer::ChatMessage;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Longest topic prefix, device id or fleet group name.
pub const MAX_NAME_LEN: usize = 64;

/// The topics of one device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Topics {
    pub request: String,
    pub cancel: String,
    pub status: String,
    /// `{prefix}/{device}/response/`: an answer without a response topic goes to this + id.
    pub response_base: String,
    /// `$share/{group}/{prefix}/fleet/request`, when the device is in a fleet.
    pub fleet_request: Option<String>,
    /// The fleet topic as published to (without `$share/{group}/`).
    pub fleet_topic: Option<String>,
    /// `{prefix}/fleet/cancel`: not shared, every member hears it (the one answering cancels).
    pub fleet_cancel: Option<String>,
}

/// Why a topic name was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{what} {value:?}: {why}")]
pub struct NameError {
    pub what: &'static str,
    pub value: String,
    pub why: &'static str,
}

/// Checks one topic level (a prefix may hold several, separated by `/`).
fn check_name(what: &'static str, value: &str, levels: bool) -> Result<(), NameError> {
    let err = |why| NameError {
        what,
        value: value.to_owned(),
        why,
    };
    if value.is_empty() || value.len() > MAX_NAME_LEN {
        return Err(err("must have 1 to 64 bytes"));
    }
    if value.contains(['+', '#', '\0']) {
        return Err(err("must not hold the MQTT wildcards + and #, or NUL"));
    }
    if value.starts_with('$') {
        return Err(err("must not start with $ (reserved by brokers)"));
    }
    if !levels && value.contains('/') {
        return Err(err("must be one topic level (no /)"));
    }
    if levels && value.split('/').any(str::is_empty) {
        return Err(err(
            "must not have an empty level (// or a leading or trailing /)",
        ));
    }
    Ok(())
}

impl Topics {
    pub fn new(prefix: &str, device: &str, group: Option<&str>) -> Result<Topics, NameError> {
        check_name("topic prefix", prefix, true)?;
        check_name("device id", device, false)?;
        if let Some(g) = group {
            check_name("fleet group", g, false)?;
        }
        let base = format!("{prefix}/{device}");
        let fleet_topic = group.map(|_| format!("{prefix}/fleet/request"));
        Ok(Topics {
            request: format!("{base}/request"),
            cancel: format!("{base}/cancel"),
            status: format!("{base}/status"),
            response_base: format!("{base}/response/"),
            fleet_request: group.map(|g| format!("$share/{g}/{prefix}/fleet/request")),
            fleet_topic,
            fleet_cancel: group.map(|_| format!("{prefix}/fleet/cancel")),
        })
    }

    /// Where the answer to `id` goes when the request named no response topic.
    pub fn response(&self, id: &str) -> String {
        format!("{}{id}", self.response_base)
    }
}

/// The largest MQTT packet the daemon takes in, for requests of at most `max_payload` bytes:
/// twice that, so a request somewhat over the limit still arrives and is answered `too_large`
/// rather than dropped unanswered, plus 4 KiB for the packet's topic and properties (a broker's
/// packet limit counts them too).
pub fn max_packet(max_payload: usize) -> usize {
    max_payload.saturating_mul(2).saturating_add(4096)
}

/// Bounds a request is held to.
#[derive(Clone, Debug)]
pub struct Limits {
    pub max_payload: usize,
    pub max_tokens: usize,
    /// From arrival to the end of the answer.
    pub timeout: Option<Duration>,
}

/// A request as it travels: what a client writes ([`RequestBody::to_json`]) and the daemon
/// reads ([`parse_request`]). Every field but the prompt is optional; a field left `None` is
/// left out of the JSON.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestBody {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub messages: Option<Vec<ChatMessage>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub system: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_k: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// Send the answer as chunks before the final message.
    #[serde(default)]
    pub stream: bool,
    /// With `session` and no prompt: forget the session (its conversation and its cache).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub reset: bool,
    /// With `session` and no prompt: answer the session's conversation as text.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub history: bool,
    /// The shape the answer must have.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub response_format: Option<ResponseFormat>,
}

/// `response_format`: `{"type": "json_schema", "schema": {…}}`, `{"type": "json_object"}`,
/// `{"type": "regex", "pattern": "…"}`, `{"type": "choice", "options": […]}`,
/// `{"type": "lark", "grammar": "…"}`, or a configured one by name: `{"schema_ref": "alarm"}`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResponseFormat {
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub schema: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pattern: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub options: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grammar: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub schema_ref: Option<String>,
}

impl ResponseFormat {
    /// The `response_format` that asks for `shape`.
    pub fn of(shape: &Shape) -> ResponseFormat {
        // Cannot fail: the shape's JSON has this struct's fields.
        serde_json::from_value(shape.to_json()).unwrap_or_default()
    }

    /// The service's format, or why this one is not one.
    pub fn to_format(&self) -> Result<Format, String> {
        let given = [
            ("schema", self.schema.is_some()),
            ("pattern", self.pattern.is_some()),
            ("options", self.options.is_some()),
            ("grammar", self.grammar.is_some()),
        ];
        let extra = |allowed: &str| {
            given
                .iter()
                .find(|(name, set)| *set && *name != allowed)
                .map(|(name, _)| name.to_string())
        };
        if let Some(name) = &self.schema_ref {
            if self.kind.is_some() || given.iter().any(|g| g.1) {
                return Err("response_format: schema_ref stands alone".into());
            }
            return Ok(Format::Named(name.clone()));
        }
        let kind = self.kind.as_deref().ok_or(
            "response_format needs a type (json_schema, json_object, regex, choice, lark) or a \
             schema_ref",
        )?;
        let (shape, field) = match kind {
            "json_schema" => (self.schema.clone().map(Shape::JsonSchema), "schema"),
            "json_object" => (Some(Shape::JsonObject), ""),
            "regex" => (self.pattern.clone().map(Shape::Regex), "pattern"),
            "choice" => (self.options.clone().map(Shape::Choice), "options"),
            "lark" => (self.grammar.clone().map(Shape::Lark), "grammar"),
            other => {
                return Err(format!(
                    "response_format type {other:?} is none of json_schema, json_object, regex, \
                     choice, lark"
                ));
            }
        };
        if let Some(x) = extra(field) {
            return Err(format!("response_format of type {kind} takes no {x}"));
        }
        let shape = shape.ok_or_else(|| format!("response_format of type {kind} needs {field}"))?;
        Ok(Format::Shape(Arc::new(shape)))
    }
}

impl RequestBody {
    /// A request for one user message, answered in one final message.
    pub fn prompt(text: impl Into<String>) -> RequestBody {
        RequestBody {
            prompt: Some(text.into()),
            ..RequestBody::default()
        }
    }

    /// The payload to publish on the request topic.
    pub fn to_json(&self) -> Vec<u8> {
        // Cannot fail: strings, numbers and a list of string pairs.
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// A parsed request, and how its answer is wanted.
#[derive(Debug)]
pub struct Parsed {
    pub request: Request,
    /// Send `Text` events as chunks before the final message.
    pub stream: bool,
    /// The id was generated here (the request had none): the answer tells the client.
    pub generated_id: bool,
}

/// A request that could not be parsed: the error to answer, with the request's id when it
/// could be read.
#[derive(Debug, PartialEq)]
pub struct Refused {
    pub id: Option<String>,
    /// The session the request named, as sent, when it was read.
    pub session: Option<String>,
    pub error: ServiceError,
}

/// Where a request came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// The device's own request topic.
    Device,
    /// The fleet's shared topic: any device may answer, so no session can be named.
    Fleet,
}

/// Parses a request payload. `source` keys the queue's fairness (the response topic, which is
/// the client's own); `fresh_id` is used when the request has no id.
pub fn parse_request(
    payload: &[u8],
    origin: Origin,
    source: &str,
    fresh_id: impl FnOnce() -> String,
    limits: &Limits,
    now: Instant,
) -> Result<Parsed, Refused> {
    let refuse = |id: Option<String>, code, msg: String| Refused {
        id,
        session: None,
        error: ServiceError::new(code, msg),
    };
    if payload.len() > limits.max_payload {
        // The id, if the oversized payload is JSON that has one, so the client can match the
        // answer (the payload is bounded by the connection's packet size).
        #[derive(Deserialize)]
        struct IdOnly {
            id: Option<String>,
        }
        let id = serde_json::from_slice::<IdOnly>(payload)
            .ok()
            .and_then(|v| v.id)
            .filter(|id| valid_id(id));
        return Err(refuse(
            id,
            ErrorCode::TooLarge,
            format!(
                "the request is {} bytes; at most {} are accepted",
                payload.len(),
                limits.max_payload
            ),
        ));
    }
    let wire: RequestBody = match serde_json::from_slice(payload) {
        Ok(w) => w,
        Err(e) => {
            // Answer with the id if the payload is JSON that has one.
            let id = serde_json::from_slice::<Value>(payload)
                .ok()
                .and_then(|v| v.get("id").and_then(Value::as_str).map(str::to_owned))
                .filter(|id| valid_id(id));
            return Err(refuse(
                id,
                ErrorCode::BadRequest,
                format!("invalid request: {e}"),
            ));
        }
    };
    let (id, generated_id) = match wire.id {
        Some(id) => match check_id(&id, &ID_RESERVED) {
            Ok(()) => (id, false),
            Err(error) => {
                return Err(Refused {
                    id: None,
                    session: None,
                    error,
                });
            }
        },
        None => (fresh_id(), true),
    };
    let bad = |msg: String| refuse(Some(id.clone()), ErrorCode::BadRequest, msg);
    // `prompt` continues a named session's conversation, `messages` replace it.
    let replace = wire.messages.is_some();
    if wire.reset && wire.history {
        return Err(bad("give reset or history, not both".into()));
    }
    let prompt = match (wire.prompt, wire.messages, wire.reset || wire.history) {
        (Some(_), Some(_), _) => return Err(bad("give prompt or messages, not both".into())),
        (None, None, true) if wire.session.is_some() && wire.reset => Prompt::Forget,
        (None, None, true) if wire.session.is_some() => Prompt::History,
        (None, None, true) => return Err(bad("reset and history need a session".into())),
        (_, _, true) => return Err(bad("reset and history have no prompt or messages".into())),
        (None, None, false) => {
            return Err(bad("the request needs a prompt or messages".into()));
        }
        (Some(p), None, false) => Prompt::Chat(vec![ChatMessage::new("user", p)]),
        (None, Some(m), false) => Prompt::Chat(m),
    };
    let session = match wire.session {
        None => None,
        Some(s) if origin == Origin::Fleet => {
            return Err(Refused {
                session: Some(s),
                ..bad(
                    "a fleet request cannot name a session (any device may answer it): send it \
                     to the device's own request topic"
                        .into(),
                )
            });
        }
        Some(s) => match SessionId::parse(&s) {
            Ok(id) => Some(id),
            Err(e) => {
                return Err(Refused {
                    session: Some(s),
                    ..bad(e.to_string())
                });
            }
        },
    };
    let max_tokens = wire.max_tokens.unwrap_or(limits.max_tokens.min(256));
    if max_tokens == 0 || max_tokens > limits.max_tokens {
        return Err(refuse(
            Some(id),
            ErrorCode::TooLarge,
            format!(
                "max_tokens must be 1 to {}, got {max_tokens}",
                limits.max_tokens
            ),
        ));
    }
    let d = SamplingParams::default();
    let sampling = SamplingParams {
        temperature: wire.temperature.unwrap_or(0.0),
        top_p: wire.top_p.unwrap_or(d.top_p),
        top_k: wire.top_k.unwrap_or(d.top_k),
        seed: wire.seed.unwrap_or(d.seed),
        ..d
    };
    sampling.validate().map_err(|e| bad(e.to_string()))?;
    let format = match &wire.response_format {
        None => None,
        Some(f) => Some(f.to_format().map_err(bad)?),
    };
    let mut request = Request::new(id, source, prompt);
    request.system = wire.system;
    request.session = session;
    request.replace = replace;
    request.sampling = sampling;
    request.max_tokens = max_tokens;
    request.deadline = limits.timeout.map(|t| now + t);
    request.format = format;
    Ok(Parsed {
        request,
        stream: wire.stream,
        generated_id,
    })
}

/// What a request id cannot hold over MQTT beyond the service's rule: it becomes a topic level.
const ID_RESERVED: [char; 3] = ['/', '+', '#'];

/// A request id: 1 to [`MAX_ID_LEN`](crate::service::MAX_ID_LEN) bytes of printable ASCII, and
/// one topic level.
pub fn valid_id(id: &str) -> bool {
    check_id(id, &ID_RESERVED).is_ok()
}

/// `{"id"}` on the cancel topic: the id to cancel.
pub fn parse_cancel(payload: &[u8]) -> Result<String, ServiceError> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Cancel {
        id: String,
    }
    if payload.len() > 1024 {
        return Err(ServiceError::new(
            ErrorCode::TooLarge,
            "a cancel request is at most 1024 bytes",
        ));
    }
    serde_json::from_slice::<Cancel>(payload)
        .map(|c| c.id)
        .map_err(|e| ServiceError::new(ErrorCode::BadRequest, format!("invalid cancel: {e}")))
}

#[cfg(test)]
mod tests;
