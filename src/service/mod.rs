//! The service layer every front end shares: a [`Request`] in, a stream of [`Event`]s out.
//!
//! Front ends (the CLI's `run`, MQTT, serial, Modbus) only translate their bytes, topics or
//! registers into `Request`s and `Event`s back; everything between — the chat template, the
//! rule that user text never becomes control tokens, truncation, the system-prompt cache,
//! sessions, the bounded queue, cancellation and deadlines — lives here, once.
//!
//! ```text
//! front end ──submit(Request)──► Queue (bounded, fair between sources)
//!     ▲  │ Ticket                   │ one worker thread per model
//!     │  │ (id, cancel())           ▼
//!     │  │        prompt::build → SessionStore / SessionFile → Engine::generate
//!     │  ▼                                                          │
//!     └─ Ticket's bounded channel ◄── Event::Text … Event::Done | Event::Error
//! ```
//!
//! Every front end consumes [`Ticket`]s: one backpressure policy (the worker waits for a full
//! ticket's reader, up to the request's deadline) and one cancel path (`Ticket::cancel`, or
//! dropping the ticket), both in `ticket.rs`.
//!
//! Errors carry a small, stable [`ErrorCode`] and a message for a person that names no
//! command-line flag: a PLC operator reads it on a panel, not in a shell.

mod answer;
mod batch;
pub mod conversation;
mod pace;
pub mod prompt;
pub mod queue;
pub mod refusal;
pub mod ticket;
pub mod worker;

pub use conversation::{ContextFull, ConversationBounds};
pub use refusal::Refusal;
pub use ticket::{Canceller, Ticket};
pub use worker::{Handle, Service, ServiceConfig, Sessions};

use crate::engine::EngineConfig;
pub use crate::engine::FinishReason;
use crate::engine::constraint::ConstraintError;
pub use crate::engine::constraint::{ConstraintStats, Limits as FormatLimits, Shape};
use crate::engine::store::StoreError;
use crate::engine::store::{LoadReport, PrefixReport, SessionId, Source, StoreStatus, TurnReport};
use crate::engine::{EngineError, SamplingParams};
use crate::kv::SaveKind;
use crate::tokenizer::{ChatMessage, TokenizerError};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

/// Longest request id.
pub const MAX_ID_LEN: usize = 128;

/// The checks every request passes when it is submitted, whatever its front end: an id the
/// service can carry and a prompt with something to answer. [`Handle::submit`] refuses a
/// request that fails one at once; a front end does not repeat them.
pub fn check(req: &Request) -> Result<(), ServiceError> {
    check_id(&req.id, &[])?;
    prompt::check(req)
}

/// Checks a request id: 1 to [`MAX_ID_LEN`] bytes of printable ASCII (no space), none of
/// `reserved` (what a front end cannot carry in an id: MQTT's `/ + #`, as the id becomes a
/// topic level). A refusal names the first character not allowed and its position (from 1,
/// in characters), so the sender sees what to change.
pub fn check_id(id: &str, reserved: &[char]) -> Result<(), ServiceError> {
    let rule = || {
        let mut r = format!("1 to {MAX_ID_LEN} bytes of printable ASCII without spaces");
        for (i, c) in reserved.iter().enumerate() {
            r.push_str(if i == 0 { " or " } else { " " });
            r.push(*c);
        }
        r
    };
    let refuse = |why: String| Err(ServiceError::new(ErrorCode::BadRequest, why));
    if id.is_empty() {
        return refuse(format!("the request id is empty; it must have {}", rule()));
    }
    if id.len() > MAX_ID_LEN {
        return refuse(format!(
            "the request id has {} bytes; it must have {}",
            id.len(),
            rule()
        ));
    }
    if let Some((i, c)) = id
        .chars()
        .enumerate()
        .find(|(_, c)| !c.is_ascii_graphic() || reserved.contains(c))
    {
        return refuse(format!(
            "the request id {id:?} has {c:?} at position {}, which is not allowed: an id has {}",
            i + 1,
            rule()
        ));
    }
    Ok(())
}

