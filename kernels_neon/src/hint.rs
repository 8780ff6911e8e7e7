//! Cache hints. A prefetch changes no memory and never faults, whatever the address; it only
//! asks the caches to start a load that a later read would otherwise wait for.

/// Bytes per cache line on every core we run on (x86_64, Cortex-A53/A72/A76, Neoverse).
const LINE: usize = 64;

/// Starts loading the first `max_bytes` of `data` into the caches, a line at a time: into L2,
/// not L1 (PREFETCHT1, PRFM PLDL2KEEP), as what is prefetched ahead of a product would be
/// pushed out of L1 by that product's stream anyway (and on Zen 4 it measured faster).
#[inline]
pub fn prefetch<T>(data: &[T], max_bytes: usize) {
    let p = data.as_ptr().cast::<u8>();
    for off in line_offsets(data, max_bytes) {
        line(p.wrapping_add(off));
    }
}

/// How far ahead of the block being read [`prefetch_ahead`] asks for a packed matrix's blocks.
const AHEAD_BYTES: usize = 8192;

/// Prefetches the block about [`AHEAD_BYTES`] past block `i` of `w` (nothing past its end):
/// for the packed K-quant products, whose reads within a block jump back and forth, so that
/// the hardware's stream detection alone leaves them waiting on memory (packed Q6_K decoded at
/// a fifth of the read bandwidth without it on Zen 5).
#[inline]
pub(crate) fn prefetch_ahead<P>(w: &[P], i: usize) {
    let ahead = (AHEAD_BYTES / std::mem::size_of::<P>().max(1)).max(1);
    if let Some(block) = w.get(i + ahead) {
        // Into L2, as [`prefetch`]: into L1 it measured a little ahead on Zen 5 but cut the
        // packed Q6_K product's cold stream on Zen 4 to a third of L2's (8 against 22 GB/s,
        // Qwen2.5 1.5B decoding at 8 against 23 tokens/s), the L1 fills evidently competing
        // with the lines the product is reading.
        let p = (block as *const P).cast::<u8>();
        for off in line_offsets(std::slice::from_ref(block), usize::MAX) {
            line(p.wrapping_add(off));
        }
    }
}

/// The byte offsets [`prefetch`] hints in `data` capped at `max_bytes`: one per line from 0,
/// each inside the slice and the cap. The only logic of a prefetch, apart so that a test can
/// see it (the hint itself is invisible to a program).
#[inline]
fn line_offsets<T>(data: &[T], max_bytes: usize) -> std::iter::StepBy<std::ops::Range<usize>> {
    (0..std::mem::size_of_val(data).min(max_bytes)).step_by(LINE)
}

/// One line at `p` into L2.
#[inline(always)]
fn line(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHT1 is a hint: it reads and writes no memory and never faults, whatever
    // the address (SSE is part of x86_64's baseline).
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(p.cast())
    };
    #[cfg(target_arch = "aarch64")]
    // SAFETY: PRFM is a hint: it reads and writes no memory and never faults, whatever the
    // address.
    unsafe {
        std::arch::asm!("prfm pldl2keep, [{0}]", in(reg) p, options(nostack, preserves_flags, readonly))
    };
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    let _ = p;
}

#[cfg(test)]
mod tests {
    use super::{LINE, line_offsets, prefetch};

    /// For every length and cap near the ends (empty, one byte, a line and one either side),
    /// the lines hinted start inside both the slice and the cap, from byte 0, one line apart,
    /// and cover every byte below the smaller of the two: counted against a plain walk. The
    /// slices are cut from one buffer at every offset, so that none starts aligned by luck.
    #[test]
    fn prefetch_hints_every_line_of_the_capped_slice_and_nothing_past_it() {
        let buf = vec![0u8; 4 * LINE + 9];
        for start in [0, 1, LINE - 1, LINE + 3] {
            for len in 0..=buf.len() - start {
                let data = &buf[start..start + len];
                prefetch(data, usize::MAX);
                let ends = [0, 1, 2, LINE - 1, LINE, LINE + 1, 2 * LINE, 3 * LINE + 7];
                let near = [len.saturating_sub(1), len, len + 1, usize::MAX];
                for cap in ends.into_iter().chain(near) {
                    let got: Vec<usize> = line_offsets(data, cap).collect();
                    let mut want = Vec::new();
                    let mut off = 0;
                    while off < len && off < cap {
                        want.push(off);
                        off += LINE;
                    }
                    assert_eq!(got, want, "start={start} len={len} cap={cap}");
                    for byte in 0..len.min(cap) {
                        assert!(
                            got.iter().any(|&o| (o..o + LINE).contains(&byte)),
                            "start={start} len={len} cap={cap}: byte {byte} in no hinted line"
                        );
                    }
                }
            }
        }
    }

    /// The cap is in bytes, whatever the element: a `u64` counts 8 of them, `()` none, and
    /// an empty slice of any type hints nothing.
    #[test]
    fn prefetch_counts_bytes_not_elements() {
        let data: Vec<u64> = (0..1000).collect();
        for start in [0, 1, 7, 8, 999, 1000] {
            for cap in [0, 1, 64, 65, 4096, usize::MAX] {
                prefetch(&data[start..], cap);
                let want = (8 * (1000 - start)).min(cap).div_ceil(LINE);
                let got = line_offsets(&data[start..], cap).count();
                assert_eq!(got, want, "start={start} cap={cap}");
            }
        }
        prefetch::<u64>(&[], usize::MAX);
        assert_eq!(line_offsets::<u64>(&[], usize::MAX).count(), 0);
        prefetch(&[(); 5], usize::MAX);
        assert_eq!(line_offsets(&[(); 5], usize::MAX).count(), 0);
    }
}
