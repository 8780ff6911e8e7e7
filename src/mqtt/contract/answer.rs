//! The answer half of the contract: what the daemon publishes on a response topic, and the
//! parser `edgellm ask` and its load generator read it with. One set of types writes and
//! reads every message, so the two sides cannot drift apart.
//!
//! ```json
//! {"id": "r1", "seq": 0, "delta": "The boi", "done": false}
//! {"id": "r1", "text": "The boiling point…", "finish_reason": "stop",
//!  "usage": {"prompt_tokens": 31, "completion_tokens": 12, "restored_tokens": 0},
//!  "timings": {"queue_ms": 0.1, "ttft_ms": 80.2, "decode_tps": 41.5}, "done": true}
//! {"id": "r1", "error": {"code": "busy", "message": "…"}, "done": true}
//! ```

use crate::service::{Done, FinishReason, ServiceError, Usage};
use serde::{Deserialize, Serialize};

/// A streamed piece of the answer (`"done": false`): `seq` counts from 0 without a gap.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Chunk {
    pub id: String,
    pub seq: u64,
    pub delta: String,
}

/// The final message of an answer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Final {
    pub id: String,
    pub text: String,
    /// [`finish_name`]: `stop`, `length`, `cancelled` or `timeout`.
    pub finish_reason: String,
    pub usage: Usage,
    pub timings: FinalTimings,
    /// With a `response_format`: whether the answer has its shape.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub valid: Option<bool>,
    /// A valid answer in a JSON format, parsed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub json: Option<serde_json::Value>,
}

/// The timings a final message carries, in milliseconds (rounded to microseconds).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FinalTimings {
    pub queue_ms: f64,
    pub ttft_ms: f64,
    pub decode_tps: f64,
}

/// Any message on a response topic.
#[derive(Clone, Debug, PartialEq)]
pub enum Reply {
    Chunk(Chunk),
    Final(Final),
    /// The request failed; `id` is `None` when its id could not be read.
    Error {
        id: Option<String>,
        error: ServiceError,
    },
}

impl Reply {
    /// The request id the message answers.
    pub fn id(&self) -> Option<&str> {
        match self {
            Reply::Chunk(c) => Some(&c.id),
            Reply::Final(f) => Some(&f.id),
            Reply::Error { id, .. } => id.as_deref(),
        }
    }
}

/// A message on a response topic that is not one of the contract's.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the daemon's answer is not the MQTT contract's: {0}")]
pub struct ReplyError(String);

/// Every field any reply has: `done` and `error` say which one it is.
#[derive(Deserialize)]
struct Any {
    id: Option<String>,
    done: bool,
    error: Option<ServiceError>,
    seq: Option<u64>,
    delta: Option<String>,
    text: Option<String>,
    finish_reason: Option<String>,
    usage: Option<Usage>,
    timings: Option<FinalTimings>,
    valid: Option<bool>,
    json: Option<serde_json::Value>,
}

/// Reads a message of a response topic. Never panics on what it is given.
pub fn parse_reply(payload: &[u8]) -> Result<Reply, ReplyError> {
    let a: Any = serde_json::from_slice(payload).map_err(|e| ReplyError(e.to_string()))?;
    let missing = |what: &str| ReplyError(format!("no {what} in a message with done={}", a.done));
    if let Some(error) = a.error {
        return Ok(Reply::Error { id: a.id, error });
    }
    let id = a.id.clone().ok_or_else(|| missing("id"))?;
    if !a.done {
        return Ok(Reply::Chunk(Chunk {
            id,
            seq: a.seq.ok_or_else(|| missing("seq"))?,
            delta: a.delta.ok_or_else(|| missing("delta"))?,
        }));
    }
    Ok(Reply::Final(Final {
        id,
        text: a.text.ok_or_else(|| missing("text"))?,
        finish_reason: a.finish_reason.ok_or_else(|| missing("finish_reason"))?,
        usage: a.usage.ok_or_else(|| missing("usage"))?,
        timings: a.timings.ok_or_else(|| missing("timings"))?,
        valid: a.valid,
        json: a.json,
    }))
}

/// The message with `done` beside the fields of `T`.
#[derive(Serialize)]
struct Framed<T> {
    #[serde(flatten)]
    body: T,
    done: bool,
}

fn to_bytes<T: Serialize>(body: T, done: bool) -> Vec<u8> {
    // Cannot fail: strings, numbers and maps with string keys only.
    serde_json::to_vec(&Framed { body, done }).unwrap_or_default()
}

/// A streamed piece of the answer.
pub fn chunk_json(id: &str, seq: u64, delta: &str) -> Vec<u8> {
    let c = Chunk {
        id: id.to_owned(),
        seq,
        delta: delta.to_owned(),
    };
    to_bytes(c, false)
}

/// The wire name of a finish reason (the names OpenAI-style clients know).
pub fn finish_name(f: FinishReason) -> &'static str {
    match f {
        FinishReason::Eog => "stop",
        FinishReason::Length | FinishReason::ContextFull => "length",
        FinishReason::Cancelled => "cancelled",
        FinishReason::Timeout => "timeout",
    }
}

/// The final message of an answer.
pub fn done_json(d: &Done) -> Vec<u8> {
    let t = &d.timings;
    let f = Final {
        id: d.id.clone(),
        text: d.text.clone(),
        finish_reason: finish_name(d.finish_reason).to_owned(),
        usage: d.usage.clone(),
        timings: FinalTimings {
            queue_ms: round3(t.queue_ms),
            ttft_ms: round3(t.ttft_ms),
            decode_tps: round3(t.decode_tps),
        },
        valid: d.valid,
        json: d.json.clone(),
    };
    to_bytes(f, true)
}

/// The answer to a request that failed (`id` null when it could not be read).
pub fn error_json(id: Option<&str>, e: &ServiceError) -> Vec<u8> {
    #[derive(Serialize)]
    struct Failed<'a> {
        id: Option<&'a str>,
        error: &'a ServiceError,
    }
    to_bytes(Failed { id, error: e }, true)
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}
