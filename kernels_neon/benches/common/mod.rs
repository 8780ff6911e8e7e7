//! Shared by the `kernels` (criterion) and `summary` benches: test data, the SmolLM2-135M
//! shapes, the "cold" weight sets, the memory-bandwidth probe and (feature `tract-peer`) the
//! tract-linalg Q4_0 peer.
#![allow(dead_code)]

#[cfg(feature = "tract-peer")]
pub mod tract_peer;

use kernels_neon::BlockFormat;
use std::hint::black_box;
use std::time::{Duration, Instant};

/// SmolLM2-135M's matrix-vector shapes as `(rows, cols)` (= outputs, inputs), with the layer
/// they stand for. Hidden 576, FFN 1536, vocabulary 49152 (the tied embedding is the LM head).
pub const MATVEC_SHAPES: [(usize, usize, &str); 3] = [
    (1536, 576, "ffn gate/up 576->1536"),
    (576, 1536, "ffn down 1536->576"),
    (49152, 576, "lm_head 576->49152"),
];

/// Prompt batch for the matmul benches.
pub const MATMUL_TOKENS: usize = 64;
pub const MATMUL_SHAPE: (usize, usize) = (1536, 576);

/// Total size of a "cold" weight set: distinct copies of one matrix, cycled so that each call
/// reads data that the previous calls have pushed out of the caches. 128 MiB is 4x this
/// machine's 32 MiB L3 (an EPYC VM) and 40-250x the L2/L3 of the boards edgellm targets, so
/// even a non-LRU replacement policy keeps few lines; the hot small shapes (0.5 MB of Q4_0)
/// otherwise sit in L2 and measure the cache, not DRAM. `EDGELLM_BENCH_COLD_MB` overrides it
/// (e.g. on a 1 GB board).
pub fn cold_bytes() -> usize {
    std::env::var("EDGELLM_BENCH_COLD_MB")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .unwrap_or(128)
        << 20
}

/// Size of the memory-bandwidth probe's buffer: far larger than any cache.
pub const MEMBW_BYTES: usize = 256 << 20;

// Test data: the same generators as the tests', so benches and tests see the same inputs.
#[path = "../../tests/common.rs"]
mod data;
#[allow(unused_imports)] // each bench binary uses its own subset
pub use data::{Rng, f16_vec, f32_vec, quant};

pub fn dequant<B: BlockFormat>(x: &[B]) -> Vec<f32> {
    let mut y = vec![0.0; x.len() * B::BLOCK_LEN];
    B::dequantize_row(x, &mut y);
    y
}

/// A `rows x cols` weight matrix of weight-like values (sigma 0.05), row by row so that the
/// 49152-row LM head does not need its f32 form in memory at once.
pub fn weight_matrix<W: BlockFormat>(rows: usize, cols: usize, seed: u64) -> Vec<W> {
    let nb = cols / W::BLOCK_LEN;
    let mut w = vec![W::default(); rows * nb];
    let mut r = Rng::new(seed);
    let mut row = vec![0.0f32; cols];
    for out in w.chunks_exact_mut(nb) {
        row.iter_mut().for_each(|v| *v = r.normal(0.05));
        W::quantize_row_ref(&row, out);
    }
    w
}

/// Bytes of a slice of blocks (what a matvec streams).
pub fn bytes_of<T>(x: &[T]) -> usize {
    std::mem::size_of_val(x)
}

/// Distinct copies of one weight matrix adding up to at least [`cold_bytes`] (and at least
/// two), so that cycling through them makes every call read weights from DRAM.
pub struct ColdSet<T> {
    pub copies: Vec<Vec<T>>,
    next: usize,
}

