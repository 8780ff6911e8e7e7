//! The worker: one thread that owns the [`Engine`] and its sessions, takes [`Request`]s from
//! the bounded [`FairQueue`] and answers each with [`Event`]s.
//!
//! Front ends hold a [`Handle`] (cheap to clone, `Send + Sync`): `submit` queues a request or
//! answers `busy` at once, `cancel` stops one by id, whether it is waiting or being answered.
//! An idle worker sleeps on a condition variable (no CPU); the compute pool's threads park
//! between requests too. Cancellation and deadlines are checked between tokens.

use super::prompt::{self, Built};
use super::queue::{FairQueue, Full};
use super::{
    Chunk, Done, ErrorCode, Event, FinishReason, Request, ServiceError, SessionReport, Timings,
    Usage,
};
use crate::engine::store::{SessionFile, SessionStore, Source, StoreConfig};
use crate::engine::{Engine, GenOutput, GenParams, Sampler, Session};
use crate::tokenizer::{ChatTemplate, StreamDecoder};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Where the sessions of requests live.
#[derive(Clone, Debug)]
pub enum Sessions {
    /// None: every request starts from an empty cache; a request naming a session is refused.
    None,
    /// One snapshot file holds the one session every request continues.
    File(PathBuf),
    /// Named sessions and cached system prompts in a state directory.
    Store(StoreConfig),
}

/// How the service is sized.
#[derive(Clone, Debug)]
pub struct ServiceConfig {
    /// Requests waiting at most (the one being answered not counted).
    pub queue_depth: usize,
    /// Waiting requests one source may hold (so one cannot starve the others).
    pub per_source: usize,
    /// Most bytes of user text in one request.
    pub max_prompt_bytes: usize,
    pub sessions: Sessions,
}

impl Default for ServiceConfig {
    fn default() -> Self {
        ServiceConfig {
            queue_depth: 16,
            per_source: 8,
            max_prompt_bytes: 16 << 20,
            sessions: Sessions::None,
        }
    }
}

/// Where a request's events go. `send` returns `false` once nobody listens: the answer is then
/// cancelled.
pub trait Sink: Send {
    fn send(&mut self, ev: Event) -> bool;
}

impl Sink for std::sync::mpsc::SyncSender<Event> {
    fn send(&mut self, ev: Event) -> bool {
        std::sync::mpsc::SyncSender::send(self, ev).is_ok()
    }
}

impl Sink for std::sync::mpsc::Sender<Event> {
    fn send(&mut self, ev: Event) -> bool {
        std::sync::mpsc::Sender::send(self, ev).is_ok()
    }
}

struct Job {
    req: Request,
    sink: Box<dyn Sink>,
    cancel: Arc<AtomicBool>,
    submitted: Instant,
}

struct State {
    queue: FairQueue<Job>,
    /// The request being answered: its id and cancel flag.
    running: Option<(String, Arc<AtomicBool>)>,
    closed: bool,
}

/// Counters since start, for a status report.
#[derive(Debug, Default)]
pub struct Counters {
    pub accepted: AtomicU64,
    pub busy: AtomicU64,
    pub answered: AtomicU64,
    pub failed: AtomicU64,
    pub cancelled: AtomicU64,
    /// Decode tokens/s of the last answer (`f64` bits).
    pub last_tps: AtomicU64,
}

impl Counters {
    pub fn last_tps(&self) -> f64 {
        f64::from_bits(self.last_tps.load(Ordering::Relaxed))
    }
}

/// Called after the queue or the counters changed (a front end republishes its status).
pub type Observer = Arc<dyn Fn() + Send + Sync>;

struct Shared {
    state: Mutex<State>,
    /// Signalled when a job is queued or the service closes (wakes the worker), and when a job
    /// ends (wakes a shutdown waiting for it).
    wake: Condvar,
    counters: Counters,
    observer: Mutex<Option<Observer>>,
    /// When the service started: the clock of `progress_ms`.
    epoch: Instant,
    /// Milliseconds after `epoch` of the worker's last sign of life (a request taken, a token).
    progress_ms: AtomicU64,
    /// The worker is answering a request.
    busy: AtomicBool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves a queue that is still consistent (every
        // mutation is one call): keep serving rather than poison every front end.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn changed(&self) {
        let o = self
            .observer
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if let Some(o) = o {
            o();
        }
    }

