//! `edgellm bench --bandwidth`: the machine's read bandwidth, measured in the same run as the
//! speeds, for the bound of decoding: (bandwidth) / (weight bytes read per token).

use edgellm::model::advise_huge_pages;
use std::hint::black_box;
use std::time::Instant;

/// Bytes the probe reads: far beyond any cache.
const PROBE_BYTES: usize = 256 << 20;
/// Passes per probe; the fastest counts (on a shared machine a pass can land in someone
/// else's burst of traffic).
const PASSES: usize = 5;

/// A sum of every u64 of the buffer: a loop the compiler vectorises into plain streaming loads.
#[inline(never)]
fn read_sum(buf: &[u64]) -> u64 {
    buf.iter().fold(0u64, |a, &x| a.wrapping_add(x))
}

/// Read bandwidth in bytes/s on `threads` threads, each summing its share of a 256 MiB buffer
/// that lies on huge pages where the kernel gives them, as the packed weights do (on 4 KiB
/// pages the probe would measure TLB misses as much as memory, and understate the bound).
pub fn read_bandwidth(threads: usize) -> f64 {
    let n = PROBE_BYTES / 8;
    let mut buf: Vec<u64> = Vec::with_capacity(n);
    advise_huge_pages(buf.spare_capacity_mut());
    // Non-zero contents: a zeroed buffer would map the shared zero page and read from cache.
    buf.extend((0..n as u64).map(|i| i ^ 0x5555));
    let chunk = n.div_ceil(threads.max(1));
    let mut best = f64::INFINITY;
    for _ in 0..PASSES {
        let t0 = Instant::now();
        std::thread::scope(|s| {
            for part in buf.chunks(chunk) {
                s.spawn(move || black_box(read_sum(black_box(part))));
            }
        });
        best = best.min(t0.elapsed().as_secs_f64());
    }
    PROBE_BYTES as f64 / best
}
