//! The worker thread's side of the service: take the next request, answer it in the right
//! session, stream its text, end with `Done` or `Error`.

use super::conversation::Turn;
use super::prompt::{self, Built};
use super::ticket::{Channel, Stop};
use super::worker::{Job, Shared};
use super::{
    Chunk, Done, ErrorCode, Event, FinishReason, Recorder, Request, ServiceError, SessionReport,
    Timings, Usage,
};
use crate::engine::constraint::Grammars;
use crate::engine::store::{SessionFile, SessionStore, Source};
use crate::engine::{Engine, GenOutput, GenParams, Sampler, Session};
use crate::tokenizer::{ChatTemplate, StreamDecoder};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

/// The sessions a worker answers in: [`Sessions`](super::Sessions) once opened.
pub(super) enum OpenSessions {
    /// No sessions: every request in one scratch session.
    Scratch(Session),
    File(SessionFile),
    /// A state directory, and a scratch session for requests that name none.
    Dir(SessionStore, Session),
}

pub(super) struct Worker {
    pub(super) engine: Engine,
    pub(super) template: Option<ChatTemplate>,
    pub(super) sessions: OpenSessions,
    pub(super) context_full: super::ContextFull,
    pub(super) conversations: super::ConversationBounds,
    pub(super) formats: Arc<BTreeMap<String, super::Shape>>,
    pub(super) format_limits: super::FormatLimits,
    /// The model's grammar tables: built with the first format asked for, then kept.
    pub(super) grammars: Option<Grammars>,
    #[cfg(feature = "test-hooks")]
    pub(super) test_stall: Option<std::time::Duration>,
    pub(super) recorder: Option<Box<dyn Recorder>>,
    pub(super) shared: Arc<Shared>,
}

impl Worker {
    pub(super) fn run(&mut self) {
        while let Some(job) = self.next() {
            let Job {
                req,
                channel,
                submitted,
            } = job;
            let ev = self.answer(&req, &channel, submitted);
            let c = &self.shared.counters;
            match &ev {
                Event::Done(d) if matches!(d.finish_reason, FinishReason::Cancelled) => {
                    c.cancelled.fetch_add(1, Ordering::Relaxed)
                }
                Event::Done(_) => c.answered.fetch_add(1, Ordering::Relaxed),
                Event::Error(e) if e.code == ErrorCode::Cancelled => {
                    c.cancelled.fetch_add(1, Ordering::Relaxed)
                }
                _ => c.failed.fetch_add(1, Ordering::Relaxed),
            };
            if let Event::Error(e) = &ev {
                tracing::info!(request = req.id, code = %e.code, "request refused: {e}");
            }
            if let Event::Done(d) = &ev
                && let Some(r) = &d.session
            {
                // The answer is given all the same; the session starts over from its next
                // request if the save never succeeds.
                if let Some(e) = &r.error {
                    if c.saves.failed(e.clone()) {
                        tracing::error!(request = req.id, "session not saved: {e}");
                    }
                } else if r.saved && c.saves.ok() {
                    tracing::info!("session saves work again");
                }
            }
            if let Event::Done(d) = &ev {
                c.last_tps
                    .store(d.timings.decode_tps.to_bits(), Ordering::Relaxed);
                // One line per answer: what a field log needs to tell a slow engine from a
                // slow link (bench/serial.py reads it).
                let t = &d.timings;
                tracing::info!(
                    request = req.id,
                    source = req.source,
                    finish = ?d.finish_reason,
                    prompt_tokens = d.usage.prompt_tokens,
                    restored_tokens = d.usage.restored_tokens,
                    completion_tokens = d.usage.completion_tokens,
                    queue_ms = format!("{:.2}", t.queue_ms),
                    ttft_ms = format!("{:.2}", t.ttft_ms),
                    decode_tps = format!("{:.1}", t.decode_tps),
                    "answered"
                );
            }
            if let Some(r) = &mut self.recorder {
                r.record(
                    &req,
                    &ev,
                    self.engine.config(),
                    self.engine.kernels().name(),
                );
            }
            channel.end(ev);
            self.shared.busy.store(false, Ordering::Relaxed);
            self.shared.lock().running = None;
            self.shared.wake.notify_all();
            self.shared.changed();
        }
        tracing::debug!("worker stopped");
    }

