//! A persistent worker pool with cheap hand-offs, for the matrix products of one token.
//!
//! Decoding one token of a 30-layer model runs ~210 parallel sections, each a few
//! microseconds long, so a condvar wake-up per section (5–20 µs) would cost more than the work.
//! Workers therefore spin on a generation counter for a short while after each section and only
//! then park; the caller runs its own share (thread 0) and spins until the others are done.
//!
//! Determinism is not the pool's business: callers split work by a fixed rule ([`split`]) and
//! every row is computed whole by one thread with the same kernel, so the result does not depend
//! on the thread count.

use std::ops::Range;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Most threads a pool runs (bounds the on-stack bookkeeping of [`Pool::run_split`]).
pub const MAX_THREADS: usize = 64;

/// How long an idle worker spins before parking: long enough to bridge the gap between two
/// matrix products (a norm, a quantization), short enough not to burn a core between requests.
const SPIN: Duration = Duration::from_micros(200);

type JobFn<'a> = dyn Fn(usize) + Sync + 'a;

/// The job hand-off slot: a thin pointer to a fat `&dyn Fn` that lives on the caller's stack.
struct Job<'a> {
    f: &'a JobFn<'a>,
}

struct Shared {
    /// Bumped by the caller for every section (and at shutdown).
    generation: AtomicUsize,
    /// Points at a `Job` on the caller's stack while a section runs.
    job: AtomicPtr<Job<'static>>,
    /// Workers that have not finished the current section.
    pending: AtomicUsize,
    panicked: AtomicBool,
    shutdown: AtomicBool,
    /// Workers parked (or about to park) on `wake`.
    sleeping: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
}

/// A fixed set of worker threads, created once at load.
pub struct Pool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
}

/// The contiguous part of `0..n` that thread `tid` of `nth` takes: the first `n % nth` threads
/// take one more item. A pure function, so every caller splits the same way.
pub fn split(n: usize, nth: usize, tid: usize) -> Range<usize> {
    let base = n / nth;
    let extra = n % nth;
    let start = tid * base + tid.min(extra);
    let len = base + usize::from(tid < extra);
    start..start + len
}

impl Pool {
    /// Starts `n_threads - 1` workers (the caller is thread 0). `n_threads` is clamped to
    /// `1..=MAX_THREADS`.
    pub fn new(n_threads: usize) -> std::io::Result<Pool> {
        let n = n_threads.clamp(1, MAX_THREADS);
        let shared = Arc::new(Shared {
            generation: AtomicUsize::new(0),
            job: AtomicPtr::new(std::ptr::null_mut()),
            pending: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            shutdown: AtomicBool::new(false),
            sleeping: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
        });
        let mut workers = Vec::with_capacity(n - 1);
        for tid in 1..n {
            let s = Arc::clone(&shared);
            let h = std::thread::Builder::new()
                .name(format!("edgellm-w{tid}"))
                .spawn(move || worker(s, tid))?;
            workers.push(h);
        }
        Ok(Pool { shared, workers })
    }

