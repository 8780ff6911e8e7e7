//! `edgellm bench --bandwidth`: the machine's read bandwidth, measured in the same run as the
//! speeds, for the bound of decoding: (bandwidth) / (weight bytes read per token).

use edgellm::model::advise_huge_pages;
use std::hint::black_box;
use std::time::Instant;

/// Bytes the probe reads: far beyond any cache.
const PROBE_BYTES: usize = 256 << 20;
/// Passes of the probes before and after a thread count's runs; the fastest counts (on a
/// shared machine a pass can land in someone else's burst of traffic).
pub const PASSES: usize = 5;
/// Passes of the probes between tg runs (each run is paired with the ones on either side).
pub const PAIR_PASSES: usize = 2;

/// A sum of every u64 of the buffer: a loop the compiler vectorises into plain streaming loads.
#[inline(never)]
fn read_sum(buf: &[u64]) -> u64 {
    buf.iter().fold(0u64, |a, &x| a.wrapping_add(x))
}

/// A 256 MiB buffer to read, on huge pages where the kernel gives them, as the packed weights
/// are (on 4 KiB pages the probe would measure TLB misses as much as memory, and understate
/// the bound). Filled once, probed as often as needed.
pub struct Probe {
    buf: Vec<u64>,
}

impl Probe {
    pub fn new() -> Probe {
        let n = PROBE_BYTES / 8;
        let mut buf: Vec<u64> = Vec::with_capacity(n);
        advise_huge_pages(buf.spare_capacity_mut());
        // Non-zero contents: a zeroed buffer would map the shared zero page and read from cache.
        buf.extend((0..n as u64).map(|i| i ^ 0x5555));
        Probe { buf }
    }

    /// Read bandwidth in bytes/s on `threads` threads, each summing its share of the buffer:
    /// the fastest of `passes` passes.
    pub fn read_bandwidth(&self, threads: usize, passes: usize) -> f64 {
        let chunk = self.buf.len().div_ceil(threads.max(1));
        let mut best = f64::INFINITY;
        for _ in 0..passes.max(1) {
            let t0 = Instant::now();
            std::thread::scope(|s| {
                for part in self.buf.chunks(chunk) {
                    s.spawn(move || black_box(read_sum(black_box(part))));
                }
            });
            best = best.min(t0.elapsed().as_secs_f64());
        }
        PROBE_BYTES as f64 / best
    }
}

/// Each tg run's share of the bound measured around it: run `i` against the better of the
/// probes just before (`bw[i]`) and after it (`bw[i + 1]`). `weight_bytes` per token.
pub fn paired_shares(tg: &[f64], bw: &[f64], weight_bytes: f64) -> Vec<f64> {
    tg.iter()
        .zip(bw.windows(2))
        .map(|(t, w)| t / (w[0].max(w[1]) / weight_bytes))
        .collect()
}

/// The median (mean of the middle two for an even count); `None` for no values.
pub fn median(v: &[f64]) -> Option<f64> {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    match n {
        0 => None,
        _ if !n.is_multiple_of(2) => Some(s[n / 2]),
        _ => Some((s[n / 2 - 1] + s[n / 2]) / 2.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_run_meets_the_better_probe_beside_it() {
        // 100 bytes per token; probes 1000, 2000, 500 B/s: bounds 10, 20, 5 t/s.
        let s = paired_shares(&[10.0, 10.0], &[1000.0, 2000.0, 500.0], 100.0);
        assert_eq!(s, vec![0.5, 0.5]);
        // A missing probe after the last run leaves that run out.
        assert_eq!(
            paired_shares(&[4.0, 4.0], &[1000.0, 800.0], 100.0),
            vec![0.4]
        );
    }

    #[test]
    fn median_of_odd_even_and_none() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[]), None);
    }
}
