//! Requests refused before they reach the queue — an id or a prompt that fails the service's
//! checks, a session name a front end cannot use, a bound a front end holds — told to the
//! worker, which records them in the audit trail as it records the requests it ends.
//!
//! A front end answers a refusal at once; its record follows within a decoding step. What
//! arrives is untrusted and may come in a flood, so the inbox is bounded twice: in count
//! ([`MAX_PENDING`], while a long answer keeps the worker from recording) and in rate
//! ([`PER_SECOND`], so that a sender looping on a bad request cannot wear the flash or push
//! the answers out of the trail's rotation). What the bounds drop is counted, never lost
//! silently. `busy` is not recorded: it is load, not a request's fault, and is counted in the
//! status.

use super::ServiceError;
use std::time::{Duration, Instant};

/// Most refusals waiting to be recorded.
pub const MAX_PENDING: usize = 64;
/// Most refusals recorded in one second.
pub const PER_SECOND: u32 = 16;

/// A request a front end, or [`Handle::submit`](super::Handle::submit), refused.
#[derive(Clone, Debug, PartialEq)]
pub struct Refusal {
    /// The request's id as sent (at most [`MAX_ID_LEN`](super::MAX_ID_LEN) bytes of it).
    pub id: String,
    /// Who sent it, as a request's source.
    pub source: String,
    /// The session it named, as sent (at most 64 bytes of it), even when that name is what
    /// was refused.
    pub session: Option<String>,
    pub error: ServiceError,
}

impl Refusal {
    pub fn new(id: &str, source: &str, error: ServiceError) -> Refusal {
        let error = ServiceError::new(error.code, prefix(&error.message, 1024));
        Refusal {
            id: prefix(id, super::MAX_ID_LEN),
            source: prefix(source, 256),
            session: None,
            error,
        }
    }

    /// The session name the request gave, if any (none when it was empty).
    pub fn with_session(mut self, name: Option<&str>) -> Refusal {
        self.session = name
            .filter(|n| !n.is_empty())
            .map(|n| prefix(n, crate::engine::store::MAX_ID_LEN));
        self
    }
}

/// At most `max` bytes of `s`, cut at a character boundary.
fn prefix(s: &str, max: usize) -> String {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}

/// Refusals waiting for the worker.
#[derive(Debug, Default)]
pub(super) struct Inbox {
    pending: Vec<Refusal>,
    /// The current one-second window and how many refusals it took.
    window: Option<Instant>,
    taken: u32,
}

impl Inbox {
    /// Keeps `r` for the worker; `false` when a bound drops it.
    pub(super) fn push(&mut self, r: Refusal, now: Instant) -> bool {
        if self
            .window
            .is_none_or(|w| now.saturating_duration_since(w) >= Duration::from_secs(1))
        {
            self.window = Some(now);
            self.taken = 0;
        }
        if self.taken >= PER_SECOND || self.pending.len() >= MAX_PENDING {
            return false;
        }
        self.taken += 1;
        self.pending.push(r);
        true
    }

    pub(super) fn take(&mut self) -> Vec<Refusal> {
        std::mem::take(&mut self.pending)
    }

    pub(super) fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::service::ErrorCode;

    fn refusal(i: usize) -> Refusal {
        let e = ServiceError::new(ErrorCode::BadRequest, "no");
        Refusal::new(&format!("r{i}"), "test", e)
    }

    #[test]
    fn a_flood_is_recorded_at_the_rate_and_the_rest_dropped() {
        let mut inbox = Inbox::default();
        let t0 = Instant::now();
        let kept = (0..100).filter(|&i| inbox.push(refusal(i), t0)).count();
        assert_eq!(kept, PER_SECOND as usize);
        let ids: Vec<String> = inbox.take().into_iter().map(|r| r.id).collect();
        assert_eq!(ids[0], "r0");
        assert_eq!(ids.len(), PER_SECOND as usize);
        // The next second takes as many again.
        let t1 = t0 + Duration::from_millis(1000);
        let kept = (0..100).filter(|&i| inbox.push(refusal(i), t1)).count();
        assert_eq!(kept, PER_SECOND as usize);
    }

    #[test]
    fn a_worker_that_does_not_record_holds_at_most_max_pending() {
        let mut inbox = Inbox::default();
        let t0 = Instant::now();
        let mut kept = 0;
        for s in 0..20u64 {
            let now = t0 + Duration::from_secs(s);
            kept += (0..PER_SECOND as usize)
                .filter(|&i| inbox.push(refusal(i), now))
                .count();
        }
        assert_eq!(kept, MAX_PENDING);
        assert_eq!(inbox.take().len(), MAX_PENDING);
        assert!(inbox.is_empty());
    }

    #[test]
    fn hostile_ids_and_names_are_kept_short_and_whole_characters() {
        let e = ServiceError::new(ErrorCode::BadRequest, "no");
        let r = Refusal::new(&"é".repeat(1000), "s", e).with_session(Some(&"ü".repeat(1000)));
        assert!(r.id.len() <= crate::service::MAX_ID_LEN && r.id.len() >= 126);
        assert!(r.id.chars().all(|c| c == 'é'));
        let s = r.session.unwrap();
        assert!(s.len() <= 64 && s.chars().all(|c| c == 'ü'));
    }
}
