//! The audit trail: what the appliance answered, to whom, with which model and settings, kept
//! so that someone can say afterwards what it answered and why, and show that the record was
//! not edited.
//!
//! One entry per ended request (an answer, or a refusal with its code), appended to the state
//! directory's `audit/` as a line of JSON and synced before the answer goes out. Each entry
//! holds the SHA-256 of the previous one (`prev`) and its own (`hash`, over its bytes without
//! the `hash` field), so an entry removed, edited or reordered breaks the chain at that entry.
//! Prompt and answer are kept as SHA-256s; the texts (and the token ids a replay needs) only
//! when the configuration asks for them. The log is bounded: segments of a quarter of its
//! budget, the oldest removed first, which `verify` reports as entries rotated out.
//!
//! ```text
//! worker ──record(req, last event)──► AuditLog ── append + fdatasync ──► audit/00000007.jsonl
//! edgellm audit list|show|verify  ◄── read ─────────────────────────────┘
//! edgellm audit replay N ── the entry's model, settings and prompt ids ──► Engine ──► same hash?
//! ```

mod log;
pub mod read;
pub mod replay;

pub use log::{AuditLog, AuditState};

use crate::engine::SamplingParams;
use crate::kv::KvType;
use crate::service::{ErrorCode, FinishReason, Prompt, Request, ServiceError, Usage};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::path::PathBuf;

/// The audit directory's name inside the state directory.
pub const DIR: &str = "audit";
/// The `prev` of the first entry ever written.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";
/// Longest line read back (an entry with texts holds at most a prompt, a context of ids and an
/// answer: far below this); a longer one is refused as damaged rather than read into memory.
pub const MAX_LINE: usize = 8 << 20;

/// Why the audit trail cannot be written or read.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{0}")]
    Bad(String),
}

impl AuditError {
    pub(crate) fn io(path: &std::path::Path, source: std::io::Error) -> AuditError {
        AuditError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// How the trail is kept.
#[derive(Clone, Debug)]
pub struct AuditConfig {
    /// The directory of the segments (`<state dir>/audit`).
    pub dir: PathBuf,
    /// Most bytes all segments may take; the oldest segment goes first.
    pub max_bytes: u64,
    /// Also keep the request's text, its prompt ids and the answer (what `replay` needs).
    pub texts: bool,
}

/// The model an entry was answered with.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelFacts {
    pub name: String,
    /// The GGUF file's SHA-256 (hex).
    pub sha256: String,
    /// The type holding most of the weights' bytes (`Q4_1`).
    pub quant: String,
}

/// The engine an entry was answered with.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineFacts {
    /// The kernel path (`neon`, `dotprod`, `avx2`, …).
    pub kernels: String,
    pub threads: usize,
    pub ctx: usize,
    pub chunk: usize,
    pub kv_type: KvType,
}

/// What an entry records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// An answer (`finish` says how it ended: a cancelled or timed-out one is an answer too).
    Answer,
    /// A request refused with an error code (nothing was generated).
    Refused,
}

/// One line of the trail. The field order is the line's: `hash` is appended last, over the
/// bytes before it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Entry {
    /// Counts every entry this state directory ever had, from 1.
    pub seq: u64,
    /// The previous entry's `hash` ([`GENESIS`] for the first).
    pub prev: String,
    /// When the request ended: RFC 3339, UTC, milliseconds.
    pub time: String,
    pub kind: Kind,
    /// The request id.
    pub id: String,
    /// Who asked: an MQTT topic (`mqtt:edgellm/dev/request`), a serial port, `cli`.
    pub source: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// The session conversation's turn this answer was kept as (none: not kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn: Option<u64>,
    /// The shape the answer was asked to have (a named format resolved), as
    /// [`Shape::to_json`](crate::engine::constraint::Shape::to_json) writes it: a replay
    /// answers under it again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<serde_json::Value>,
    pub model: ModelFacts,
    pub engine: EngineFacts,
    pub sampling: SamplingParams,
    pub max_tokens: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finish: Option<FinishReason>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ServiceError>,
    pub usage: Usage,
    pub truncated_tokens: usize,
    /// SHA-256 of the request's content: the compact JSON of [`content`]. None for a request
    /// refused before it was read whole (a front end's refusal: [`entry_of_refusal`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_sha256: Option<String>,
    /// SHA-256 of the prompt ids as the model saw them (u32 little-endian each).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_ids_sha256: Option<String>,
    /// SHA-256 of the answer's UTF-8 text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer_sha256: Option<String>,
    /// SHA-256 of the generated ids (u32 little-endian each; the end token included).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer_ids_sha256: Option<String>,
    /// Bytes of a torn last line (a write cut by power loss) cut off before this entry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tail_cut: Option<u64>,
    /// With `texts`: the request's content, its prompt ids, the answer and its ids.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_ids: Option<Vec<u32>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer_ids: Option<Vec<u32>>,
}

