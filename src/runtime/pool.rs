//! A persistent worker pool with cheap hand-offs, for the matrix products of one token.
//!
//! Decoding one token of a 30-layer model runs ~240 parallel sections, each a few
//! microseconds long, so a condvar wake-up per section (5–20 µs) would cost more than the work.
//! Workers therefore spin on a generation counter for a short while after each section and only
//! then park.
//!
//! A section is cut into a few chunks per thread, and threads *claim* chunks from a shared
//! counter; the caller claims too, and returns when every chunk is done. So a worker the OS
//! has descheduled (more runnable threads than cores: other services on the device, a build on
//! a desk machine) costs at most the chunk it holds, instead of stalling every section until it
//! runs again; and on a big.LITTLE SoC the fast cores take more chunks than the slow ones.
//!
//! Determinism is not the pool's business: callers split work into items that are each
//! computed whole by one thread with the same kernel, so the result does not depend on which
//! thread ran which chunk, or on the thread count.

use std::ops::Range;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Most threads a pool runs (bounds the on-stack bookkeeping of [`Pool::run_split`]).
pub const MAX_THREADS: usize = 64;
/// Chunks per thread in a split section: enough that a stalled thread's share is small and
/// can be taken over, few enough that claiming stays negligible.
const CHUNKS_PER_THREAD: usize = 4;
/// The same for [`Pool::run_split_coarse`]'s sections (a prompt's matrix products): each
/// chunk of a product converts the activations' scales again and sweeps its rows over all of
/// the chunk's tokens, so there smaller chunks cost more than they save (SmolLM2, 64-token
/// chunks, 2 threads: prompt processing 1060 t/s at 4 chunks per thread, 1300 at 2).
const COARSE_CHUNKS_PER_THREAD: usize = 2;
/// Most chunks of one section.
pub const MAX_CHUNKS: usize = MAX_THREADS * CHUNKS_PER_THREAD;
const _: () = assert!(
    MAX_CHUNKS < 1 << 16,
    "chunk counts are 16-bit fields of the claim word"
);

/// How long an idle worker spins before parking: long enough to bridge the gap between two
/// matrix products (a norm, a quantization), short enough not to burn a core between requests.
const SPIN: Duration = Duration::from_micros(200);

type ChunkFn<'a> = dyn Fn(usize, usize) + Sync + 'a;

/// The job hand-off slot: a thin pointer to a fat `&dyn Fn(tid, chunk)` on the caller's stack.
struct Job<'a> {
    f: &'a ChunkFn<'a>,
}

struct Shared {
    /// Bumped by the caller for every section (and at shutdown): wakes the workers.
    generation: AtomicUsize,
    /// `section << 32 | n_chunks << 16 | next chunk`, all in one word: a thread owns a chunk
    /// by moving `next` past it with a compare-and-swap of the whole word, so a late worker
    /// can never claim (or touch the job of) a section that is over, nor mix two sections'
    /// counts.
    claim: AtomicU64,
    /// Chunks of the current section finished (or panicked).
    done: AtomicUsize,
    /// Points at a `Job` on the caller's stack while a section runs.
    job: AtomicPtr<Job<'static>>,
    panicked: AtomicBool,
    shutdown: AtomicBool,
    /// Workers parked (or about to park) on `wake`.
    sleeping: AtomicUsize,
    /// Workers that have started running.
    started: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
}

impl Shared {
    /// Claims the next chunk of section `section`, if it has one left.
    fn claim(&self, section: u32) -> Option<usize> {
        let mut cur = self.claim.load(Ordering::Acquire);
        loop {
            let next = (cur & 0xffff) as usize;
            let n = ((cur >> 16) & 0xffff) as usize;
            if (cur >> 32) as u32 != section || next >= n {
                return None;
            }
            match self.claim.compare_exchange_weak(
                cur,
                cur + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Some(next),
                Err(now) => cur = now,
            }
        }
    }

