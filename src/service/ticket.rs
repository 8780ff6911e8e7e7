//! The seam between the service and every front end: [`Handle::submit`](super::Handle::submit)
//! returns a [`Ticket`], which carries the request's id, a bounded stream of its [`Event`]s
//! and `cancel()`.
//!
//! ```text
//!  front end ──submit(Request)──► queue ──► worker ── Event ──► [ bounded channel ] ──► Ticket
//!      │                                      ▲  waits while full (up to the deadline)   │
//!      └─────────── Ticket::cancel / drop ────┴──────────────────────────────────────────┘
//! ```
//!
//! One backpressure policy for all: when a ticket's channel is full the worker waits for its
//! reader, until the request's deadline (or [`MAX_WAIT`] for a request without one), then
//! ends the answer (`timeout`, or `cancelled` when nobody read it). Memory stays bounded
//! whatever the reader does, and a reader that keeps up never slows the engine.
//!
//! One cancel path: [`Ticket::cancel`] (or a [`Canceller`] taken from it, or dropping the
//! ticket) raises the request's flag and wakes a worker waiting for room. It never waits for
//! the worker or for a reader, so any thread may call it, a tokio task included. A request
//! still waiting in the queue is taken out and answered `cancelled` at once.
//!
//! The final event (`Done` or `Error`) is always accepted, past the bound by one, so a worker
//! never waits to end a request.

use super::worker::Shared;
use super::{ErrorCode, Event, ServiceError};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Events a ticket holds before the worker waits for its reader: 64 chunks of at most
/// [`CHUNK_BYTES`](super::CHUNK_BYTES), 4 KiB of text.
pub const CAPACITY: usize = 64;

/// How long the worker waits for the reader of a full ticket whose request has no deadline.
pub const MAX_WAIT: Duration = Duration::from_secs(30);

/// Why the worker stopped sending to a ticket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Stop {
    /// The ticket was cancelled (or dropped).
    Cancelled,
    /// The channel stayed full until the request's deadline.
    Deadline,
    /// The channel stayed full for [`MAX_WAIT`]: nobody reads it.
    Unread,
}

struct Inner {
    events: VecDeque<Event>,
    capacity: usize,
    /// The final event is in `events` (or was read): nothing follows it.
    ended: bool,
}

/// What a ticket and the worker share.
pub(super) struct Channel {
    inner: Mutex<Inner>,
    cancelled: AtomicBool,
    /// The worker waits here for room (or a cancel).
    room: Condvar,
    /// A blocking reader waits here for an event.
    ready: Condvar,
    /// An async reader waits here (one reader: a stored permit is never lost).
    notify: tokio::sync::Notify,
}

