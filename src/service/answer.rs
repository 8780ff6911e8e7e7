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
use crate::engine::store::{
    PrefixReport, SessionFile, SessionId, SessionStore, Source, TurnReport,
};
use crate::engine::{Engine, GenOutput, GenParams, Sampler, Session};
use crate::tokenizer::{ChatTemplate, StreamDecoder};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

/// The sessions a worker answers in: [`Sessions`](super::Sessions) once opened.
pub(super) enum OpenSessions {
    /// No sessions: every request in a scratch session (one per request decoded at once).
    Scratch(Vec<Session>),
    File(SessionFile),
    /// A state directory, and the scratch sessions for requests that name none.
    Dir(SessionStore, Vec<Session>),
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
        if self.engine.config().max_batch > 1 {
            return self.run_batched();
        }
        while let Some(job) = self.next(true) {
            self.answer_alone(job);
        }
        tracing::debug!("worker stopped");
    }

    /// Answers `job` by itself, to its end.
    pub(super) fn answer_alone(&mut self, job: Job) {
        let Job {
            req,
            channel,
            submitted,
        } = job;
        let ev = match self.start(&req, &channel, submitted) {
            Ok((started, queue_ms)) => match self.generate(&req, &channel, started) {
                Ok(mut done) => {
                    done.timings.queue_ms = queue_ms;
                    Event::Done(Box::new(done))
                }
                Err(e) => Event::Error(e),
            },
            Err(e) => Event::Error(e),
        };
        self.conclude(&req, &channel, ev);
    }

    /// Ends a request with its last event: the counters, the log line, the audit trail, the
    /// ticket; the request leaves the running ones.
    pub(super) fn conclude(&mut self, req: &Request, channel: &Arc<Channel>, ev: Event) {
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
            r.record(req, &ev, self.engine.config(), self.engine.kernels().name());
        }
        channel.end(ev);
        {
            let mut st = self.shared.lock();
            st.running.retain(|(_, c)| !Arc::ptr_eq(c, channel));
            if st.running.is_empty() {
                self.shared.busy.store(false, Ordering::Relaxed);
            }
        }
        self.shared.wake.notify_all();
        self.shared.changed();
    }

    /// The next job, now running; waits (asleep) for one when `wait`, else `None` when the
    /// queue is empty. `None` too once the service is closed. Records the refusals told
    /// meanwhile ([`Handle::refused`](super::Handle::refused)) first.
    pub(super) fn next(&mut self, wait: bool) -> Option<Job> {
        let mut st = self.shared.lock();
        loop {
            if !st.refusals.is_empty() {
                let refusals = st.refusals.take();
                drop(st);
                self.record_refusals(&refusals);
                st = self.shared.lock();
                continue;
            }
            if st.closed {
                return None;
            }
            if let Some(job) = st.queue.pop() {
                st.running
                    .push((job.req.id.clone(), Arc::clone(&job.channel)));
                self.shared.progress();
                self.shared.busy.store(true, Ordering::Relaxed);
                drop(st);
                self.shared.changed();
                return Some(job);
            }
            if !wait {
                return None;
            }
            st = self.shared.wake.wait(st).unwrap_or_else(|p| p.into_inner());
        }
    }

    fn record_refusals(&mut self, refusals: &[super::Refusal]) {
        let Some(r) = &mut self.recorder else { return };
        for refusal in refusals {
            r.refused(refusal, self.engine.config(), self.engine.kernels().name());
        }
    }

    /// A request's start: refused when it was cancelled or its deadline passed in the queue;
    /// else when it started and how long it waited.
    pub(super) fn start(
        &self,
        req: &Request,
        channel: &Channel,
        submitted: Instant,
    ) -> Result<(Instant, f64), ServiceError> {
        let started = Instant::now();
        let queue_ms = ms(submitted, started);
        if channel.is_cancelled() {
            return Err(ServiceError::new(
                ErrorCode::Cancelled,
                "cancelled before its answer started",
            ));
        }
        if req.deadline.is_some_and(|d| started >= d) {
            return Err(ServiceError::new(
                ErrorCode::Timeout,
                format!("its deadline passed after {queue_ms:.0} ms in the queue"),
            ));
        }
        #[cfg(feature = "test-hooks")]
        if let Some(pause) = self.test_stall {
            std::thread::sleep(pause);
        }
        Ok((started, queue_ms))
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
        let Prepared {
            built,
            turn,
            params,
            mut sampler,
            shape,
        } = self.prepare(req)?;
        let model = Arc::clone(self.engine.model());
        let tok = &model.tokenizer;
        let engine = &mut self.engine;
        let is_eog = |t: u32| tok.is_eog(t);
        let mut stream = TextStream::new(req.max_tokens.min(engine.config().n_ctx));
        let shared = &self.shared;
        let mut on_token = |t: u32| stream.token(t, tok, channel, req.deadline, shared);
        let gen_start = Instant::now();
        let (out, report) = match (&mut self.sessions, &req.session) {
            (OpenSessions::Scratch(scratch) | OpenSessions::Dir(_, scratch), None) => {
                let out = engine.generate(
                    &mut scratch[0],
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
                (out, Some(named_report(store, id, turn, system)))
            }
        };
        let (text, stop) = stream.end(channel, req.deadline, &self.shared);
        let ended = Ended {
            built,
            turn,
            shape,
            out,
            report,
            text,
            stop,
            before_gen_ms: ms(started, gen_start),
        };
        Ok(self.finalize(req, ended))
    }

    /// What an answer needs before its first step: the prompt's tokens (a named session's
    /// conversation rendered, or the request's text), the sampler with the format's grammar.
    pub(super) fn prepare(&mut self, req: &Request) -> Result<Prepared, ServiceError> {
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
        Ok(Prepared {
            built,
            turn,
            params,
            sampler,
            shape,
        })
    }

    /// The `Done` of an answer the engine has ended: the finish reason the text stream's stop
    /// explains, a named session's turn logged (before the answer goes out: an acknowledged
    /// turn is kept), a format's JSON parsed.
    pub(super) fn finalize(&mut self, req: &Request, e: Ended) -> Done {
        let Ended {
            built,
            turn,
            shape,
            out,
            mut report,
            text,
            stop,
            before_gen_ms,
        } = e;
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
        let dropped_turns = turn.as_ref().map_or(0, Turn::dropped_turns);
        if let (Some(turn), Some(id), Some(r)) = (turn, &req.session, report.as_mut()) {
            r.turn = turn.finish(id, &text, finish, self.conversations);
        }
        let mut done = done(
            req,
            built,
            text,
            finish,
            out,
            recomputed,
            before_gen_ms,
            report,
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
        done
    }
}

/// A request made ready to generate: [`Worker::prepare`].
pub(super) struct Prepared {
    pub(super) built: Built,
    pub(super) turn: Option<Turn>,
    pub(super) params: GenParams,
    pub(super) sampler: Sampler,
    pub(super) shape: Option<Arc<super::Shape>>,
}

/// An answer the engine has ended, for [`Worker::finalize`].
pub(super) struct Ended {
    pub(super) built: Built,
    pub(super) turn: Option<Turn>,
    pub(super) shape: Option<Arc<super::Shape>>,
    pub(super) out: GenOutput,
    pub(super) report: Option<SessionReport>,
    pub(super) text: String,
    pub(super) stop: Option<Stop>,
    /// From the answer's start to its first engine step.
    pub(super) before_gen_ms: f64,
}

/// An answer's text as it is generated: each token's piece decoded (a character split across
/// tokens waits for its end) and sent to the ticket as it comes.
pub(super) struct TextStream {
    text: String,
    decoder: StreamDecoder,
    /// Why the answer was stopped before the engine ended it, if it was.
    stop: Option<Stop>,
}

impl TextStream {
    pub(super) fn new(max_tokens: usize) -> TextStream {
        TextStream {
            text: String::with_capacity(max_tokens.saturating_mul(8)),
            decoder: StreamDecoder::new(),
            stop: None,
        }
    }

    /// Takes one generated token: `false` stops the answer (cancelled, past its deadline, or
    /// nobody reads it), [`TextStream::end`] then says which.
    pub(super) fn token(
        &mut self,
        t: u32,
        tok: &crate::tokenizer::Tokenizer,
        channel: &Channel,
        deadline: Option<Instant>,
        shared: &Shared,
    ) -> bool {
        shared.progress();
        if tok.is_eog(t) {
            return true;
        }
        let start = self.text.len();
        self.decoder
            .push_into(tok.token_to_piece(t), &mut self.text);
        let alive = || shared.progress();
        let why = match send_text(channel, &self.text[start..], deadline, &alive) {
            Err(why) => why,
            Ok(()) => match TextStream::should_stop(channel, deadline) {
                Some(why) => why,
                None => return true,
            },
        };
        self.stop = Some(why);
        false
    }

    /// Stops the answer between steps, for `why`, as a `false` from [`TextStream::token`] would.
    pub(super) fn stop(&mut self, why: Stop) {
        self.stop.get_or_insert(why);
    }

    /// Why the answer should stop before its next step (cancelled, or past its deadline).
    pub(super) fn should_stop(channel: &Channel, deadline: Option<Instant>) -> Option<Stop> {
        if channel.is_cancelled() {
            Some(Stop::Cancelled)
        } else if deadline.is_some_and(|d| Instant::now() >= d) {
            Some(Stop::Deadline)
        } else {
            None
        }
    }

    /// The whole text and why it stopped early, if it did; sends what an invalid sequence at
    /// the very end left (`Done` carries it anyway).
    pub(super) fn end(
        mut self,
        channel: &Channel,
        deadline: Option<Instant>,
        shared: &Shared,
    ) -> (String, Option<Stop>) {
        let tail = self.decoder.finish();
        self.text.push_str(&tail);
        if self.stop.is_none() {
            let _ = send_text(channel, &tail, deadline, &|| shared.progress());
        }
        (self.text, self.stop)
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

/// What a named session's turn did, with the store's status after it.
pub(super) fn named_report(
    store: &SessionStore,
    id: &SessionId,
    turn: TurnReport,
    system_prompt: Option<PrefixReport>,
) -> SessionReport {
    let mut r = SessionReport::of(Some(id), turn);
    r.status = Some(store.status());
    r.system_prompt = system_prompt;
    r
}

/// Caches the system prompt's prefix for `built`'s conversation (a failure only costs speed).
pub(super) fn cache_system_prompt(
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

pub(super) fn ms(from: Instant, to: Instant) -> f64 {
    to.saturating_duration_since(from).as_secs_f64() * 1000.0
}