    /// Runs chunks of `section` until none is left. Only called with a claimed chunk in hand
    /// does it touch the job, which is therefore still alive.
    fn work(&self, section: u32, tid: usize) {
        while let Some(c) = self.claim(section) {
            let ptr = self.job.load(Ordering::Acquire);
            // SAFETY: `ptr` was stored by `Pool::run_chunks` for this section before it
            // published the section in `claim`, and the section cannot end (nor the `Job` on
            // its caller's stack go away) before `done` counts the chunk we hold.
            let job = unsafe { &*ptr };
            if catch_unwind(AssertUnwindSafe(|| (job.f)(tid, c))).is_err() {
                self.panicked.store(true, Ordering::SeqCst);
            }
            self.done.fetch_add(1, Ordering::AcqRel);
        }
    }
}

/// A fixed set of worker threads, created once at load.
pub struct Pool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    /// Sections started (the high half of `claim`); only the caller thread changes it.
    section: std::cell::Cell<u32>,
}

/// The contiguous part of `0..n` that part `i` of `parts` takes: the first `n % parts` parts
/// take one more item. A pure function, so every caller splits the same way.
pub fn split(n: usize, parts: usize, i: usize) -> Range<usize> {
    let base = n / parts;
    let extra = n % parts;
    let start = i * base + i.min(extra);
    let len = base + usize::from(i < extra);
    start..start + len
}

/// The work of [`Pool::run_split`]: `(thread id, items, their piece of the output)`.
pub type SplitFn<'a, T> = dyn Fn(usize, Range<usize>, &mut [T]) + Sync + 'a;
/// The work of [`Pool::run_split_scratch`]: as [`SplitFn`], and the thread's scratch.
pub type SplitScratchFn<'a, T, S> = dyn Fn(usize, Range<usize>, &mut [T], &mut [S]) + Sync + 'a;

impl Pool {
    /// Starts `n_threads - 1` workers (the caller is thread 0). `n_threads` is clamped to
    /// `1..=MAX_THREADS`.
    pub fn new(n_threads: usize) -> std::io::Result<Pool> {
        Pool::pinned(n_threads, &[])
    }

    /// As [`Pool::new`], each worker pinned to the CPUs `cpus` (all of them, not one each: the
    /// scheduler still moves a thread within the set, off a core another process holds).
    /// Empty: not pinned. A CPU this process may not run on is an error (`EINVAL`).
    pub fn pinned(n_threads: usize, cpus: &[usize]) -> std::io::Result<Pool> {
        let n = n_threads.clamp(1, MAX_THREADS);
        let set = cpu_set(cpus)?;
        let shared = Arc::new(Shared {
            generation: AtomicUsize::new(0),
            claim: AtomicU64::new(0),
            done: AtomicUsize::new(0),
            job: AtomicPtr::new(std::ptr::null_mut()),
            panicked: AtomicBool::new(false),
            shutdown: AtomicBool::new(false),
            sleeping: AtomicUsize::new(0),
            started: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
        });
        let mut workers = Vec::with_capacity(n - 1);
        let pin_error = Arc::new(Mutex::new(None::<std::io::Error>));
        for tid in 1..n {
            let s = Arc::clone(&shared);
            let err = Arc::clone(&pin_error);
            let h = std::thread::Builder::new()
                .name(format!("edgellm-w{tid}"))
                .spawn(move || {
                    if let Some(set) = set
                        && let Err(e) = pin_current(&set)
                    {
                        *err.lock().unwrap_or_else(|e| e.into_inner()) = Some(e);
                    }
                    worker(s, tid)
                })?;
            workers.push(h);
        }
        // Wait until every worker runs: a thread's start-up allocates (its name, its signal
        // stack), which must happen at load, not in the middle of the first answer (a section
        // no longer waits for a worker that has not shown up).
        while shared.started.load(Ordering::Acquire) < n - 1 {
            std::thread::yield_now();
        }
        let pool = Pool {
            shared,
            workers,
            section: std::cell::Cell::new(0),
        };
        // Dropping the pool stops the workers already started.
        if let Some(e) = pin_error.lock().unwrap_or_else(|e| e.into_inner()).take() {
            return Err(e);
        }
        Ok(pool)
    }