impl Channel {
    pub(super) fn new(capacity: usize) -> Arc<Channel> {
        Arc::new(Channel {
            inner: Mutex::new(Inner {
                events: VecDeque::with_capacity(capacity.min(CAPACITY)),
                capacity: capacity.max(1),
                ended: false,
            }),
            cancelled: AtomicBool::new(false),
            room: Condvar::new(),
            ready: Condvar::new(),
            notify: tokio::sync::Notify::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Every mutation is one push or pop: a panic elsewhere leaves it consistent.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::Relaxed)
    }

    /// Raises the flag and wakes a worker waiting for room. The lock is taken so that a worker
    /// between its check of the flag and its wait cannot miss the wake-up; it is only ever held
    /// for one push or pop.
    pub(super) fn cancel(&self) {
        let _g = self.lock();
        self.cancelled.store(true, Ordering::Relaxed);
        self.room.notify_all();
    }

    fn woke_reader(&self) {
        self.ready.notify_all();
        self.notify.notify_one();
    }

    /// The worker's side: queues a `Text` event, waiting while the channel is full, at most
    /// until `deadline` (or [`MAX_WAIT`] without one). Waiting for a reader is not a hung
    /// engine: `alive` is called at least once a second meanwhile.
    pub(super) fn send(
        &self,
        ev: Event,
        deadline: Option<Instant>,
        alive: &dyn Fn(),
    ) -> Result<(), Stop> {
        let until = deadline.unwrap_or_else(|| Instant::now() + MAX_WAIT);
        let mut g = self.lock();
        loop {
            if self.is_cancelled() {
                return Err(Stop::Cancelled);
            }
            if g.events.len() < g.capacity {
                g.events.push_back(ev);
                drop(g);
                self.woke_reader();
                return Ok(());
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(if deadline.is_some() {
                    Stop::Deadline
                } else {
                    Stop::Unread
                });
            }
            g = self
                .room
                .wait_timeout(g, left.min(Duration::from_secs(1)))
                .unwrap_or_else(|p| p.into_inner())
                .0;
            alive();
        }
    }

    /// The final event (`Done` or `Error`): always accepted, never waits. Only the first one
    /// counts (a request ends once).
    pub(super) fn end(&self, ev: Event) {
        let mut g = self.lock();
        if g.ended {
            return;
        }
        g.ended = true;
        g.events.push_back(ev);
        drop(g);
        self.woke_reader();
    }

    /// The next event, `Some(None)` once the final one was taken, `None` when none is there yet.
    fn take(&self) -> Option<Option<Event>> {
        let mut g = self.lock();
        match g.events.pop_front() {
            Some(ev) => {
                drop(g);
                self.room.notify_all();
                Some(Some(ev))
            }
            None if g.ended => Some(None),
            None => None,
        }
    }
}

/// Cancels one request from anywhere: cloned out of its [`Ticket`] for a task or thread that
/// does not read the events (MQTT's cancel topic, a Modbus cancel register, a Ctrl-C).
#[derive(Clone)]
pub struct Canceller {
    channel: Arc<Channel>,
    service: Arc<Shared>,
}

impl Canceller {
    /// Cancels the request: a waiting one is answered `cancelled` at once, a running one stops
    /// at its next token with finish reason `cancelled`, an answered one is left as it is.
    /// Never blocks.
    pub fn cancel(&self) {
        if self.channel.is_cancelled() || self.is_ended() {
            return;
        }
        self.channel.cancel();
        if self.service.dequeue(&self.channel) {
            self.channel.end(Event::Error(ServiceError::new(
                ErrorCode::Cancelled,
                "cancelled before its answer started",
            )));
        }
    }
}

impl Canceller {
    /// The request has ended: its final event is in its ticket (or was read).
    pub fn is_ended(&self) -> bool {
        self.channel.lock().ended
    }
}

impl std::fmt::Debug for Canceller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Canceller")
            .field("cancelled", &self.channel.is_cancelled())
            .finish()
    }
}

/// A submitted request: its id, its events (any number of `Text`, then one `Done` or `Error`),
/// and the way to cancel it. Dropping it cancels the request.
pub struct Ticket {
    id: String,
    cancel: Canceller,
}

/// [`Ticket::recv_timeout`] found no event in time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("no event within the time given")]
pub struct Timeout;

impl Ticket {
    pub(super) fn new(id: String, channel: Arc<Channel>, service: Arc<Shared>) -> Ticket {
        Ticket {
            id,
            cancel: Canceller { channel, service },
        }
    }

    /// The request's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// See [`Canceller::cancel`].
    pub fn cancel(&self) {
        self.cancel.cancel();
    }

    /// A handle that cancels this request, for another task or thread.
    pub fn canceller(&self) -> Canceller {
        self.cancel.clone()
    }

    fn channel(&self) -> &Channel {
        &self.cancel.channel
    }

    /// Events received and not read yet.
    pub fn waiting(&self) -> usize {
        self.channel().lock().events.len()
    }

    /// The next event, waiting for it (a tokio task); `None` after the final one.
    pub async fn recv(&mut self) -> Option<Event> {
        loop {
            if let Some(ev) = self.channel().take() {
                return ev;
            }
            // One reader: a wake-up sent before this wait is kept as a permit.
            self.channel().notify.notified().await;
        }
    }

    /// The next event if one is there (`Some(None)` after the final one), without waiting.
    pub fn try_recv(&mut self) -> Option<Option<Event>> {
        self.channel().take()
    }

    /// The next event, waiting on this thread; `None` after the final one.
    pub fn blocking_recv(&mut self) -> Option<Event> {
        loop {
            match self.recv_timeout(Duration::from_secs(3600)) {
                Ok(ev) => return ev,
                Err(Timeout) => continue,
            }
        }
    }

    /// The next event, waiting on this thread at most `timeout`; `Ok(None)` after the final one.
    pub fn recv_timeout(&mut self, timeout: Duration) -> Result<Option<Event>, Timeout> {
        let until = Instant::now() + timeout;
        let ch = self.channel();
        let mut g = ch.lock();
        loop {
            if let Some(ev) = g.events.pop_front() {
                drop(g);
                ch.room.notify_all();
                return Ok(Some(ev));
            }
            if g.ended {
                return Ok(None);
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Timeout);
            }
            g = ch
                .ready
                .wait_timeout(g, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

impl Drop for Ticket {
    /// Nobody reads the answer any more: it is not worth the engine's time.
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

impl std::fmt::Debug for Ticket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ticket").field("id", &self.id).finish()
    }
}
