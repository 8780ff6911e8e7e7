//! What every serial protocol core is: a state machine fed bytes and the service's events,
//! acting only through an [`Env`] (write bytes, submit or cancel the port's request, read the
//! status). The driver implements `Env` over a real port and the service; tests implement it
//! over a `Vec<u8>`, so every byte of every mode is tested without a tty.
//!
//! One request at a time per port: a PLC on a serial line sends a command and waits for its
//! answer. A second request while one runs is refused by the core (`busy`), never queued
//! behind the first one unseen.

use super::stats::Count;
use crate::service::{Event, Refusal, Request, ServiceError};
use std::time::Instant;

/// What a core may read of the daemon for a status command.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StatusView {
    /// `online` or `busy`.
    pub state: &'static str,
    pub model: String,
    /// Requests waiting in the service queue (all front ends).
    pub queue: usize,
    /// The service is answering a request (of any front end).
    pub running: bool,
    pub answered: u64,
    pub failed: u64,
    pub busy: u64,
    pub uptime_s: u64,
    /// This port's requests, refused inputs and checksum/CRC errors.
    pub port_requests: u64,
    pub port_bad_input: u64,
    pub port_checksum_errors: u64,
}

impl StatusView {
    /// The counters of every status: the line's `STATUS`, the console's `status` and the
    /// status frame (which carries them as u32 in this order) all list them from here, so a
    /// counter is added once for all three.
    pub fn counters(&self) -> [(&'static str, u64); 7] {
        [
            ("answered", self.answered),
            ("failed", self.failed),
            ("busy", self.busy),
            ("uptime_s", self.uptime_s),
            ("port_requests", self.port_requests),
            ("port_bad_input", self.port_bad_input),
            ("port_checksum_errors", self.port_checksum_errors),
        ]
    }
}

/// The world of a protocol core.
pub trait Env {
    /// Bytes for the port, in order (the driver writes them after the call returns).
    fn write(&mut self, bytes: &[u8]);
    /// Hands `req` to the service for this port. Its events come back through
    /// [`Core::on_event`]; `Err` is a refusal at once (queue full, bad request) and no event
    /// follows.
    fn submit(&mut self, req: Request) -> Result<(), ServiceError>;
    /// A request this core refused itself (a session name it cannot use), for the audit
    /// trail; the core answers the port as usual.
    fn refused(&mut self, r: Refusal);
    /// A request this core refused, told under a fresh id with the session name it gave.
    fn refused_here(&mut self, error: ServiceError, session: Option<&str>) {
        let id = self.new_id();
        let r = Refusal::new(&id, self.source(), error).with_session(session);
        self.refused(r);
    }
    /// Cancels this port's request, if one runs or waits: it ends with finish reason (or
    /// error) `cancelled`, through `on_event` as usual.
    fn cancel(&mut self);
    /// A fresh request id, unique across restarts (`serial-…`).
    fn new_id(&mut self) -> String;
    /// The name of this port as a queue source (the queue is fair between sources).
    fn source(&self) -> &str;
    fn status(&self) -> StatusView;
    /// Names of the sessions in the state directory (the console's `sessions`).
    fn sessions(&self) -> Vec<String>;
    /// The daemon's last log lines, oldest first (the console's `log`).
    fn log_tail(&self, lines: usize) -> Vec<String>;
    /// The clock (retransmission timers).
    fn now(&self) -> Instant;
    fn count(&mut self, c: Count);
}

/// A protocol core. No call blocks or does I/O.
pub trait Core: Send {
    /// Bytes read from the port (any split: one byte, a burst, half a frame).
    fn on_bytes(&mut self, bytes: &[u8], env: &mut dyn Env);
    /// An event of the request this core submitted.
    fn on_event(&mut self, ev: Event, env: &mut dyn Env);
    /// When the core next wants [`Core::on_tick`] (a retransmission timer), if ever.
    fn deadline(&self) -> Option<Instant> {
        None
    }
    fn on_tick(&mut self, _env: &mut dyn Env) {}
    /// The port was opened (at start, or again after it went away): a half-read line or
    /// frame is gone, and a console greets with its prompt.
    fn on_open(&mut self, _env: &mut dyn Env) {}
}

/// An `Env` in memory for tests of the cores (and the fuzz targets):
/// written bytes collect in `out`, submitted requests in `submitted`. A request the service
/// would refuse at submission ([`crate::service::check`]) is refused the same way.
#[derive(Default)]
pub struct MemEnv {
    pub out: Vec<u8>,
    pub submitted: Vec<Request>,
    /// What the core refused itself ([`Env::refused`]).
    pub refusals: Vec<Refusal>,
    /// Refuse the next submissions with this error.
    pub refuse: Option<ServiceError>,
    pub cancels: usize,
    pub status: StatusView,
    pub sessions: Vec<String>,
    pub log: Vec<String>,
    pub counts: Vec<Count>,
    pub clock: Option<Instant>,
    next_id: u64,
}

impl MemEnv {
    /// What was written since the last call, as text (lossy), and clears it.
    pub fn take(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.out).into_owned();
        self.out.clear();
        s
    }
}

impl Env for MemEnv {
    fn write(&mut self, bytes: &[u8]) {
        self.out.extend_from_slice(bytes);
    }
    fn submit(&mut self, req: Request) -> Result<(), ServiceError> {
        if let Some(e) = &self.refuse {
            return Err(e.clone());
        }
        // What the service refuses at submission, it refuses here too.
        crate::service::check(&req)?;
        self.submitted.push(req);
        Ok(())
    }
    fn refused(&mut self, r: Refusal) {
        self.refusals.push(r);
    }
    fn cancel(&mut self) {
        self.cancels += 1;
    }
    fn new_id(&mut self) -> String {
        self.next_id += 1;
        format!("serial-test-{}", self.next_id)
    }
    fn source(&self) -> &str {
        "serial:test"
    }
    fn status(&self) -> StatusView {
        self.status.clone()
    }
    fn sessions(&self) -> Vec<String> {
        self.sessions.clone()
    }
    fn log_tail(&self, lines: usize) -> Vec<String> {
        let n = self.log.len().saturating_sub(lines);
        self.log[n..].to_vec()
    }
    fn now(&self) -> Instant {
        self.clock.unwrap_or_else(Instant::now)
    }
    fn count(&mut self, c: Count) {
        self.counts.push(c);
    }
}