    /// Pins the calling thread (the pool's thread 0, which runs a share of every section) to
    /// the CPUs `cpus`; empty: does nothing.
    pub fn pin_caller(cpus: &[usize]) -> std::io::Result<()> {
        match cpu_set(cpus)? {
            Some(set) => pin_current(&set),
            None => Ok(()),
        }
    }

    /// Number of threads, the caller included.
    pub fn n_threads(&self) -> usize {
        self.workers.len() + 1
    }

    /// Runs `f(tid, chunk)` once for every `chunk` in `0..n_chunks`, each on whichever thread
    /// claims it (`tid` in `0..n_threads`, the caller is 0; a thread runs its chunks one after
    /// the other), and returns when all are done. A panic in any chunk is re-raised here,
    /// after every chunk has finished.
    pub fn run_chunks(&self, n_chunks: usize, f: &(dyn Fn(usize, usize) + Sync)) {
        assert!(n_chunks <= MAX_CHUNKS, "run_chunks: {n_chunks} chunks");
        if self.workers.is_empty() || n_chunks <= 1 {
            for c in 0..n_chunks {
                f(0, c);
            }
            return;
        }
        let s = &*self.shared;
        let job = Job { f };
        let section = self.section.get().wrapping_add(1);
        self.section.set(section);
        // Publish the job, then the section: a thread that claims a chunk of this section
        // (acquire) sees this job.
        let ptr = (&job as *const Job<'_>).cast_mut().cast::<Job<'static>>();
        s.job.store(ptr, Ordering::SeqCst);
        s.done.store(0, Ordering::SeqCst);
        s.claim.store(
            u64::from(section) << 32 | (n_chunks as u64) << 16,
            Ordering::SeqCst,
        );
        s.generation.fetch_add(1, Ordering::SeqCst);
        if s.sleeping.load(Ordering::SeqCst) > 0 {
            let _g = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        // Our own share, claimed like the workers'; a panic is held until the others are done.
        let mut mine = Ok(());
        while let Some(c) = s.claim(section) {
            let r = catch_unwind(AssertUnwindSafe(|| f(0, c)));
            if r.is_err() && mine.is_ok() {
                mine = r;
            }
            s.done.fetch_add(1, Ordering::AcqRel);
        }
        // Every chunk is claimed; wait for those other threads still hold. The job must
        // outlive them (lifetime erased above).
        let mut spins = 0u32;
        while s.done.load(Ordering::Acquire) != n_chunks {
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(256) {
                // The holder may be descheduled: give it our core.
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

    /// Splits `out` into contiguous pieces along `unit`-sized items (`out.len() == n_items *
    /// unit`), a few per thread ([`split`] into chunks), and runs `f(tid, items, piece)` for
    /// each piece on whichever thread claims it. No allocation.
    pub fn run_split<T: Send>(&self, out: &mut [T], unit: usize, f: &SplitFn<'_, T>) {
        self.split_plain(out, unit, CHUNKS_PER_THREAD, f);
    }

    /// As [`Pool::run_split`] in fewer, larger chunks: for sections whose chunks each repeat
    /// some set-up over all of the section's input (a prompt's matrix products).
    pub fn run_split_coarse<T: Send>(&self, out: &mut [T], unit: usize, f: &SplitFn<'_, T>) {
        self.split_plain(out, unit, COARSE_CHUNKS_PER_THREAD, f);
    }

    /// [`Pool::split_in`] without scratch.
    fn split_plain<T: Send>(&self, out: &mut [T], unit: usize, chunks: usize, f: &SplitFn<'_, T>) {
        let no_scratch = &mut [] as &mut [T];
        self.split_in(out, unit, chunks, no_scratch, 0, &|tid, r, piece, _| {
            f(tid, r, piece)
        });
    }

    /// As [`Pool::run_split`], and each thread also gets its own `per_thread`-long piece of
    /// `scratch` (`scratch.len() >= n_threads * per_thread`), the same for all its chunks.
    pub fn run_split_scratch<T: Send, S: Send>(
        &self,
        out: &mut [T],
        unit: usize,
        scratch: &mut [S],
        per_thread: usize,
        f: &SplitScratchFn<'_, T, S>,
    ) {
        self.split_in(out, unit, CHUNKS_PER_THREAD, scratch, per_thread, f);
    }

    /// [`Pool::run_split_scratch`] in `chunks_per_thread` chunks per thread.
    fn split_in<T: Send, S: Send>(
        &self,
        out: &mut [T],
        unit: usize,
        chunks_per_thread: usize,
        scratch: &mut [S],
        per_thread: usize,
        f: &SplitScratchFn<'_, T, S>,
    ) {
        assert!(
            unit > 0 && out.len().is_multiple_of(unit),
            "run_split: {} items of {unit}",
            out.len()
        );
        let n_items = out.len() / unit;
        let nth = self.n_threads();
        assert!(
            scratch.len() >= nth * per_thread,
            "run_split: scratch too small for {nth} threads"
        );
        let n_chunks = if nth == 1 {
            1
        } else {
            n_items.min(nth * chunks_per_thread.clamp(1, CHUNKS_PER_THREAD))
        };
        // Uncontended mutexes hand out the `&mut` pieces without `unsafe`: one per chunk (each
        // claimed once) and one per thread's scratch (a thread runs its chunks in turn).
        let mut pieces: heapless::Vec<Mutex<&mut [T]>, MAX_CHUNKS> = heapless::Vec::new();
        let mut rest = out;
        for c in 0..n_chunks {
            let r = split(n_items, n_chunks, c);
            let (head, tail) = std::mem::take(&mut rest).split_at_mut(r.len() * unit);
            rest = tail;
            if pieces.push(Mutex::new(head)).is_err() {
                unreachable!("at most MAX_CHUNKS chunks");
            }
        }
        let mut scratches: heapless::Vec<Mutex<&mut [S]>, MAX_THREADS> = heapless::Vec::new();
        let mut srest = scratch;
        for _ in 0..nth {
            let (head, tail) = std::mem::take(&mut srest).split_at_mut(per_thread);
            srest = tail;
            if scratches.push(Mutex::new(head)).is_err() {
                unreachable!("n_threads is clamped to MAX_THREADS");
            }
        }
        self.run_chunks(n_chunks, &|tid, c| {
            let r = split(n_items, n_chunks, c);
            let mut piece = pieces[c].lock().unwrap_or_else(|e| e.into_inner());
            let mut sc = scratches[tid].lock().unwrap_or_else(|e| e.into_inner());
            f(tid, r, &mut piece, &mut sc);
        });
    }
}

/// The kernel's CPU set of `cpus`; `None` for no pinning.
fn cpu_set(cpus: &[usize]) -> std::io::Result<Option<nix::sched::CpuSet>> {
    if cpus.is_empty() {
        return Ok(None);
    }
    let mut set = nix::sched::CpuSet::new();
    for &c in cpus {
        set.set(c).map_err(|e| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("CPU {c}: {}", e.desc()),
            )
        })?;
    }
    Ok(Some(set))
}

/// Pins the calling thread (pid 0 is the caller's thread, not the whole process).
fn pin_current(set: &nix::sched::CpuSet) -> std::io::Result<()> {
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), set).map_err(|e| {
        std::io::Error::new(
            std::io::Error::from(e).kind(),
            format!("cannot pin a worker thread to its CPUs: {}", e.desc()),
        )
    })
}

fn worker(s: Arc<Shared>, tid: usize) {
    s.started.fetch_add(1, Ordering::Release);
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
            if spins.is_multiple_of(256) && start.elapsed() > SPIN {
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
        // Join the current section (if it is already over, nothing is claimed).
        let section = (s.claim.load(Ordering::Acquire) >> 32) as u32;
        s.work(section, tid);
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
    fn every_chunk_of_every_section_runs_exactly_once() {
        let pool = Pool::new(3).unwrap();
        let hits: Vec<AtomicU64> = (0..12).map(|_| AtomicU64::new(0)).collect();
        let by_thread = [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)];
        for _ in 0..2000 {
            pool.run_chunks(12, &|tid, c| {
                hits[c].fetch_add(1, Ordering::Relaxed);
                by_thread[tid].fetch_add(1, Ordering::Relaxed);
            });
        }
        // After a pause long enough for the workers to park, they still wake up.
        std::thread::sleep(Duration::from_millis(5));
        pool.run_chunks(12, &|_, c| {
            hits[c].fetch_add(1, Ordering::Relaxed);
        });
        for h in &hits {
            assert_eq!(h.load(Ordering::Relaxed), 2001);
        }
        let total: u64 = by_thread.iter().map(|t| t.load(Ordering::Relaxed)).sum();
        assert_eq!(total, 2000 * 12);
    }

    /// A worker that stalls (here: sleeps, as a descheduled thread would) holds up only the
    /// chunk it claimed; the other threads take the rest of its share.
    #[test]
    fn a_stalled_worker_does_not_hold_up_the_other_chunks() {
        let pool = Pool::new(2).unwrap();
        let by_thread = [AtomicU64::new(0), AtomicU64::new(0)];
        pool.run_chunks(40, &|tid, _| {
            if tid == 1 {
                std::thread::sleep(Duration::from_millis(50));
            }
            by_thread[tid].fetch_add(1, Ordering::Relaxed);
        });
        let (a, b) = (
            by_thread[0].load(Ordering::Relaxed),
            by_thread[1].load(Ordering::Relaxed),
        );
        assert_eq!(a + b, 40);
        assert!(b <= 2, "the stalled worker ran {b} chunks");
    }

    #[test]
    fn run_split_hands_each_thread_its_own_piece() {
        let pool = Pool::new(4).unwrap();
        let mut out = vec![0usize; 3 * 37];
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

    /// The CPUs the calling thread may run on, from the kernel.
    fn affinity_of_this_thread() -> Vec<usize> {
        let set = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)).unwrap();
        (0..nix::sched::CpuSet::count())
            .filter(|&c| set.is_set(c).unwrap_or(false))
            .collect()
    }