/// What to answer.
#[derive(Clone, Debug)]
pub struct Request {
    /// The caller's id for the request, echoed in logs and by the front end (1 to
    /// [`MAX_ID_LEN`] bytes).
    pub id: String,
    /// Who sent it (an MQTT client, a serial port, `cli`): the queue is fair between sources.
    pub source: String,
    pub prompt: Prompt,
    /// The system prompt of a chat (replaces the template's default one).
    pub system: Option<String>,
    /// A named session of the state directory: its conversation goes on with this request's
    /// message (`service::conversation`), its cached positions are reused and the turn is saved
    /// to it.
    pub session: Option<SessionId>,
    /// With a session: the request's messages replace its conversation (MQTT `messages`)
    /// rather than continue it (one message, from any front end).
    pub replace: bool,
    pub sampling: SamplingParams,
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Also report the `top_logits` best `(id, logit)` after the prompt.
    pub top_logits: usize,
    /// Drop tokens from the front of a prompt that does not fit the context instead of
    /// refusing it.
    pub truncate: bool,
    /// Answer `timeout` once this passes (in the queue: an error; mid-answer: what was
    /// generated so far, with finish reason `timeout`).
    pub deadline: Option<Instant>,
    /// The shape the answer must have; `Done::valid` then says whether it has it.
    pub format: Option<Format>,
}

/// The shape an answer must have.
#[derive(Clone, Debug, PartialEq)]
pub enum Format {
    /// Given with the request.
    Shape(Arc<Shape>),
    /// One of the configuration's named formats (a schema file, a choice list), so that a
    /// small device sends a name rather than a schema.
    Named(String),
}

/// Longest name of a configured format.
pub const MAX_FORMAT_NAME: usize = 64;