    /// Waits (asleep) for the next job; `None` once the service is closed.
    fn next(&self) -> Option<Job> {
        let mut st = self.shared.lock();
        loop {
            if st.closed {
                return None;
            }
            if let Some(job) = st.queue.pop() {
                st.running = Some((job.req.id.clone(), Arc::clone(&job.channel)));
                self.shared.progress();
                self.shared.busy.store(true, Ordering::Relaxed);
                drop(st);
                self.shared.changed();
                return Some(job);
            }
            st = self.shared.wake.wait(st).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Answers one request; returns its last event (`Done` or `Error`), the `Text` events
    /// having gone to its ticket's `channel` already.
    fn answer(&mut self, req: &Request, channel: &Channel, submitted: Instant) -> Event {
        let started = Instant::now();
        let queue_ms = ms(submitted, started);
        if channel.is_cancelled() {
            return error(ErrorCode::Cancelled, "cancelled before its answer started");
        }
        if req.deadline.is_some_and(|d| started >= d) {
            return error(
                ErrorCode::Timeout,
                format!("its deadline passed after {queue_ms:.0} ms in the queue"),
            );
        }
        #[cfg(feature = "test-hooks")]
        if let Some(pause) = self.test_stall {
            std::thread::sleep(pause);
        }
        match self.generate(req, channel, started) {
            Ok(mut done) => {
                done.timings.queue_ms = queue_ms;
                Event::Done(Box::new(done))
            }
            Err(e) => Event::Error(e),
        }
    }

    fn generate(
        &mut self,
        req: &Request,
        channel: &Channel,
        started: Instant,
    ) -> Result<Done, ServiceError> {
        match req.prompt {
            super::Prompt::Forget => return self.forget(req),
            super::Prompt::History => {
                // As text too, so that every front end shows it as it shows an answer.
                let done = self.history(req)?;
                let shared = &self.shared;
                let _ = send_text(channel, &done.text, req.deadline, &|| shared.progress());
                return Ok(done);
            }
            _ => {}
        }
        if let Err(e) = req.sampling.validate() {
            return Err(ServiceError::new(ErrorCode::BadRequest, e.to_string()));
        }
        let model = Arc::clone(self.engine.model());
        let tok = &model.tokenizer;
        let n_ctx = self.engine.config().n_ctx;
        let max_bytes = self.shared.max_prompt_bytes.load(Ordering::Relaxed);
        // A chat in a named session goes on from the session's conversation.
        let (built, turn) = match (&self.sessions, &req.session, &req.prompt) {
            (OpenSessions::Dir(store, _), Some(id), super::Prompt::Chat(_)) => {
                let (turn, built) = Turn::begin(
                    &store.conversation_path(id),
                    id,
                    req,
                    tok,
                    self.template.as_ref(),
                    n_ctx,
                    max_bytes,
                    self.context_full,
                )?;
                (built, Some(turn))
            }
            _ => {
                let built = prompt::build(tok, self.template.as_ref(), req, n_ctx, max_bytes)?;
                (built, None)
            }
        };
        let params = GenParams {
            max_tokens: req.max_tokens,
            top_logits: req.top_logits,
        };
        let mut sampler = Sampler::new(req.sampling.clone(), model.hp.n_vocab);
        let shape = match &req.format {
            None => None,
            Some(f) => {
                let shape = self.shape(f)?;
                let grammars = match &mut self.grammars {
                    Some(g) => g,
                    slot => slot.insert(
                        Grammars::new(&model, self.format_limits)
                            .map_err(|e| ServiceError::new(ErrorCode::Internal, e))?,
                    ),
                };
                sampler.constrain(grammars.compile(&shape, req.max_tokens)?);
                Some(shape)
            }
        };
        let engine = &mut self.engine;
        let is_eog = |t: u32| tok.is_eog(t);

        let mut text = String::with_capacity(req.max_tokens.min(n_ctx).saturating_mul(8));
        let mut stream = StreamDecoder::new();
        // Why the answer was stopped before the engine ended it, if it was.
        let mut stop = None;
        let shared = &self.shared;
        let alive = || shared.progress();
        let mut on_token = |t: u32| {
            shared.progress();
            if tok.is_eog(t) {
                return true;
            }
            let start = text.len();
            stream.push_into(tok.token_to_piece(t), &mut text);
            let why = match send_text(channel, &text[start..], req.deadline, &alive) {
                Err(why) => why,
                Ok(()) if channel.is_cancelled() => Stop::Cancelled,
                Ok(()) if req.deadline.is_some_and(|d| Instant::now() >= d) => Stop::Deadline,
                Ok(()) => return true,
            };
            stop = Some(why);
            false
        };
        let gen_start = Instant::now();
        let (out, report) = match (&mut self.sessions, &req.session) {
            (OpenSessions::Scratch(scratch) | OpenSessions::Dir(_, scratch), None) => {
                let out = engine.generate(
                    scratch,
                    &built.ids,
                    &params,
                    &mut sampler,
                    &is_eog,
                    &mut on_token,
                )?;
                (out, None)
            }
            (OpenSessions::Scratch(_) | OpenSessions::File(_), Some(_)) => {
                return Err(no_sessions());
            }
            (OpenSessions::File(f), None) => {
                let (out, turn) = f.generate(
                    engine,
                    &built.ids,
                    &params,
                    &mut sampler,
                    &is_eog,
                    &mut on_token,
                )?;
                (out, Some(SessionReport::of(None, turn)))
            }
            (OpenSessions::Dir(store, _), Some(id)) => {
                let system = cache_system_prompt(store, engine, &built);
                let (out, turn) = store.generate(
                    engine,
                    id,
                    &built.ids,
                    &params,
                    &mut sampler,
                    &is_eog,
                    &mut on_token,
                )?;
                let mut r = SessionReport::of(Some(id), turn);
                r.status = Some(store.status());
                r.system_prompt = system;
                (out, Some(r))
            }
        };
        let tail = stream.finish();
        text.push_str(&tail);
        if stop.is_none() {
            // Only what an invalid sequence at the very end left: `Done` carries it anyway.
            let _ = send_text(channel, &tail, req.deadline, &alive);
        }
        // The loop says `cancelled` whenever the callback stopped it; the callback knows why.
        let finish = match stop {
            None => out.finish,
            Some(Stop::Deadline) => FinishReason::Timeout,
            Some(Stop::Unread) => {
                tracing::warn!(
                    request = req.id,
                    "nobody read the answer for {} s: cancelled",
                    super::ticket::MAX_WAIT.as_secs()
                );
                FinishReason::Cancelled
            }
            Some(Stop::Cancelled) => FinishReason::Cancelled,
        };
        let recomputed = report.as_ref().map_or(0, |r| match r.source {
            Source::File { recomputed, .. } | Source::Refused { recomputed, .. } => recomputed,
            _ => 0,
        });
        let before_gen = ms(started, gen_start);
        let dropped_turns = turn.as_ref().map_or(0, Turn::dropped_turns);
        let mut report = report;
        if let (Some(turn), Some(id), Some(r)) = (turn, &req.session, report.as_mut()) {
            // Logged (and synced) before the answer goes out: an acknowledged turn is kept.
            r.turn = turn.finish(id, &text, finish, self.conversations);
        }
        let mut done = done(
            req, built, text, finish, out, recomputed, before_gen, report,
        );
        done.usage.dropped_turns = dropped_turns;
        done.shape = shape.clone();
        if let Some(shape) = shape
            && done.valid == Some(true)
            && shape.is_json()
        {
            match serde_json::from_str(&done.text) {
                Ok(v) => done.json = Some(v),
                // The grammar admits only JSON; this would be a fault of it, told as such.
                Err(e) => {
                    tracing::error!(request = req.id, "a valid answer is not JSON: {e}");
                    done.valid = Some(false);
                }
            }
        }
        Ok(done)
    }
}

impl Worker {
    /// The shape a request's format stands for.
    fn shape(&self, f: &super::Format) -> Result<Arc<super::Shape>, ServiceError> {
        match f {
            super::Format::Shape(s) => Ok(Arc::clone(s)),
            super::Format::Named(name) => match self.formats.get(name) {
                Some(s) => Ok(Arc::new(s.clone())),
                None => {
                    let known: Vec<&str> = self.formats.keys().map(String::as_str).collect();
                    Err(ServiceError::new(
                        ErrorCode::BadRequest,
                        if known.is_empty() {
                            format!("no format is named {name:?}: none is configured")
                        } else {
                            format!(
                                "no format is named {name:?}; the configured ones are {}",
                                known.join(", ")
                            )
                        },
                    ))
                }
            },
        }
    }

    /// [`Prompt::Forget`](super::Prompt::Forget): deletes the named session.
    fn forget(&mut self, req: &Request) -> Result<Done, ServiceError> {
        let (OpenSessions::Dir(store, _), Some(id)) = (&mut self.sessions, &req.session) else {
            return Err(match req.session {
                None => ServiceError::new(ErrorCode::BadRequest, "a reset names no session"),
                Some(_) => no_sessions(),
            });
        };
        store.delete(id)?;
        tracing::info!(request = req.id, session = %id, "session forgotten");
        Ok(empty_done(req, String::new()))
    }

    /// [`Prompt::History`](super::Prompt::History): the named session's conversation as text.
    fn history(&mut self, req: &Request) -> Result<Done, ServiceError> {
        let (OpenSessions::Dir(store, _), Some(id)) = (&self.sessions, &req.session) else {
            return Err(match req.session {
                None => ServiceError::new(ErrorCode::BadRequest, "a history names no session"),
                Some(_) => no_sessions(),
            });
        };
        let text = super::conversation::transcript(&store.conversation_path(id))
            .map_err(|e| ServiceError::new(ErrorCode::Internal, e.to_string()))?;
        Ok(empty_done(req, text))
    }
}

/// A `Done` with `text` and nothing generated (a reset, a history).
fn empty_done(req: &Request, text: String) -> Done {
    Done {
        id: req.id.clone(),
        text,
        finish_reason: FinishReason::Eog,
        usage: Usage::default(),
        timings: Timings::default(),
        prompt_ids: Vec::new(),
        generated_ids: Vec::new(),
        top_logits: Vec::new(),
        truncated_tokens: 0,
        session: None,
        valid: None,
        json: None,
        constraint: None,
        shape: None,
    }
}

/// Caches the system prompt's prefix for `built`'s conversation (a failure only costs speed).
fn cache_system_prompt(
    store: &mut SessionStore,
    engine: &mut Engine,
    built: &Built,
) -> Option<crate::engine::store::PrefixReport> {
    let prefix = built.system_prefix.as_ref()?;
    let n = prefix
        .iter()
        .zip(&built.ids)
        .take_while(|(a, b)| a == b)
        .count();
    // Worth caching when the prompt begins with it and goes on past it.
    if n < 2 || n >= built.ids.len() {
        return None;
    }
    match store.add_system_prompt(engine, &built.ids[..n]) {
        Ok(r) => Some(r),
        Err(e) => {
            tracing::warn!("system prompt not cached: {e}");
            None
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn done(
    req: &Request,
    built: Built,
    text: String,
    finish_reason: FinishReason,
    out: GenOutput,
    recomputed: usize,
    before_gen_ms: f64,
    session: Option<SessionReport>,
) -> Done {
    let t = &out.timings;
    // Positions recomputed from a damaged file's tokens were computed for this answer, not
    // restored.
    let recomputed = recomputed.min(t.restored_tokens);
    Done {
        id: req.id.clone(),
        text,
        finish_reason,
        usage: Usage {
            prompt_tokens: t.prompt_tokens + t.restored_tokens,
            completion_tokens: out.generated.len(),
            restored_tokens: t.restored_tokens - recomputed,
            dropped_turns: 0,
        },
        timings: Timings {
            queue_ms: 0.0,
            prompt_ms: t.prompt_ms,
            ttft_ms: before_gen_ms + t.ttft_ms,
            decode_ms: t.decode_ms,
            decode_tps: t.decode_tps,
        },
        prompt_ids: built.ids,
        generated_ids: out.generated,
        top_logits: out.top_logits,
        truncated_tokens: built.truncated,
        session,
        valid: out.valid,
        json: None,
        constraint: out.constraint,
        shape: None,
    }
}

/// Sends `text` as [`Event::Text`] chunks cut at character boundaries, waiting for room as
/// [`Channel::send`] does; stops at the first chunk that cannot go.
fn send_text(
    channel: &Channel,
    mut text: &str,
    deadline: Option<Instant>,
    alive: &dyn Fn(),
) -> Result<(), Stop> {
    while !text.is_empty() {
        let mut cut = text.len().min(super::CHUNK_BYTES);
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        let mut chunk = Chunk::new();
        // Cannot fail: `cut` bytes fit a chunk.
        let _ = chunk.push_str(&text[..cut]);
        channel.send(Event::Text(chunk), deadline, alive)?;
        text = &text[cut..];
    }
    Ok(())
}

fn no_sessions() -> ServiceError {
    ServiceError::new(
        ErrorCode::BadRequest,
        "this service keeps no named sessions (it has no state directory)",
    )
}

fn error(code: ErrorCode, message: impl Into<String>) -> Event {
    Event::Error(ServiceError::new(code, message))
}

fn ms(from: Instant, to: Instant) -> f64 {
    to.saturating_duration_since(from).as_secs_f64() * 1000.0
}