    fn progress(&self) {
        let ms = self.epoch.elapsed().as_millis() as u64;
        self.progress_ms.store(ms, Ordering::Relaxed);
    }
}

/// A front end's way into the service.
#[derive(Clone)]
pub struct Handle {
    shared: Arc<Shared>,
}

/// A queued request: its id, and a way to cancel it.
#[derive(Clone, Debug)]
pub struct Ticket {
    pub id: String,
    cancel: Arc<AtomicBool>,
}

impl Ticket {
    /// Cancels the request: a waiting one is answered `cancelled` when its turn comes, a
    /// running one stops at the next token with finish reason `cancelled`.
    pub fn cancel(&self) {
        self.cancel.store(true, Ordering::Relaxed);
    }
}

impl Handle {
    /// Queues `req`; its events go to `sink`. Refused at once (nothing is sent to `sink`) when
    /// the queue or the source's share of it is full (`busy`), the id is bad, or the service
    /// has stopped (`cancelled`).
    pub fn submit(&self, req: Request, sink: Box<dyn Sink>) -> Result<Ticket, ServiceError> {
        if req.id.is_empty() || req.id.len() > super::MAX_ID_LEN {
            return Err(ServiceError::new(
                ErrorCode::BadRequest,
                format!(
                    "a request id must have 1 to {} bytes, this one has {}",
                    super::MAX_ID_LEN,
                    req.id.len()
                ),
            ));
        }
        let cancel = Arc::new(AtomicBool::new(false));
        let ticket = Ticket {
            id: req.id.clone(),
            cancel: Arc::clone(&cancel),
        };
        let source = req.source.clone();
        let job = Job {
            req,
            sink,
            cancel,
            submitted: Instant::now(),
        };
        let c = &self.shared.counters;
        let mut st = self.shared.lock();
        if st.closed {
            return Err(ServiceError::new(
                ErrorCode::Cancelled,
                "the service is stopping",
            ));
        }
        match st.queue.push(&source, job) {
            Ok(()) => {
                drop(st);
                c.accepted.fetch_add(1, Ordering::Relaxed);
                self.shared.wake.notify_all();
                self.shared.changed();
                Ok(ticket)
            }
            Err((full, _)) => {
                c.busy.fetch_add(1, Ordering::Relaxed);
                let message = match full {
                    Full::Queue { capacity } => {
                        format!("busy: {capacity} requests are already waiting")
                    }
                    Full::Source { per_source } => {
                        format!("busy: this source already has {per_source} requests waiting")
                    }
                };
                Err(ServiceError::new(ErrorCode::Busy, message))
            }
        }
    }

    /// Cancels request `id`, waiting or running. A waiting one is taken out of the queue and
    /// answered `cancelled` at once. Returns whether it was found.
    pub fn cancel(&self, id: &str) -> bool {
        let mut st = self.shared.lock();
        if let Some((rid, flag)) = &st.running
            && rid == id
        {
            flag.store(true, Ordering::Relaxed);
            return true;
        }
        let Some(mut job) = st.queue.remove_first(|j| j.req.id == id) else {
            return false;
        };
        drop(st);
        self.shared
            .counters
            .cancelled
            .fetch_add(1, Ordering::Relaxed);
        job.sink.send(Event::Error(ServiceError::new(
            ErrorCode::Cancelled,
            "cancelled before its answer started",
        )));
        true
    }

    /// Requests waiting (the one being answered not counted).
    pub fn queue_len(&self) -> usize {
        self.shared.lock().queue.len()
    }

    /// The id of the request being answered.
    pub fn running(&self) -> Option<String> {
        self.shared
            .lock()
            .running
            .as_ref()
            .map(|(id, _)| id.clone())
    }

    pub fn counters(&self) -> &Counters {
        &self.shared.counters
    }

    /// Calls `f` whenever a request is queued, started or ended (on the thread that did it:
    /// `f` must be quick, e.g. wake a task).
    pub fn set_observer(&self, f: Observer) {
        *self
            .shared
            .observer
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(f);
    }

    /// How long the worker has been answering one request without producing anything (zero
    /// when idle): a stuck engine shows here, and a supervisor's watchdog stops.
    pub fn stalled_for(&self) -> Duration {
        if !self.shared.busy.load(Ordering::Relaxed) {
            return Duration::ZERO;
        }
        let now = self.shared.epoch.elapsed().as_millis() as u64;
        Duration::from_millis(now.saturating_sub(self.shared.progress_ms.load(Ordering::Relaxed)))
    }
}

