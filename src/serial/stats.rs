//! A port's state and counters, shared between its driver and the daemon's status.

use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// Where a port is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PortState {
    /// Not opened yet.
    Starting,
    Open,
    /// It went away (or never opened): trying again with backoff.
    Reopening,
}

/// What a port did since start. Protocol cores count their own errors through
/// [`core::Env::count`](super::core::Env::count).
#[derive(Debug, Default)]
pub struct Counters {
    pub rx_bytes: AtomicU64,
    pub tx_bytes: AtomicU64,
    /// Requests handed to the service.
    pub requests: AtomicU64,
    /// Lines or frames refused: too long, invalid UTF-8, unknown command, garbage.
    pub bad_input: AtomicU64,
    /// Wrong line checksums, frame CRCs, Modbus RTU CRCs.
    pub checksum_errors: AtomicU64,
    /// Answer frames sent again for want of an ACK.
    pub retransmits: AtomicU64,
    /// Repeated requests answered from the cache instead of being computed again.
    pub duplicates: AtomicU64,
    /// Times the port was opened again after it went away.
    pub reopens: AtomicU64,
}

/// Which counter a core bumps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Count {
    Requests,
    BadInput,
    Checksum,
    Retransmit,
    Duplicate,
}

/// Called after a port's state changed (the daemon republishes its status).
pub type Observer = Arc<dyn Fn() + Send + Sync>;

/// One port's status: written by its driver, read by the status publisher.
pub struct PortStats {
    pub path: String,
    pub mode: &'static str,
    state: Mutex<(PortState, Option<String>)>,
    pub counters: Counters,
    observer: OnceLock<Observer>,
}

impl PortStats {
    pub fn new(path: impl Into<String>, mode: &'static str) -> PortStats {
        PortStats {
            path: path.into(),
            mode,
            state: Mutex::new((PortState::Starting, None)),
            counters: Counters::default(),
            observer: OnceLock::new(),
        }
    }

    /// Calls `f` after each change of state (once set, for good).
    pub fn observe(&self, f: Observer) {
        let _ = self.observer.set(f);
    }

    /// The port's state and its last error (kept after a reopen, until the next one).
    pub fn state(&self) -> (PortState, Option<String>) {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn set_state(&self, s: PortState, error: Option<String>) {
        let mut g = self.state.lock().unwrap_or_else(|p| p.into_inner());
        g.0 = s;
        if error.is_some() {
            g.1 = error;
        }
        drop(g);
        if let Some(f) = self.observer.get() {
            f();
        }
    }

    pub fn bump(&self, c: Count) {
        let k = &self.counters;
        let a = match c {
            Count::Requests => &k.requests,
            Count::BadInput => &k.bad_input,
            Count::Checksum => &k.checksum_errors,
            Count::Retransmit => &k.retransmits,
            Count::Duplicate => &k.duplicates,
        };
        a.fetch_add(1, Ordering::Relaxed);
    }

    /// The port in the daemon's status JSON.
    pub fn json(&self) -> serde_json::Value {
        let (state, error) = self.state();
        let k = &self.counters;
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
        serde_json::json!({
            "path": self.path,
            "mode": self.mode,
            "state": state,
            "last_error": error,
            "rx_bytes": n(&k.rx_bytes),
            "tx_bytes": n(&k.tx_bytes),
            "requests": n(&k.requests),
            "bad_input": n(&k.bad_input),
            "checksum_errors": n(&k.checksum_errors),
            "retransmits": n(&k.retransmits),
            "duplicates": n(&k.duplicates),
            "reopens": n(&k.reopens),
        })
    }
}
