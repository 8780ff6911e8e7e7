//! Static shapes: once the engine and a session exist, processing prompt chunks and decoding
//! tokens allocates nothing. A counting global allocator proves it.

use edgellm::engine::{Engine, EngineConfig, GenParams, Sampler, SamplingParams};
use edgellm::kv::KvType;
use edgellm::model::synth::{SynthSpec, synth_model};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn count<R>(f: impl FnOnce() -> R) -> (R, usize) {
    ALLOCS.store(0, Ordering::SeqCst);
    COUNTING.store(true, Ordering::SeqCst);
    let r = f();
    COUNTING.store(false, Ordering::SeqCst);
    (r, ALLOCS.load(Ordering::SeqCst))
}

// A plain `main` (harness = false in Cargo.toml): the counter is global, and libtest's own
// threads (its main thread times the running test) allocate now and then, which made this test
// fail on a busy machine. Here only the engine's threads run while counting.
fn main() {
    prompt_chunks_and_decoding_allocate_nothing();
    println!(
        "no_alloc: prompt chunks, decoding (one session and several in a step) and generate \
         allocate nothing (1 and 2 threads)"
    );
}

fn prompt_chunks_and_decoding_allocate_nothing() {
    for threads in [1, 2] {
        let spec = SynthSpec::default();
        let model = Arc::new(synth_model(&spec));
        let cfg = EngineConfig {
            n_ctx: 128,
            chunk: 16,
            threads,
            kv_type: KvType::F16,
            max_batch: 4,
        };
        let mut e = Engine::new(model, cfg).unwrap();
        let prompt: Vec<u32> = (0..40).map(|i| (i * 7 % 300) as u32).collect();
        // Warm-up: worker threads make their one-time thread-local allocations on first use.
        let mut warm = e.new_session();
        e.feed(&mut warm, &prompt[..20]).unwrap();
        e.feed(&mut warm, &[1]).unwrap();

        let mut s = e.new_session();

        let (_, n) = count(|| {
            e.feed(&mut s, &prompt).unwrap();
        });
        assert_eq!(
            n, 0,
            "{threads} threads: processing a 40-token prompt in chunks allocated {n} times"
        );
        let (_, n) = count(|| {
            for t in 0..30u32 {
                e.feed(&mut s, &[t + 3]).unwrap();
            }
        });
        assert_eq!(
            n, 0,
            "{threads} threads: decoding 30 tokens allocated {n} times"
        );

        // Steps over several sessions: their logits and the list of their caches are sized
        // at load (the list on the stack).
        let mut batch: Vec<_> = (0..4).map(|_| e.new_session()).collect();
        for (i, b) in batch.iter_mut().enumerate() {
            e.feed(b, &prompt[..5 + 3 * i]).unwrap();
        }
        let mut refs: Vec<_> = batch.iter_mut().collect();
        let (_, n) = count(|| {
            for t in 0..30u32 {
                e.decode(&mut refs, &[t + 3, t + 4, t + 5, t + 6]).unwrap();
                e.decode(&mut refs[1..3], &[t + 7, t + 8]).unwrap();
            }
        });
        assert_eq!(
            n, 0,
            "{threads} threads: 30 steps over 4 and 2 sessions allocated {n} times"
        );
        drop(refs);

        // Profiling on: its table is preallocated, so still nothing.
        e.set_profiling(true);
        let mut s = e.new_session();
        let (_, n) = count(|| {
            e.feed(&mut s, &prompt).unwrap();
            for t in 0..30u32 {
                e.feed(&mut s, &[t + 3]).unwrap();
            }
        });
        assert_eq!(
            n, 0,
            "{threads} threads: profiled passes allocated {n} times"
        );
        e.set_profiling(false);

        // The generate loop allocates its output once, whatever the number of tokens.
        let mut sampler = Sampler::new(
            SamplingParams {
                temperature: 0.8,
                ..Default::default()
            },
            300,
        );
        let mut run = |max_tokens| {
            let mut s = e.new_session();
            let params = GenParams {
                max_tokens,
                top_logits: 0,
            };
            count(|| {
                e.generate(
                    &mut s,
                    &prompt,
                    &params,
                    &mut sampler,
                    &|_| false,
                    &mut |_| true,
                )
                .unwrap()
            })
            .1
        };
        let short = run(2);
        let long = run(60);
        assert_eq!(
            short, long,
            "{threads} threads: allocations grow with the number of generated tokens"
        );
    }
}