    /// Number of threads, the caller included.
    pub fn n_threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Runs `f(tid)` on every thread (`tid` in `0..n_threads`) and returns when all are done.
    /// A panic in any thread is re-raised here, after every thread has left `f`.
    pub fn run(&self, f: &(dyn Fn(usize) + Sync)) {
        if self.workers.is_empty() {
            f(0);
            return;
        }
        let s = &*self.shared;
        let job = Job { f };
        s.pending.store(self.workers.len(), Ordering::SeqCst);
        // Erasing the lifetime is sound because this function does not return (or unwind)
        // before `pending` is back to zero, i.e. before every worker has stopped using `job`.
        let ptr = (&job as *const Job<'_>).cast_mut().cast::<Job<'static>>();
        s.job.store(ptr, Ordering::SeqCst);
        s.generation.fetch_add(1, Ordering::SeqCst);
        if s.sleeping.load(Ordering::SeqCst) > 0 {
            let _g = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        let mine = catch_unwind(AssertUnwindSafe(|| f(0)));
        let mut spins = 0u32;
        while s.pending.load(Ordering::Acquire) != 0 {
            spins = spins.wrapping_add(1);
            if spins % 1024 == 0 {
                // More threads than cores: let the workers we wait for run.
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        s.job.store(std::ptr::null_mut(), Ordering::SeqCst);
        if let Err(p) = mine {
            resume_unwind(p);
        }
        if s.panicked.swap(false, Ordering::SeqCst) {
            panic!("an edgellm worker thread panicked (see the message above)");
        }
    }

    /// Splits `out` into one contiguous piece per thread along `unit`-sized items
    /// (`out.len() == n_items * unit`, items split by [`split`]) and runs
    /// `f(tid, items, piece)` on each thread with its piece. No allocation.
    pub fn run_split<T: Send>(
        &self,
        out: &mut [T],
        unit: usize,
        f: &(dyn Fn(usize, Range<usize>, &mut [T]) + Sync),
    ) {
        self.run_split_scratch(out, unit, &mut [] as &mut [T], 0, &|tid, r, piece, _| {
            f(tid, r, piece)
        });
    }

    /// As [`Pool::run_split`], and each thread also gets its own `per_thread`-long piece of
    /// `scratch` (`scratch.len() >= n_threads * per_thread`).
    pub fn run_split_scratch<T: Send, S: Send>(
        &self,
        out: &mut [T],
        unit: usize,
        scratch: &mut [S],
        per_thread: usize,
        f: &(dyn Fn(usize, Range<usize>, &mut [T], &mut [S]) + Sync),
    ) {
        assert!(
            unit > 0 && out.len() % unit == 0,
            "run_split: {} items of {unit}",
            out.len()
        );
        let n_items = out.len() / unit;
        let nth = self.n_threads();
        assert!(
            scratch.len() >= nth * per_thread,
            "run_split: scratch too small for {nth} threads"
        );
        // One uncontended mutex per thread hands each its `&mut` pieces without `unsafe`.
        let mut pieces: heapless::Vec<Mutex<(&mut [T], &mut [S])>, MAX_THREADS> =
            heapless::Vec::new();
        let (mut rest, mut srest) = (out, scratch);
        for tid in 0..nth {
            let r = split(n_items, nth, tid);
            let (head, tail) = std::mem::take(&mut rest).split_at_mut(r.len() * unit);
            let (shead, stail) = std::mem::take(&mut srest).split_at_mut(per_thread);
            (rest, srest) = (tail, stail);
            if pieces.push(Mutex::new((head, shead))).is_err() {
                unreachable!("n_threads is clamped to MAX_THREADS");
            }
        }
        self.run(&|tid| {
            let r = split(n_items, nth, tid);
            let mut guard = pieces[tid].lock().unwrap_or_else(|e| e.into_inner());
            let (piece, sc) = &mut *guard;
            f(tid, r, piece, sc);
        });
    }
}

fn worker(s: Arc<Shared>, tid: usize) {
    let mut seen = 0usize;
    loop {
        // Wait for a new generation: spin first, then park.
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            if s.generation.load(Ordering::Acquire) != seen {
                break;
            }
            spins = spins.wrapping_add(1);
            if spins % 256 == 0 && start.elapsed() > SPIN {
                s.sleeping.fetch_add(1, Ordering::SeqCst);
                let mut g = s.lock.lock().unwrap_or_else(|e| e.into_inner());
                while s.generation.load(Ordering::SeqCst) == seen {
                    g = s.wake.wait(g).unwrap_or_else(|e| e.into_inner());
                }
                drop(g);
                s.sleeping.fetch_sub(1, Ordering::SeqCst);
                break;
            }
            std::hint::spin_loop();
        }
        seen = s.generation.load(Ordering::Acquire);
        if s.shutdown.load(Ordering::Acquire) {
            return;
        }
        let ptr = s.job.load(Ordering::Acquire);
        if !ptr.is_null() {
            // SAFETY: `ptr` was stored by `Pool::run` from a live `&Job` and stays valid until
            // `pending` reaches zero, which happens only after this worker's decrement below.
            let job = unsafe { &*ptr };
            if catch_unwind(AssertUnwindSafe(|| (job.f)(tid))).is_err() {
                s.panicked.store(true, Ordering::SeqCst);
            }
        }
        s.pending.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        let s = &*self.shared;
        s.shutdown.store(true, Ordering::SeqCst);
        s.generation.fetch_add(1, Ordering::SeqCst);
        {
            let _g = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        for h in self.workers.drain(..) {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn split_covers_every_item_once_in_order() {
        for n in 0..40 {
            for nth in 1..9 {
                let mut next = 0;
                for tid in 0..nth {
                    let r = split(n, nth, tid);
                    assert_eq!(r.start, next);
                    next = r.end;
                }
                assert_eq!(next, n);
            }
        }
    }

    #[test]
    fn every_thread_runs_each_section_exactly_once() {
        let pool = Pool::new(3).unwrap();
        let hits = [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)];
        for _ in 0..2000 {
            pool.run(&|tid| {
                hits[tid].fetch_add(1, Ordering::Relaxed);
            });
        }
        // After a pause long enough for the workers to park, they still wake up.
        std::thread::sleep(Duration::from_millis(5));
        pool.run(&|tid| {
            hits[tid].fetch_add(1, Ordering::Relaxed);
        });
        for h in &hits {
            assert_eq!(h.load(Ordering::Relaxed), 2001);
        }
    }

    #[test]
    fn run_split_hands_each_thread_its_own_piece() {
        let pool = Pool::new(4).unwrap();
        let mut out = vec![0usize; 3 * 10];
        pool.run_split(&mut out, 3, &|tid, items, piece| {
            assert_eq!(piece.len(), items.len() * 3);
            for (k, v) in piece.iter_mut().enumerate() {
                *v = (items.start * 3 + k) * 10 + tid;
            }
        });
        for (i, v) in out.iter().enumerate() {
            assert_eq!(
                v / 10,
                i,
                "element {i} written by the wrong thread or twice"
            );
        }
    }

    #[test]
    fn a_panicking_worker_is_reported_and_the_pool_stays_usable() {
        let pool = Pool::new(2).unwrap();
        let r = catch_unwind(AssertUnwindSafe(|| {
            pool.run(&|tid| {
                if tid == 1 {
                    panic!("boom");
                }
            })
        }));
        assert!(r.is_err());
        let n = AtomicU64::new(0);
        pool.run(&|_| {
            n.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(n.load(Ordering::Relaxed), 2);
    }
}