/// The request's content, as the trail hashes it: `{"prompt": …}` for a raw prompt,
/// `{"system": …, "messages": [{"role", "content"}, …]}` for a chat (`system` only when set),
/// `{"reset": true}` for a session reset, `{"history": true}` for its history. A client
/// holding its request can compute the same hash: the compact JSON of this value (serde_json's,
/// keys in this order). In a named session a chat's content is the message it sent; the whole
/// conversation the model saw is in the prompt ids (`prompt_ids_sha256`, and with the texts
/// the ids themselves, which `audit replay` runs again).
pub fn content(req: &Request) -> serde_json::Value {
    use serde_json::json;
    match &req.prompt {
        Prompt::Text { text, .. } => json!({ "prompt": text }),
        Prompt::Chat(messages) => {
            let msgs: Vec<_> = messages
                .iter()
                .map(|m| json!({ "role": m.role, "content": m.content }))
                .collect();
            match &req.system {
                Some(s) => json!({ "system": s, "messages": msgs }),
                None => json!({ "messages": msgs }),
            }
        }
        Prompt::Forget => json!({ "reset": true }),
        Prompt::History => json!({ "history": true }),
    }
}

/// SHA-256 of `bytes`, in hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    crate::kv::snapshot::hex(&Sha256::digest(bytes))
}

/// SHA-256 of a file (a model), in hex. Read 64 KiB at a time: as fast as bigger reads, and
/// the daemon's resident size barely moves while it hashes its model in the background.
pub fn file_sha256(path: &std::path::Path) -> std::io::Result<String> {
    use std::io::Read;
    let mut f = std::fs::File::open(path)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(crate::kv::snapshot::hex(&h.finalize()))
}

/// SHA-256 of token ids, each as u32 little-endian.
pub fn ids_sha256(ids: &[u32]) -> String {
    let mut h = Sha256::new();
    for id in ids {
        h.update(id.to_le_bytes());
    }
    crate::kv::snapshot::hex(&h.finalize())
}

/// The line of `entry`: its JSON with `"hash"` appended, the SHA-256 of the JSON before it.
/// Returns the line (with its newline) and the hash.
pub fn seal(entry: &Entry) -> (Vec<u8>, String) {
    // Serializing a struct of strings, numbers and JSON values cannot fail.
    let mut body = serde_json::to_vec(entry).unwrap_or_default();
    let hash = sha256_hex(&body);
    body.pop(); // the closing brace
    body.extend_from_slice(b",\"hash\":\"");
    body.extend_from_slice(hash.as_bytes());
    body.extend_from_slice(b"\"}\n");
    (body, hash)
}

/// A line's entry and its stated hash, or why it is not one. Checks that the hash is the one of
/// the line's bytes.
pub fn unseal(line: &[u8]) -> Result<(Entry, String), String> {
    const KEY: &[u8] = b",\"hash\":\"";
    let tail = KEY.len() + 64 + 2; // `,"hash":"<64 hex>"}`
    if line.len() < tail + 1 || !line.ends_with(b"\"}") {
        return Err("not a sealed entry (no hash at its end)".into());
    }
    let at = line.len() - tail;
    if &line[at..at + KEY.len()] != KEY {
        return Err("not a sealed entry (no hash at its end)".into());
    }
    let stated = std::str::from_utf8(&line[at + KEY.len()..line.len() - 2])
        .map_err(|_| "its hash is not hex")?
        .to_owned();
    let mut body = line[..at].to_vec();
    body.push(b'}');
    let entry: Entry = serde_json::from_slice(&body)
        .map_err(|e| format!("not an entry this version reads: {e}"))?;
    let actual = sha256_hex(&body);
    if actual != stated {
        return Err(format!(
            "its hash {stated} is not the one of its contents ({actual}): the entry was edited"
        ));
    }
    Ok((entry, stated))
}