/// The running service: its worker thread and a handle to it.
pub struct Service {
    handle: Handle,
    thread: Option<JoinHandle<()>>,
}

impl Service {
    /// Opens the sessions (the state directory or the session file) and starts the worker,
    /// which owns `engine` from now on.
    pub fn start(mut engine: Engine, cfg: ServiceConfig) -> Result<Service, ServiceError> {
        let sessions = match &cfg.sessions {
            Sessions::None => Store::None(engine.new_session()),
            Sessions::File(path) => Store::File(SessionFile::open(&mut engine, path)?),
            Sessions::Store(sc) => Store::Dir(
                SessionStore::open(&engine, sc.clone())?,
                engine.new_session(),
            ),
        };
        // A model without a template still answers raw prompts; a chat is then refused.
        let template = match engine.model().chat_template() {
            Ok(t) => Some(t),
            Err(e) => {
                tracing::info!("no chat template: {e}");
                None
            }
        };
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                queue: FairQueue::new(cfg.queue_depth, cfg.per_source),
                running: None,
                closed: false,
            }),
            wake: Condvar::new(),
            counters: Counters::default(),
            observer: Mutex::new(None),
            epoch: Instant::now(),
            progress_ms: AtomicU64::new(0),
            busy: AtomicBool::new(false),
        });
        let mut worker = Worker {
            engine,
            template,
            sessions,
            max_prompt_bytes: cfg.max_prompt_bytes,
            shared: Arc::clone(&shared),
        };
        let thread = std::thread::Builder::new()
            .name("edgellm-worker".into())
            .spawn(move || worker.run())
            .map_err(|e| {
                ServiceError::new(ErrorCode::Internal, format!("cannot start the worker: {e}"))
            })?;
        Ok(Service {
            handle: Handle { shared },
            thread: Some(thread),
        })
    }

    pub fn handle(&self) -> Handle {
        self.handle.clone()
    }

    /// Stops: no new request is taken, waiting ones are answered `cancelled`, the running one
    /// may finish within `grace` and is cancelled after it; then the worker ends.
    pub fn shutdown(mut self, grace: Duration) {
        self.stop(grace);
    }

    fn stop(&mut self, grace: Duration) {
        let shared = &self.handle.shared;
        let waiting: Vec<Job> = {
            let mut st = shared.lock();
            st.closed = true;
            st.queue.drain().collect()
        };
        shared.wake.notify_all();
        for mut job in waiting {
            shared.counters.cancelled.fetch_add(1, Ordering::Relaxed);
            job.sink.send(Event::Error(ServiceError::new(
                ErrorCode::Cancelled,
                "the service stopped before this request started",
            )));
        }
        let until = Instant::now() + grace;
        let mut st = shared.lock();
        while st.running.is_some() {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                if let Some((id, flag)) = &st.running {
                    tracing::warn!(request = %id, "cancelling the answer in progress to stop");
                    flag.store(true, Ordering::Relaxed);
                }
                break;
            }
            st = shared
                .wake
                .wait_timeout(st, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        drop(st);
        if let Some(t) = self.thread.take()
            && t.join().is_err()
        {
            tracing::error!("the worker thread panicked");
        }
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        if self.thread.is_some() {
            self.stop(Duration::ZERO);
        }
    }
}

/// The sessions a worker answers in.
enum Store {
    /// No sessions: every request in one scratch session.
    None(Session),
    File(SessionFile),
    /// A state directory, and a scratch session for requests that name none.
    Dir(SessionStore, Session),
}

struct Worker {
    engine: Engine,
    template: Option<ChatTemplate>,
    sessions: Store,
    max_prompt_bytes: usize,
    shared: Arc<Shared>,
}

