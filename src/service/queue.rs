//! The bounded request queue, fair between sources: one FIFO per source, served round-robin,
//! so a PLC that sends a burst cannot starve a technician's console. A pure structure (no
//! locks, no I/O); the worker wraps it in a mutex and a condition variable.

use std::collections::VecDeque;

/// Why a job was not queued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Full {
    /// Every slot is taken.
    Queue { capacity: usize },
    /// This source already holds its share of the slots.
    Source { per_source: usize },
}

/// Jobs waiting for the worker, at most `capacity` in all and `per_source` from one source.
#[derive(Debug)]
pub struct FairQueue<T> {
    capacity: usize,
    per_source: usize,
    len: usize,
    /// Sources with waiting jobs, in the order they are served next.
    sources: VecDeque<(String, VecDeque<T>)>,
}

impl<T> FairQueue<T> {
    /// `capacity` ≥ 1 jobs in all; `per_source` is clamped to `1..=capacity`.
    pub fn new(capacity: usize, per_source: usize) -> FairQueue<T> {
        let capacity = capacity.max(1);
        FairQueue {
            capacity,
            per_source: per_source.clamp(1, capacity),
            len: 0,
            sources: VecDeque::with_capacity(capacity),
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// New bounds (a reload). Jobs already queued stay, even past them: nothing accepted is
    /// dropped; new ones are refused until the queue is back under.
    pub fn set_bounds(&mut self, capacity: usize, per_source: usize) {
        self.capacity = capacity.max(1);
        self.per_source = per_source.clamp(1, self.capacity);
    }

    /// Queues `job` behind the other jobs of `source`, or says why it cannot.
    pub fn push(&mut self, source: &str, job: T) -> Result<(), (Full, T)> {
        if self.len >= self.capacity {
            let capacity = self.capacity;
            return Err((Full::Queue { capacity }, job));
        }
        match self.sources.iter_mut().find(|(s, _)| s == source) {
            Some((_, q)) if q.len() >= self.per_source => {
                let per_source = self.per_source;
                return Err((Full::Source { per_source }, job));
            }
            Some((_, q)) => q.push_back(job),
            None => self
                .sources
                .push_back((source.to_owned(), VecDeque::from([job]))),
        }
        self.len += 1;
        Ok(())
    }

    /// The next job: the oldest of the source whose turn it is; that source then goes to the
    /// back of the line.
    pub fn pop(&mut self) -> Option<T> {
        let (source, mut q) = self.sources.pop_front()?;
        let job = q.pop_front();
        if !q.is_empty() {
            self.sources.push_back((source, q));
        }
        self.len -= 1;
        job
    }

    /// Removes and returns the first waiting job that `pred` picks (a cancelled one).
    pub fn remove_first(&mut self, mut pred: impl FnMut(&T) -> bool) -> Option<T> {
        let (si, ji) = self
            .sources
            .iter()
            .enumerate()
            .find_map(|(si, (_, q))| q.iter().position(&mut pred).map(|ji| (si, ji)))?;
        let q = &mut self.sources[si].1;
        let job = q.remove(ji);
        if q.is_empty() {
            self.sources.remove(si);
        }
        self.len -= 1;
        job
    }

    /// Every waiting job, in no particular order (when the service stops).
    pub fn drain(&mut self) -> impl Iterator<Item = T> + '_ {
        self.len = 0;
        self.sources.drain(..).flat_map(|(_, q)| q)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_take_turns_whatever_order_their_jobs_came_in() {
        let mut q = FairQueue::new(8, 8);
        for j in ["plc1", "plc2", "plc3"] {
            q.push("plc", j).unwrap();
        }
        q.push("console", "c1").unwrap();
        q.push("console", "c2").unwrap();
        q.push("mqtt", "m1").unwrap();
        let order: Vec<_> = std::iter::from_fn(|| q.pop()).collect();
        assert_eq!(order, ["plc1", "c1", "m1", "plc2", "c2", "plc3"]);
        assert!(q.is_empty());
    }

    #[test]
    fn smaller_bounds_keep_what_is_queued_and_refuse_until_back_under() {
        let mut q = FairQueue::new(4, 4);
        for j in 1..=4 {
            q.push("a", j).unwrap();
        }
        q.set_bounds(2, 8);
        assert_eq!(q.len(), 4);
        assert_eq!(q.push("b", 5), Err((Full::Queue { capacity: 2 }, 5)));
        let popped: Vec<_> = std::iter::from_fn(|| q.pop()).take(3).collect();
        assert_eq!(popped, [1, 2, 3]);
        // per_source was clamped to the new capacity.
        q.push("b", 5).unwrap();
        assert_eq!(q.push("b", 6), Err((Full::Queue { capacity: 2 }, 6)));
        q.set_bounds(8, 1);
        assert_eq!(q.push("b", 6), Err((Full::Source { per_source: 1 }, 6)));
        q.push("c", 7).unwrap();
    }

    #[test]
    fn a_full_queue_and_a_greedy_source_are_refused_at_once() {
        let mut q = FairQueue::new(3, 2);
        q.push("a", 1).unwrap();
        q.push("a", 2).unwrap();
        assert_eq!(q.push("a", 3), Err((Full::Source { per_source: 2 }, 3)));
        q.push("b", 4).unwrap();
        assert_eq!(q.push("c", 5), Err((Full::Queue { capacity: 3 }, 5)));
        assert_eq!(q.len(), 3);
        assert_eq!(q.pop(), Some(1));
        q.push("c", 5).unwrap();
        assert_eq!(q.len(), 3);
    }

    #[test]
    fn a_removed_job_frees_its_slot_and_keeps_the_others_in_order() {
        let mut q = FairQueue::new(4, 4);
        for (s, j) in [("a", 1), ("b", 2), ("a", 3), ("b", 4)] {
            q.push(s, j).unwrap();
        }
        assert_eq!(q.remove_first(|&j| j == 2), Some(2));
        assert_eq!(q.remove_first(|&j| j == 9), None);
        assert_eq!(q.remove_first(|&j| j == 4), Some(4));
        assert_eq!(q.len(), 2);
        assert_eq!([q.pop(), q.pop(), q.pop()], [Some(1), Some(3), None]);
        q.push("c", 7).unwrap();
        let mut rest: Vec<_> = q.drain().collect();
        rest.sort();
        assert_eq!((rest, q.len()), (vec![7], 0));
    }
}