impl<T: Clone> ColdSet<T> {
    pub fn new(w: &[T]) -> Self {
        Self::with_total(w, cold_bytes())
    }
    /// Copies of `w` adding up to at least `total` bytes.
    pub fn with_total(w: &[T], total: usize) -> Self {
        let n = copies_for(bytes_of(w), total);
        ColdSet {
            copies: (0..n).map(|_| w.to_vec()).collect(),
            next: 0,
        }
    }
    /// The next copy, round-robin.
    #[inline]
    pub fn next(&mut self) -> &[T] {
        let i = self.next;
        self.next = if i + 1 == self.copies.len() { 0 } else { i + 1 };
        &self.copies[i]
    }
    pub fn total_bytes(&self) -> usize {
        self.copies.iter().map(|c| bytes_of(c)).sum()
    }
}

/// How many copies of `bytes` make at least `total` (and at least two).
pub fn copies_for(bytes: usize, total: usize) -> usize {
    total.div_ceil(bytes.max(1)).max(2)
}

/// The memory-bandwidth probe's buffer: non-zero (a `vec![0; n]` would map the zero page and
/// read from cache).
pub fn membw_buffer(bytes: usize) -> Vec<u64> {
    (0..bytes / 8).map(|i| i as u64 ^ 0x5555).collect()
}

/// Reads every element once: a plain loop the compiler vectorises (integer adds reassociate).
#[inline(never)]
pub fn read_sum(buf: &[u64]) -> u64 {
    buf.iter().fold(0u64, |a, &x| a.wrapping_add(x))
}

/// Read bandwidth in bytes/s: best of `passes` over `buf`, split over `threads` threads.
pub fn measure_read_bandwidth(buf: &[u64], threads: usize, passes: usize) -> f64 {
    let threads = threads.max(1);
    let chunk = buf.len().div_ceil(threads);
    let mut best = f64::INFINITY;
    for _ in 0..passes {
        let t = Instant::now();
        if threads == 1 {
            black_box(read_sum(black_box(buf)));
        } else {
            std::thread::scope(|s| {
                for part in buf.chunks(chunk) {
                    s.spawn(move || black_box(read_sum(black_box(part))));
                }
            });
        }
        best = best.min(t.elapsed().as_secs_f64());
    }
    bytes_of(buf) as f64 / best
}

/// Seconds per call of `f`: calls are grouped into rounds of about `round` each (at least one
/// call), and the fastest round of `rounds` wins. The best round is the most repeatable
/// figure on a shared machine; the memory-bandwidth probe is taken the same way, so their
/// ratio compares like with like.
pub fn time_per_call(mut f: impl FnMut(), rounds: usize, round: Duration) -> f64 {
    // Warm up, and size a round.
    let t = Instant::now();
    f();
    f();
    let one = (t.elapsed().as_secs_f64() / 2.0).max(1e-9);
    let n = ((round.as_secs_f64() / one) as usize).clamp(1, 1_000_000);
    let mut best = f64::INFINITY;
    for _ in 0..rounds {
        let t = Instant::now();
        for _ in 0..n {
            f();
        }
        best = best.min(t.elapsed().as_secs_f64() / n as f64);
    }
    best
}

/// `||a - b||_2 / ||b||_2`.
pub fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (&x, &y) in a.iter().zip(b) {
        num += ((x - y) as f64).powi(2);
        den += (y as f64).powi(2);
    }
    (num / den.max(1e-300)).sqrt()
}

/// `out[r] = sum_c w[r][c] * x[c]` in f64 over the dequantized weights: the exact product the
/// peer (f32 activations) should reproduce.
pub fn matvec_exact<W: BlockFormat>(w: &[W], x: &[f32]) -> Vec<f32> {
    let nb = x.len() / W::BLOCK_LEN;
    let mut row = vec![0.0f32; x.len()];
    w.chunks_exact(nb)
        .map(|r| {
            W::dequantize_row(r, &mut row);
            row.iter()
                .zip(x)
                .map(|(&a, &b)| a as f64 * b as f64)
                .sum::<f64>() as f32
        })
        .collect()
}