/// Builds the entry of an ended request (without `seq`, `prev` and `time`, which the log
/// sets). `end` is the request's last event.
pub fn entry_of(
    req: &Request,
    end: &crate::service::Event,
    model: &ModelFacts,
    engine: EngineFacts,
    texts: bool,
) -> Entry {
    use crate::service::Event;
    let request = content(req);
    let prompt_sha256 = sha256_hex(request.to_string().as_bytes());
    let mut e = Entry {
        seq: 0,
        prev: String::new(),
        time: String::new(),
        kind: Kind::Refused,
        id: req.id.clone(),
        source: req.source.clone(),
        session: req.session.as_ref().map(|s| s.as_str().to_owned()),
        turn: None,
        format: None,
        model: model.clone(),
        engine,
        sampling: req.sampling.clone(),
        max_tokens: req.max_tokens,
        finish: None,
        error: None,
        usage: Usage::default(),
        truncated_tokens: 0,
        prompt_sha256: Some(prompt_sha256),
        prompt_ids_sha256: None,
        answer_sha256: None,
        answer_ids_sha256: None,
        tail_cut: None,
        request: texts.then_some(request),
        prompt_ids: None,
        answer: None,
        answer_ids: None,
    };
    match end {
        Event::Done(d) => {
            e.kind = Kind::Answer;
            e.turn = d.session.as_ref().and_then(|s| s.turn);
            e.format = d.shape.as_ref().map(|s| s.to_json());
            e.finish = Some(d.finish_reason);
            e.usage = d.usage.clone();
            e.truncated_tokens = d.truncated_tokens;
            e.prompt_ids_sha256 = Some(ids_sha256(&d.prompt_ids));
            e.answer_sha256 = Some(sha256_hex(d.text.as_bytes()));
            e.answer_ids_sha256 = Some(ids_sha256(&d.generated_ids));
            if texts {
                e.prompt_ids = Some(d.prompt_ids.clone());
                e.answer = Some(d.text.clone());
                e.answer_ids = Some(d.generated_ids.clone());
            }
        }
        Event::Error(err) => e.error = Some(err.clone()),
        Event::Text(_) => {
            e.error = Some(ServiceError::new(
                ErrorCode::Internal,
                "the request ended without a last event",
            ))
        }
    }
    e
}

/// The entry of a request refused before the queue: its id, source, the session it named and
/// the error; no content (it may not have been read whole), default settings, nothing
/// generated.
pub fn entry_of_refusal(
    r: &crate::service::Refusal,
    model: &ModelFacts,
    engine: EngineFacts,
) -> Entry {
    Entry {
        seq: 0,
        prev: String::new(),
        time: String::new(),
        kind: Kind::Refused,
        id: r.id.clone(),
        source: r.source.clone(),
        session: r.session.clone(),
        turn: None,
        format: None,
        model: model.clone(),
        engine,
        sampling: SamplingParams::default(),
        max_tokens: 0,
        finish: None,
        error: Some(r.error.clone()),
        usage: Usage::default(),
        truncated_tokens: 0,
        prompt_sha256: None,
        prompt_ids_sha256: None,
        answer_sha256: None,
        answer_ids_sha256: None,
        tail_cut: None,
        request: None,
        prompt_ids: None,
        answer: None,
        answer_ids: None,
    }
}

/// `t` as RFC 3339 in UTC with milliseconds (`2026-12-01T23:59:07.042Z`).
pub fn rfc3339(t: std::time::SystemTime) -> String {
    let d = t.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, day) = crate::tokenizer::civil_from_days(days as i64);
    format!(
        "{y:04}-{m:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60,
        d.subsec_millis()
    )
}

#[cfg(test)]
mod tests;
