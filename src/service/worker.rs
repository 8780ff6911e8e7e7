//! The worker: one thread that owns the [`Engine`] and its sessions, takes [`Request`]s from
//! the bounded [`FairQueue`] and answers each with [`Event`]s.
//!
//! Front ends hold a [`Handle`] (cheap to clone, `Send + Sync`): `submit` queues a request and
//! returns its [`Ticket`] (`ticket.rs`: the events, backpressure and cancellation), or answers
//! `busy` at once. An idle worker sleeps on a condition variable (no CPU); the compute pool's
//! threads park between requests too. Cancellation and deadlines are checked between tokens.
//! The worker's side — taking a request and answering it — is in `answer.rs`.

use super::answer::{OpenSessions, Worker};
use super::queue::{FairQueue, Full};
use super::refusal::{Inbox, Refusal};
use super::ticket::{Channel, Ticket};
use super::{ErrorCode, Event, FormatLimits, Recorder, Request, ServiceError, Shape};
use crate::engine::Engine;
use crate::engine::constraint::Grammars;
use crate::engine::store::{SessionFile, SessionStore, StoreConfig};
use crate::tokenizer::ChatTemplate;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
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
    Dir(StoreConfig),
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
    /// A chat template to use instead of the model's: a Jinja file, or a built-in name.
    pub chat_template: Option<PathBuf>,
    /// What a session whose conversation outgrew the context does.
    pub context_full: super::ContextFull,
    /// How much of a named session's conversation is kept.
    pub conversations: super::ConversationBounds,
    /// The named formats requests may ask for (`Format::Named`).
    pub formats: Arc<BTreeMap<String, Shape>>,
    /// What one format may cost to compile and to follow.
    pub format_limits: FormatLimits,
    /// Events a [`Ticket`] holds before the worker waits for its reader
    /// ([`ticket::CAPACITY`](super::ticket::CAPACITY)).
    pub ticket_capacity: usize,
    /// Tests only (the `test-hooks` feature): every answer starts with this pause, during
    /// which the worker makes no progress (a hung engine, as a supervisor's watchdog must see it).
    #[cfg(feature = "test-hooks")]
    pub test_stall: Option<Duration>,
}

impl Default for ServiceConfig {
    fn default() -> Self {
        ServiceConfig {
            queue_depth: 16,
            per_source: 8,
            max_prompt_bytes: 16 << 20,
            sessions: Sessions::None,
            chat_template: None,
            context_full: super::ContextFull::Slide,
            conversations: super::ConversationBounds::default(),
            formats: Arc::default(),
            format_limits: FormatLimits::default(),
            ticket_capacity: super::ticket::CAPACITY,
            #[cfg(feature = "test-hooks")]
            test_stall: None,
        }
    }
}

pub(super) struct Job {
    pub(super) req: Request,
    pub(super) channel: Arc<Channel>,
    pub(super) submitted: Instant,
}

pub(super) struct State {
    pub(super) queue: FairQueue<Job>,
    /// The requests being answered (several when they are decoded together), oldest first:
    /// each one's id and its ticket's channel.
    pub(super) running: Vec<(String, Arc<Channel>)>,
    pub(super) closed: bool,
    /// Requests refused before the queue, for the worker to record.
    pub(super) refusals: Inbox,
}

/// Counters since start, for a status report.
#[derive(Debug, Default)]
pub struct Counters {
    pub accepted: AtomicU64,
    pub busy: AtomicU64,
    pub answered: AtomicU64,
    pub failed: AtomicU64,
    pub cancelled: AtomicU64,
    /// Decoding steps that advanced several answers at once.
    pub batched_steps: AtomicU64,
    /// Refusals the audit trail did not record: more came than its bounds take
    /// ([`refusal`](super::refusal)).
    pub unrecorded_refusals: AtomicU64,
    /// Decode tokens/s of the last answer (`f64` bits).
    pub last_tps: AtomicU64,
    /// Session saves to the state directory (a full or read-only disk shows here).
    pub saves: super::Health,
}

impl Counters {
    pub fn last_tps(&self) -> f64 {
        f64::from_bits(self.last_tps.load(Ordering::Relaxed))
    }
}

/// Called after the queue or the counters changed (a front end republishes its status).
pub type Observer = Arc<dyn Fn() + Send + Sync>;

