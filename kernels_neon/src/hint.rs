//! Cache hints. A prefetch changes no memory and never faults, whatever the address; it only
//! asks the caches to start a load that a later read would otherwise wait for.

/// Bytes per cache line on every core we run on (x86_64, Cortex-A53/A72/A76, Neoverse).
const LINE: usize = 64;

/// Starts loading the first `max_bytes` of `data` into the caches, a line at a time: into L2,
/// not L1 (PREFETCHT1, PRFM PLDL2KEEP), as what is prefetched ahead of a product would be
/// pushed out of L1 by that product's stream anyway (and on Zen 4 it measured faster).
#[inline]
pub fn prefetch<T>(data: &[T], max_bytes: usize) {
    let bytes = std::mem::size_of_val(data).min(max_bytes);
    let p = data.as_ptr().cast::<u8>();
    for off in (0..bytes).step_by(LINE) {
        line(p.wrapping_add(off));
    }
}

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
    use super::prefetch;

    /// Any slice and cap, empty, unaligned or zero-sized elements: no fault, no change.
    #[test]
    fn prefetch_any_slice() {
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
        let copy = data.clone();
        for start in [0, 1, 63, 999, 1000] {
            for cap in [0, 1, 64, 65, 4096, usize::MAX] {
                prefetch(&data[start..], cap);
            }
        }
        prefetch::<u64>(&[], usize::MAX);
        prefetch(&[(); 5], usize::MAX);
        assert_eq!(data, copy);
    }
}