/// A name a configured format may have, so one that a request may give: 1 to
/// [`MAX_FORMAT_NAME`] bytes of `A-Z a-z 0-9 _ -`.
pub fn valid_format_name(name: &str) -> bool {
    (1..=MAX_FORMAT_NAME).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// The text to continue.
#[derive(Clone, Debug)]
pub enum Prompt {
    /// Raw text, continued as is. `special` lets control tokens written in it be control
    /// tokens: only for a trusted local user who renders a template by hand.
    Text { text: String, special: bool },
    /// A conversation, rendered with the model's chat template; the messages' contents are
    /// user text and never become control tokens.
    Chat(Vec<ChatMessage>),
    /// No text: forgets the request's named session (its cached positions and its file) and
    /// answers an empty `Done`. Queued like any request, so it never races a turn of the
    /// session it deletes.
    Forget,
    /// No text: answers the request's named session's conversation as text (`Done::text`), one
    /// message a paragraph (`system:`, `user:`, `assistant:`), with nothing generated.
    History,
}

impl Request {
    /// A request with the default settings: greedy, 128 tokens, no session.
    pub fn new(id: impl Into<String>, source: impl Into<String>, prompt: Prompt) -> Request {
        Request {
            id: id.into(),
            source: source.into(),
            prompt,
            system: None,
            session: None,
            replace: false,
            sampling: SamplingParams::default(),
            max_tokens: 128,
            top_logits: 0,
            truncate: false,
            deadline: None,
            format: None,
        }
    }
}

/// Told of every request the worker ends, on the worker's thread and before the request's last
/// event goes to its front end: an audit trail writes its entry here, so an answer anyone has
/// seen is on record first. It must not fail the answer (a full disk only costs the record).
pub trait Recorder: Send {
    /// `end` is the request's last event (`Done` or `Error`); `engine` and `kernels` are those
    /// that answered it.
    fn record(&mut self, req: &Request, end: &Event, engine: &EngineConfig, kernels: &'static str);
    /// A request refused before the queue ([`Handle::refused`]), told after its refusal went
    /// out.
    fn refused(&mut self, r: &Refusal, engine: &EngineConfig, kernels: &'static str);
}

/// Whether a kind of write the appliance keeps doing (session saves, the answer journal, the
/// audit trail) works: failures since start and, until the next success, why the last failed.
/// Shared between the thread that writes and the status that shows it.
#[derive(Default)]
pub struct Health {
    failures: std::sync::atomic::AtomicU64,
    error: std::sync::Mutex<Option<String>>,
    /// Called when a fault starts or ends (the status is republished).
    observer: std::sync::OnceLock<worker::Observer>,
}

impl std::fmt::Debug for Health {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Health")
            .field("failures", &self.failures())
            .field("error", &self.error())
            .finish()
    }
}

impl Health {
    /// Calls `f` whenever a fault starts, changes or ends (on the writing thread: `f` must be
    /// quick, e.g. wake a task). Only the first observer set is kept.
    pub fn observe(&self, f: worker::Observer) {
        let _ = self.observer.set(f);
    }

    /// A write worked: the fault, if any, is over. Returns whether it was one.
    pub fn ok(&self) -> bool {
        let was = self.lock().take().is_some();
        if was {
            self.changed();
        }
        was
    }

    /// A write failed with `why`. Returns whether this is a new fault (not the same as the
    /// last one), so the caller logs a fault once, not at every write.
    pub fn failed(&self, why: String) -> bool {
        use std::sync::atomic::Ordering;
        self.failures.fetch_add(1, Ordering::Relaxed);
        let new = {
            let mut e = self.lock();
            let new = e.as_deref() != Some(why.as_str());
            *e = Some(why);
            new
        };
        if new {
            self.changed();
        }
        new
    }

    fn changed(&self) {
        if let Some(f) = self.observer.get() {
            f();
        }
    }

    pub fn failures(&self) -> u64 {
        self.failures.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Why the last write failed, while no write has worked since.
    pub fn error(&self) -> Option<String> {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<String>> {
        self.error.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Most bytes of text in one [`Event::Text`]; a longer piece comes as several events.
pub const CHUNK_BYTES: usize = 64;

/// A piece of the answer's text: inline, so streaming a token allocates nothing.
pub type Chunk = heapless::String<CHUNK_BYTES>;

/// What the worker sends back for a request, in order: any number of `Text`, then exactly one
/// `Done` or `Error`.
#[derive(Debug)]
pub enum Event {
    /// The next piece of the answer (whole UTF-8 characters).
    Text(Chunk),
    Done(Box<Done>),
    Error(ServiceError),
}

/// Token counts of one answer: one definition for every front end (MQTT's `usage`, the line
/// protocol's and the frames' `END`, the console's summary, `run --json`, the audit trail).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Usage {
    /// The whole prompt as the model saw it, computed for this answer or restored.
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Of `prompt_tokens`, those taken from a session's cache (RAM or flash) instead of being
    /// computed: `prompt_tokens - restored_tokens` were computed.
    pub restored_tokens: usize,
    /// Oldest turns of a session's conversation dropped so that it fits the context.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub dropped_turns: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// Where the time went, in milliseconds.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Timings {
    /// From submission to the worker taking the request.
    pub queue_ms: f64,
    pub prompt_ms: f64,
    /// From the worker taking the request to the first generated token.
    pub ttft_ms: f64,
    pub decode_ms: f64,
    /// Generated tokens per second after the first.
    pub decode_tps: f64,
}

/// The end of a successful answer.
#[derive(Clone, Debug)]
pub struct Done {
    pub id: String,
    /// The whole answer (the `Text` events, joined).
    pub text: String,
    pub finish_reason: FinishReason,
    pub usage: Usage,
    pub timings: Timings,
    /// The prompt as the model saw it.
    pub prompt_ids: Vec<u32>,
    /// Generated ids, the end-of-generation token included when the answer ended on one.
    pub generated_ids: Vec<u32>,
    pub top_logits: Vec<(u32, f32)>,
    /// Prompt tokens dropped from the front to fit the context.
    pub truncated_tokens: usize,
    pub session: Option<SessionReport>,
    /// With a [`Format`]: whether the answer has its shape (it ended where the shape may end;
    /// an answer cut by `max_tokens`, the context, a cancel or a deadline never has).
    pub valid: Option<bool>,
    /// A valid answer in a JSON format, parsed.
    pub json: Option<serde_json::Value>,
    /// With a [`Format`]: what the constraint cost.
    pub constraint: Option<ConstraintStats>,
    /// With a [`Format`]: the shape it stood for (a named one resolved), for the audit trail.
    pub shape: Option<Arc<Shape>>,
}

/// What a turn did to its session on flash.
#[derive(Clone, Debug, Serialize)]
pub struct SessionReport {
    /// The session's name (none for a lone session file).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    pub file: PathBuf,
    pub source: Source,
    /// Positions taken from a cached prefix (a system prompt, another session).
    pub prefix_tokens: usize,
    pub load: LoadReport,
    pub saved: bool,
    /// What the save wrote (`unchanged`, `appended`, `rewritten`, and how much).
    #[serde(flatten)]
    pub write: Option<SaveKind>,
    /// Why the save failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Tokens the file holds after the save.
    pub tokens: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<StoreStatus>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub system_prompt: Option<PrefixReport>,
    /// The conversation's turn number this answer was kept as (none: not kept, see
    /// `service::conversation`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub turn: Option<u64>,
}

impl SessionReport {
    fn of(id: Option<&SessionId>, turn: TurnReport) -> SessionReport {
        let (write, error) = match turn.save {
            Ok(kind) => (Some(kind), None),
            Err(e) => (None, Some(e.to_string())),
        };
        SessionReport {
            id: id.map(|i| i.as_str().to_owned()),
            file: turn.file,
            source: turn.source,
            prefix_tokens: turn.prefix_tokens,
            load: turn.load,
            saved: write.is_some(),
            write,
            error,
            tokens: turn.file_tokens,
            status: None,
            system_prompt: None,
            turn: None,
        }
    }
}

/// The stable error codes a front end shows or maps to its own (MQTT `error.code`, a serial
/// `ERR <code>`, a Modbus exception).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// The request is malformed or asks for something this model cannot do.
    BadRequest,
    /// A size bound was exceeded (prompt, tokens, ids).
    TooLarge,
    /// The prompt does not fit the context.
    ContextFull,
    /// The queue is full: try again later.
    Busy,
    /// The deadline passed before the answer started.
    Timeout,
    /// Cancelled before the answer started, or the service stopped.
    Cancelled,
    /// A fault of the appliance, not of the request.
    Internal,
}

impl ErrorCode {
    /// The code as a number, for binary front ends (a frame's error byte, a Modbus register):
    /// 1 bad_request, 2 too_large, 3 context_full, 4 busy, 5 timeout, 6 cancelled, 7 internal.
    /// Stable: documented in docs/serial.md.
    pub fn number(self) -> u8 {
        match self {
            ErrorCode::BadRequest => 1,
            ErrorCode::TooLarge => 2,
            ErrorCode::ContextFull => 3,
            ErrorCode::Busy => 4,
            ErrorCode::Timeout => 5,
            ErrorCode::Cancelled => 6,
            ErrorCode::Internal => 7,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::BadRequest => "bad_request",
            ErrorCode::TooLarge => "too_large",
            ErrorCode::ContextFull => "context_full",
            ErrorCode::Busy => "busy",
            ErrorCode::Timeout => "timeout",
            ErrorCode::Cancelled => "cancelled",
            ErrorCode::Internal => "internal",
        }
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A request that could not be answered: a code for machines, a message for people.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(deny_unknown_fields)]
#[error("{message}")]
pub struct ServiceError {
    pub code: ErrorCode,
    pub message: String,
}

impl ServiceError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> ServiceError {
        ServiceError {
            code,
            message: message.into(),
        }
    }
}

impl From<EngineError> for ServiceError {
    fn from(e: EngineError) -> Self {
        let code = match e {
            EngineError::ContextFull { .. } => ErrorCode::ContextFull,
            EngineError::BadToken { .. } | EngineError::EmptyPrompt => ErrorCode::BadRequest,
            EngineError::Constraint(ConstraintError::TooLarge(_)) => ErrorCode::TooLarge,
            EngineError::Constraint(_) => ErrorCode::BadRequest,
            EngineError::Config(_) | EngineError::Kernels(_) | EngineError::Threads(_) => {
                ErrorCode::Internal
            }
        };
        ServiceError::new(code, e.to_string())
    }
}

impl From<ConstraintError> for ServiceError {
    fn from(e: ConstraintError) -> Self {
        EngineError::Constraint(e).into()
    }
}

impl From<StoreError> for ServiceError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Engine(e) => e.into(),
            StoreError::BadId(e) => ServiceError::new(ErrorCode::BadRequest, e.to_string()),
            e => ServiceError::new(ErrorCode::Internal, e.to_string()),
        }
    }
}

impl From<TokenizerError> for ServiceError {
    fn from(e: TokenizerError) -> Self {
        // A template that rejects a conversation (roles out of order, raise_exception) or a
        // model without one: the request asks for what this model cannot format.
        ServiceError::new(ErrorCode::BadRequest, e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_request_id_names_the_character_and_its_position() {
        assert!(
            check_id("serial-1f/3", &[]).is_ok(),
            "/ is MQTT's rule only"
        );
        assert!(check_id(&"x".repeat(MAX_ID_LEN), &[]).is_ok());
        let e = check_id("a/b", &['/', '+', '#']).unwrap_err();
        assert_eq!(e.code, ErrorCode::BadRequest);
        assert_eq!(
            e.message,
            "the request id \"a/b\" has '/' at position 2, which is not allowed: an id has 1 to \
             128 bytes of printable ASCII without spaces or / + #"
        );
        let e = check_id("ok\tno", &[]).unwrap_err();
        assert!(e.message.contains("'\\t' at position 3"), "{e}");
        let e = check_id(&"x".repeat(MAX_ID_LEN + 1), &[]).unwrap_err();
        assert!(e.message.contains("has 129 bytes"), "{e}");
        assert!(check_id("", &[]).unwrap_err().message.contains("empty"));
    }
}