    #[test]
    fn pinned_workers_run_only_on_their_cpus() {
        let allowed = affinity_of_this_thread();
        let want = vec![allowed[0]];
        let pool = Pool::pinned(3, &want).unwrap();
        let seen = Mutex::new(Vec::new());
        // The caller (not pinned here) holds its first chunk until a worker has run one: on a
        // loaded machine it once took all the chunks of 200 runs before a worker woke.
        let worker_ran = std::sync::atomic::AtomicBool::new(false);
        for _ in 0..20 {
            pool.run_chunks(12, &|tid, _| {
                if tid != 0 {
                    seen.lock().unwrap().push(affinity_of_this_thread());
                    worker_ran.store(true, Ordering::Release);
                    return;
                }
                let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
                while !worker_ran.load(Ordering::Acquire) && std::time::Instant::now() < until {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
            });
        }
        let seen = seen.into_inner().unwrap();
        assert!(!seen.is_empty(), "no worker ran a chunk");
        assert!(seen.iter().all(|a| *a == want), "{seen:?} not all {want:?}");
    }

    #[test]
    fn pinning_to_a_cpu_this_machine_lacks_is_an_error() {
        let e = Pool::pinned(2, &[1023]).err().expect("pinned to CPU 1023");
        assert!(e.to_string().contains("pin"), "{e}");
        assert!(Pool::pinned(2, &[5000]).is_err(), "beyond the CPU set");
    }

    #[test]
    fn a_panicking_worker_is_reported_and_the_pool_stays_usable() {
        let pool = Pool::new(2).unwrap();
        let r = catch_unwind(AssertUnwindSafe(|| {
            pool.run_chunks(8, &|_, c| {
                if c == 5 {
                    panic!("boom");
                }
            })
        }));
        assert!(r.is_err());
        let n = AtomicU64::new(0);
        pool.run_chunks(8, &|_, _| {
            n.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(n.load(Ordering::Relaxed), 8);
    }
}