pub(super) struct Shared {
    state: Mutex<State>,
    /// Signalled when a job is queued or the service closes (wakes the worker), and when a job
    /// ends (wakes a shutdown waiting for it).
    pub(super) wake: Condvar,
    pub(super) counters: Counters,
    observer: Mutex<Option<Observer>>,
    /// When the service started: the clock of `progress_ms`.
    epoch: Instant,
    /// Milliseconds after `epoch` of the worker's last sign of life (a request taken, a token).
    progress_ms: AtomicU64,
    /// The worker is answering a request.
    pub(super) busy: AtomicBool,
    /// Most bytes of user text in one request (changed by a reload).
    pub(super) max_prompt_bytes: AtomicUsize,
    /// Events a ticket holds before the worker waits for its reader.
    ticket_capacity: usize,
    /// The worker records what it ends (an audit trail): refusals are worth telling it.
    recording: bool,
}

impl Shared {
    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves a queue that is still consistent (every
        // mutation is one call): keep serving rather than poison every front end.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn changed(&self) {
        let o = self
            .observer
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if let Some(o) = o {
            o();
        }
    }

    pub(super) fn progress(&self) {
        let ms = self.epoch.elapsed().as_millis() as u64;
        self.progress_ms.store(ms, Ordering::Relaxed);
    }

    /// Takes the request of `channel` out of the queue if it is still waiting (it was
    /// cancelled). Returns whether it was there.
    pub(super) fn dequeue(&self, channel: &Arc<Channel>) -> bool {
        let found = self
            .lock()
            .queue
            .remove_first(|j| Arc::ptr_eq(&j.channel, channel))
            .is_some();
        if found {
            self.counters.cancelled.fetch_add(1, Ordering::Relaxed);
            self.changed();
        }
        found
    }
}

/// A front end's way into the service.
#[derive(Clone)]
pub struct Handle {
    shared: Arc<Shared>,
}