impl Worker {
    fn run(&mut self) {
        while let Some(job) = self.next() {
            let Job {
                req,
                mut sink,
                cancel,
                submitted,
            } = job;
            let ev = self.answer(&req, sink.as_mut(), &cancel, submitted);
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
            if let Event::Done(d) = &ev {
                c.last_tps
                    .store(d.timings.decode_tps.to_bits(), Ordering::Relaxed);
            }
            sink.send(ev);
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
                st.running = Some((job.req.id.clone(), Arc::clone(&job.cancel)));
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
    /// having gone to `sink` already.
    fn answer(
        &mut self,
        req: &Request,
        sink: &mut dyn Sink,
        cancel: &AtomicBool,
        submitted: Instant,
    ) -> Event {
        let started = Instant::now();
        let queue_ms = ms(submitted, started);
        if cancel.load(Ordering::Relaxed) {
            return error(ErrorCode::Cancelled, "cancelled before its answer started");
        }
        if req.deadline.is_some_and(|d| started >= d) {
            return error(
                ErrorCode::Timeout,
                format!("its deadline passed after {queue_ms:.0} ms in the queue"),
            );
        }
        match self.generate(req, sink, cancel, started) {
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
        sink: &mut dyn Sink,
        cancel: &AtomicBool,
        started: Instant,
    ) -> Result<Done, ServiceError> {
        if let Err(e) = req.sampling.validate() {
            return Err(ServiceError::new(ErrorCode::BadRequest, e.to_string()));
        }
        let engine = &mut self.engine;
        let model = Arc::clone(engine.model());
        let tok = &model.tokenizer;
        let n_ctx = engine.config().n_ctx;
        let built = prompt::build(
            tok,
            self.template.as_ref(),
            req,
            n_ctx,
            self.max_prompt_bytes,
        )?;
        let params = GenParams {
            max_tokens: req.max_tokens,
            top_logits: req.top_logits,
        };
        let mut sampler = Sampler::new(req.sampling.clone(), model.hp.n_vocab);
        let is_eog = |t: u32| tok.is_eog(t);

        let mut text = String::with_capacity(req.max_tokens.min(n_ctx).saturating_mul(8));
        let mut stream = StreamDecoder::new();
        let (mut gone, mut cancelled, mut timed_out) = (false, false, false);
        let shared = &self.shared;
        let mut on_token = |t: u32| {
            shared.progress();
            if tok.is_eog(t) {
                return true;
            }
            let start = text.len();
            stream.push_into(tok.token_to_piece(t), &mut text);
            if !send_text(sink, &text[start..]) {
                gone = true;
                return false;
            }
            if cancel.load(Ordering::Relaxed) {
                cancelled = true;
                return false;
            }
            if req.deadline.is_some_and(|d| Instant::now() >= d) {
                timed_out = true;
                return false;
            }
            true
        };
        let gen_start = Instant::now();
        let (out, report) = match (&mut self.sessions, &req.session) {
            (Store::None(scratch) | Store::Dir(_, scratch), None) => {
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
            (Store::None(_) | Store::File(_), Some(_)) => return Err(no_sessions()),
            (Store::File(f), None) => {
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
            (Store::Dir(store, _), Some(id)) => {
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
        if !gone {
            send_text(sink, &tail);
        }
        let finish = match out.finish {
            _ if timed_out => FinishReason::Timeout,
            _ if cancelled || gone => FinishReason::Cancelled,
            crate::engine::FinishReason::Eog => FinishReason::Eog,
            crate::engine::FinishReason::Length => FinishReason::Length,
            crate::engine::FinishReason::ContextFull => FinishReason::ContextFull,
            crate::engine::FinishReason::Cancelled => FinishReason::Cancelled,
        };
        let recomputed = report.as_ref().map_or(0, |r| match r.source {
            Source::File { recomputed, .. } | Source::Refused { recomputed, .. } => recomputed,
            _ => 0,
        });
        let before_gen = ms(started, gen_start);
        Ok(done(
            req, built, text, finish, out, recomputed, before_gen, report,
        ))
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
    // Positions recomputed from a damaged file's tokens were computed for this answer.
    let recomputed = recomputed.min(t.restored_tokens);
    Done {
        id: req.id.clone(),
        text,
        finish_reason,
        usage: Usage {
            prompt_tokens: t.prompt_tokens + recomputed,
            completion_tokens: out.generated.len(),
            restored_tokens: t.restored_tokens - recomputed,
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
    }
}

/// Sends `text` as [`Event::Text`] chunks cut at character boundaries; `false` once the sink
/// is gone.
fn send_text(sink: &mut dyn Sink, mut text: &str) -> bool {
    while !text.is_empty() {
        let mut cut = text.len().min(super::CHUNK_BYTES);
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        let mut chunk = Chunk::new();
        // Cannot fail: `cut` bytes fit a chunk.
        let _ = chunk.push_str(&text[..cut]);
        if !sink.send(Event::Text(chunk)) {
            return false;
        }
        text = &text[cut..];
    }
    true
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