impl Handle {
    /// Queues `req` and returns its [`Ticket`]: its events, and the way to cancel it.
    /// Refused at once when the queue or the source's share of it is full (`busy`), the id
    /// or the prompt fails [`check`](super::check) (`bad_request`), or the service has stopped
    /// (`cancelled`).
    pub fn submit(&self, req: Request) -> Result<Ticket, ServiceError> {
        if let Err(e) = super::check(&req) {
            let session = req.session.as_ref().map(|s| s.as_str());
            self.refused(Refusal::new(&req.id, &req.source, e.clone()).with_session(session));
            return Err(e);
        }
        let channel = Channel::new(self.shared.ticket_capacity);
        let id = req.id.clone();
        let source = req.source.clone();
        let job = Job {
            req,
            channel: Arc::clone(&channel),
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
                Ok(Ticket::new(id, channel, Arc::clone(&self.shared)))
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

    /// A request refused before the queue, by a front end or by [`Handle::submit`], for the
    /// audit trail: the worker records it within a decoding step. Bounded in count and rate
    /// (`refusal.rs`); what the bounds drop is counted in
    /// [`Counters::unrecorded_refusals`]. Nothing happens without a trail.
    pub fn refused(&self, r: Refusal) {
        if !self.shared.recording {
            return;
        }
        let kept = self.shared.lock().refusals.push(r, Instant::now());
        if kept {
            self.shared.wake.notify_all();
        } else {
            let n = self
                .shared
                .counters
                .unrecorded_refusals
                .fetch_add(1, Ordering::Relaxed);
            if n == 0 {
                tracing::warn!(
                    "refusals come faster than the audit trail records them ({} a second, \
                     {} waiting): the rest are counted, not recorded",
                    super::refusal::PER_SECOND,
                    super::refusal::MAX_PENDING
                );
            }
        }
    }

    /// New bounds for the requests to come (a reload): queue depth, per-source share, prompt
    /// bytes. Requests already accepted keep going.
    pub fn set_limits(&self, queue_depth: usize, per_source: usize, max_prompt_bytes: usize) {
        self.shared.lock().queue.set_bounds(queue_depth, per_source);
        self.shared
            .max_prompt_bytes
            .store(max_prompt_bytes, Ordering::Relaxed);
    }

    /// Requests waiting (the one being answered not counted).
    pub fn queue_len(&self) -> usize {
        self.shared.lock().queue.len()
    }

    /// The id of the request being answered (the oldest, when several are).
    pub fn running(&self) -> Option<String> {
        self.shared.lock().running.first().map(|(id, _)| id.clone())
    }

    /// How many requests are being answered now (decoded together).
    pub fn running_count(&self) -> usize {
        self.shared.lock().running.len()
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
    pub fn start(engine: Engine, cfg: ServiceConfig) -> Result<Service, ServiceError> {
        Service::start_recorded(engine, cfg, || None)
    }

    /// As [`Service::start`], with every ended request told to the recorder (an audit trail)
    /// that `recorder` makes once the sessions are open: the state directory is then locked
    /// to this process, and the recorder may write in it.
    pub fn start_recorded(
        mut engine: Engine,
        cfg: ServiceConfig,
        recorder: impl FnOnce() -> Option<Box<dyn Recorder>>,
    ) -> Result<Service, ServiceError> {
        // One scratch session for each request decoded at once (a single session file
        // answers one request at a time: it needs none).
        let scratch = |engine: &Engine| {
            (0..engine.config().max_batch)
                .map(|_| engine.new_session())
                .collect()
        };
        let sessions = match &cfg.sessions {
            Sessions::None => OpenSessions::Scratch(scratch(&engine)),
            Sessions::File(path) => OpenSessions::File(SessionFile::open(&mut engine, path)?),
            Sessions::Dir(sc) => {
                OpenSessions::Dir(SessionStore::open(&engine, sc.clone())?, scratch(&engine))
            }
        };
        let recorder = recorder();
        // A model without a template still answers raw prompts; a chat is then refused.
        // One that cannot format a single user turn (a template from the model file that loops,
        // floods or raises) is as good as none, and is said so once here rather than per chat.
        let trial = [crate::tokenizer::ChatMessage::new("user", "Hello")];
        let template = match &cfg.chat_template {
            // One the user names must work: an error at start, not chats refused later.
            Some(spec) => {
                let t = ChatTemplate::from_user(spec, &engine.model().tokenizer)
                    .and_then(|t| t.render_protected(None, &trial, true).map(|_| t))
                    .map_err(|e| ServiceError::new(ErrorCode::Internal, e.to_string()))?;
                Some(t)
            }
            None => match engine.model().chat_template() {
                Ok(t) => match t.render_protected(None, &trial, true) {
                    Ok(_) => Some(t),
                    Err(e) => {
                        tracing::warn!(
                            "the model's chat template is not used: {e}; chats are refused"
                        );
                        None
                    }
                },
                Err(e) => {
                    tracing::info!("no chat template: {e}");
                    None
                }
            },
        };
        if let Some(t) = &template {
            tracing::info!(template = t.origin(), "chat template");
        }
        // Named formats must work: an error at start, not requests refused later. The
        // vocabulary's grammar tables are then built now rather than at the first request.
        let grammars = if cfg.formats.is_empty() {
            None
        } else {
            let g = Grammars::new(engine.model(), cfg.format_limits)
                .map_err(|e| ServiceError::new(ErrorCode::Internal, e))?;
            for (name, shape) in cfg.formats.iter() {
                g.compile(shape, 1).map_err(|e| {
                    ServiceError::new(ErrorCode::BadRequest, format!("format {name:?}: {e}"))
                })?;
            }
            tracing::info!(formats = cfg.formats.len(), "named answer formats ready");
            Some(g)
        };
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                queue: FairQueue::new(cfg.queue_depth, cfg.per_source),
                running: Vec::new(),
                closed: false,
                refusals: Inbox::default(),
            }),
            wake: Condvar::new(),
            counters: Counters::default(),
            observer: Mutex::new(None),
            epoch: Instant::now(),
            progress_ms: AtomicU64::new(0),
            busy: AtomicBool::new(false),
            max_prompt_bytes: AtomicUsize::new(cfg.max_prompt_bytes),
            ticket_capacity: cfg.ticket_capacity,
            recording: recorder.is_some(),
        });
        let mut worker = Worker {
            engine,
            template,
            sessions,
            context_full: cfg.context_full,
            conversations: cfg.conversations,
            formats: cfg.formats,
            format_limits: cfg.format_limits,
            grammars,
            #[cfg(feature = "test-hooks")]
            test_stall: cfg.test_stall,
            recorder,
            shared: Arc::clone(&shared),
        };
        let thread = std::thread::Builder::new()
            .name("edgellm-worker".into())
            .spawn(move || {
                // The engine's thread 0 runs here: on the engine's CPUs, as its workers.
                if let Err(e) = worker.engine.pin_current_thread() {
                    tracing::warn!("the service worker runs unpinned: {e}");
                }
                worker.run()
            })
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

    /// Stops: no new request is taken, waiting ones are answered `cancelled`, the running ones
    /// may finish within `grace` and are cancelled after it; then the worker ends.
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
        for job in waiting {
            shared.counters.cancelled.fetch_add(1, Ordering::Relaxed);
            job.channel.end(Event::Error(ServiceError::new(
                ErrorCode::Cancelled,
                "the service stopped before this request started",
            )));
        }
        let until = Instant::now() + grace;
        let mut st = shared.lock();
        while !st.running.is_empty() {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                for (id, channel) in &st.running {
                    tracing::warn!(request = %id, "cancelling the answer in progress to stop");
                    channel.cancel();
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
