//! Weight matrices repacked at load into the kernels' interleaved layout (`BlockQ4_0x8`,
//! `BlockQ4Kx8`, …), for kernel paths that have products over it (`Kernels::packed` for
//! Q4_0, Q4_1, Q8_0 and Q5_0, `Kernels::packed_k` for Q4_K, Q5_K and Q6_K).
//!
//! Decoding streams every weight once per token, so its speed is the speed of the matrix-vector
//! product over memory. Interleaving eight rows lets one integer dot product fill eight lanes
//! with eight rows' sums (no horizontal reduction, one load for eight scales), and storing the
//! matrices in the order the forward pass reads them makes a token's weights nearly one
//! sequential stream. Packing moves bits only: the products give the same bits as over the
//! file's layout, so answers do not change.
//!
//! The packed copy replaces the mapped file in RAM: once packed, the file's pages of the tensor
//! data are dropped from the resident set (a later read of an unpacked tensor faults its pages
//! back in), so peak RSS stays weights + KV + a little. A model opened with `--mlock` is not
//! packed: its locked file pages could not be dropped, and the weights would take twice the RAM.

use super::matrix::{Mat, MatData};
use kernels_neon::{
    BlockFormat, BlockQ4_0x8, BlockQ4_1x8, BlockQ4Kx8, BlockQ5_0x8, BlockQ5Kx8, BlockQ6Kx8,
    BlockQ8_0x8, PACK_ROWS, PackedFormat, pack_matrix,
};

/// Where a packed tensor lives.
#[derive(Clone, Copy, Debug)]
enum Slot {
    Q4_0(usize, usize),
    Q4_1(usize, usize),
    Q8_0(usize, usize),
    Q5_0(usize, usize),
    Q4K(usize, usize),
    Q5K(usize, usize),
    Q6K(usize, usize),
}

/// The packed matrices of one model, one buffer per block format, each in forward order.
#[derive(Default)]
pub struct Packed {
    q4_0: Vec<BlockQ4_0x8>,
    q4_1: Vec<BlockQ4_1x8>,
    q8_0: Vec<BlockQ8_0x8>,
    q5_0: Vec<BlockQ5_0x8>,
    q4_k: Vec<BlockQ4Kx8>,
    q5_k: Vec<BlockQ5Kx8>,
    q6_k: Vec<BlockQ6Kx8>,
    /// By tensor index in the file.
    slots: Vec<Option<Slot>>,
}

/// Which block formats to pack: those whose packed products the engine's kernel path has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Formats {
    /// Q4_0, Q4_1, Q8_0, Q5_0 (`Kernels::packed`).
    pub legacy: bool,
    /// Q4_K, Q5_K, Q6_K (`Kernels::packed_k`).
    pub k_quants: bool,
}

impl Formats {
    /// Every format with a packed layout.
    pub const ALL: Formats = Formats {
        legacy: true,
        k_quants: true,
    };

    /// The formats `k` has packed products for. The K-quants are packed on every path but the
    /// portable one, whose packed prompt products are slower than its file-layout ones (the
    /// results are the same bits either way); [`PACK_K_ENV`] `= 0` or `1` decides instead.
    pub fn of(k: &kernels_neon::Kernels) -> Formats {
        Self::with_switch(k, std::env::var_os(PACK_K_ENV).as_deref())
    }

    /// [`Formats::of`] with [`PACK_K_ENV`]'s value given.
    fn with_switch(k: &kernels_neon::Kernels, switch: Option<&std::ffi::OsStr>) -> Formats {
        let k_default = k.path != kernels_neon::Path::Portable;
        Formats {
            legacy: k.packed.is_some(),
            k_quants: k.packed_k.is_some()
                && match switch {
                    Some(v) if v == "1" => true,
                    Some(v) if v == "0" => false,
                    _ => k_default,
                },
        }
    }

    /// Whether there is anything to pack.
    pub fn any(self) -> bool {
        self.legacy || self.k_quants
    }
}

/// Whether `m` can be packed: a quantized format of `formats`, whole groups of 8 rows.
fn packable(m: &Mat<'_>, formats: Formats) -> bool {
    let wanted = match m.data {
        MatData::Q4_0(_) | MatData::Q4_1(_) | MatData::Q8_0(_) | MatData::Q5_0(_) => formats.legacy,
        MatData::Q4K(_) | MatData::Q5K(_) | MatData::Q6K(_) => formats.k_quants,
        _ => false,
    };
    wanted && m.rows > 0 && m.rows.is_multiple_of(PACK_ROWS) && m.cols >= 32
}

/// Bytes the packed copy of `mats` takes (each tensor once).
pub fn packed_bytes(mats: &[(usize, Mat<'_>)], formats: Formats) -> usize {
    let mut seen = std::collections::HashSet::new();
    mats.iter()
        .filter(|(i, m)| packable(m, formats) && seen.insert(*i))
        .map(|(_, m)| m.bytes())
        .sum()
}

/// Whether a packed copy of `want` bytes fits in `available` bytes (`MemAvailable`, which
/// counts the model file's own cached pages, released as packing goes): at most three
/// quarters of it, so that the rest of the device keeps room.
pub fn fits(want: usize, available: u64) -> bool {
    (want as u128) * 4 <= u128::from(available) * 3
}

/// `MemAvailable` from `/proc/meminfo`, in bytes (`None` where there is no such file or line).
pub fn mem_available() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// Source bytes packed between two calls of the release callback: the file's pages go as the
/// copy grows, so the two are never both resident for more than this (and a page or two) per
/// packing thread.
const RELEASE_STEP: usize = 1 << 20;

/// One step of packing: some groups of one matrix packed into their place. It returns the
/// source bytes it read, for the caller to release.
type Job<'a> = Box<dyn FnOnce() -> &'a [u8] + Send + 'a>;

/// Cuts matrix `w` (`nb` blocks per row) into steps, packing into the front of `buf` (its
/// format's buffer, which keeps the rest for the next matrix: slots were given out in this
/// same order).
fn steps<'a, P: PackedFormat>(
    w: &'a [P::Row],
    buf: &mut &'a mut [P],
    nb: usize,
    jobs: &mut Vec<Job<'a>>,
) {
    let (dst, rest) = std::mem::take(buf).split_at_mut(w.len() / PACK_ROWS);
    *buf = rest;
    let groups_per_step = (RELEASE_STEP / std::mem::size_of::<P>() / nb).max(1);
    let outs = dst.chunks_mut(nb * groups_per_step);
    for (step, out) in w.chunks(nb * PACK_ROWS * groups_per_step).zip(outs) {
        jobs.push(Box::new(move || {
            pack_matrix(step, nb, out);
            bytemuck::cast_slice(step)
        }));
    }
}

impl Packed {
    /// Packs `mats` (tensor index, matrix) of `formats`, in this order; the ones that cannot
    /// be packed and repeats (tied embeddings) are left out. Each buffer is allocated once, at its final size,
    /// and filled by `threads` threads, 1 MiB steps dealt out in turn (the page faults of a
    /// fresh buffer are much of the cost, and they run in parallel too). `release` is handed
    /// each piece of source data once it is packed.
    pub fn build(
        n_tensors: usize,
        mats: &[(usize, Mat<'_>)],
        formats: Formats,
        threads: usize,
        release: &(dyn Fn(&[u8]) + Sync),
    ) -> Packed {
        let mut slots = vec![None; n_tensors];
        let mut want = [0usize; 7];
        for (i, m) in mats {
            if !packable(m, formats) || slots[*i].is_some() {
                continue;
            }
            let (k, slot, block): (usize, fn(usize, usize) -> Slot, usize) = match m.data {
                MatData::Q4_0(_) => (0, Slot::Q4_0, 32),
                MatData::Q4_1(_) => (1, Slot::Q4_1, 32),
                MatData::Q8_0(_) => (2, Slot::Q8_0, 32),
                MatData::Q5_0(_) => (3, Slot::Q5_0, 32),
                MatData::Q4K(_) => (4, Slot::Q4K, 256),
                MatData::Q5K(_) => (5, Slot::Q5K, 256),
                _ => (6, Slot::Q6K, 256),
            };
            let n = m.rows / PACK_ROWS * (m.cols / block);
            slots[*i] = Some(slot(want[k], n));
            want[k] += n;
        }
        // Zeroed allocations of this size are fresh pages, not written until packing touches
        // them, so the huge-page hint still applies.
        let mut p = Packed {
            q4_0: bytemuck::zeroed_vec(want[0]),
            q4_1: bytemuck::zeroed_vec(want[1]),
            q8_0: bytemuck::zeroed_vec(want[2]),
            q5_0: bytemuck::zeroed_vec(want[3]),
            q4_k: bytemuck::zeroed_vec(want[4]),
            q5_k: bytemuck::zeroed_vec(want[5]),
            q6_k: bytemuck::zeroed_vec(want[6]),
            slots,
        };
        advise_huge_pages(&p.q4_0);
        advise_huge_pages(&p.q4_1);
        advise_huge_pages(&p.q8_0);
        advise_huge_pages(&p.q5_0);
        advise_huge_pages(&p.q4_k);
        advise_huge_pages(&p.q5_k);
        advise_huge_pages(&p.q6_k);
        {
            let mut jobs = Vec::new();
            let (mut q4_0, mut q4_1, mut q8_0, mut q5_0) = (
                &mut p.q4_0[..],
                &mut p.q4_1[..],
                &mut p.q8_0[..],
                &mut p.q5_0[..],
            );
            let (mut q4_k, mut q5_k, mut q6_k) =
                (&mut p.q4_k[..], &mut p.q5_k[..], &mut p.q6_k[..]);
            let mut done = vec![false; n_tensors];
            for (i, m) in mats {
                if p.slots[*i].is_none() || std::mem::replace(&mut done[*i], true) {
                    continue;
                }
                let (nb, nk) = (m.cols / 32, m.cols / 256);
                match m.data {
                    MatData::Q4_0(w) => steps(w, &mut q4_0, nb, &mut jobs),
                    MatData::Q4_1(w) => steps(w, &mut q4_1, nb, &mut jobs),
                    MatData::Q8_0(w) => steps(w, &mut q8_0, nb, &mut jobs),
                    MatData::Q5_0(w) => steps(w, &mut q5_0, nb, &mut jobs),
                    MatData::Q4K(w) => steps(w, &mut q4_k, nk, &mut jobs),
                    MatData::Q5K(w) => steps(w, &mut q5_k, nk, &mut jobs),
                    MatData::Q6K(w) => steps(w, &mut q6_k, nk, &mut jobs),
                    _ => unreachable!("packable() admits only quantized matrices"),
                }
            }
            let threads = threads.clamp(1, jobs.len().max(1));
            let mut shares: Vec<Vec<Job<'_>>> = (0..threads).map(|_| Vec::new()).collect();
            for (n, job) in jobs.drain(..).enumerate() {
                shares[n % threads].push(job);
            }
            let mut shares = shares.into_iter();
            let mine = shares.next().unwrap_or_default();
            std::thread::scope(|s| {
                for share in shares {
                    s.spawn(move || share.into_iter().for_each(|j| release(j())));
                }
                mine.into_iter().for_each(|j| release(j()));
            });
        }
        p
    }

    /// The packed view of tensor `index`, if it was packed.
    pub fn data(&self, index: usize) -> Option<MatData<'_>> {
        Some(match self.slots.get(index).copied().flatten()? {
            Slot::Q4_0(s, n) => MatData::Q4_0x8(&self.q4_0[s..s + n]),
            Slot::Q4_1(s, n) => MatData::Q4_1x8(&self.q4_1[s..s + n]),
            Slot::Q8_0(s, n) => MatData::Q8_0x8(&self.q8_0[s..s + n]),
            Slot::Q5_0(s, n) => MatData::Q5_0x8(&self.q5_0[s..s + n]),
            Slot::Q4K(s, n) => MatData::Q4Kx8(&self.q4_k[s..s + n]),
            Slot::Q5K(s, n) => MatData::Q5Kx8(&self.q5_k[s..s + n]),
            Slot::Q6K(s, n) => MatData::Q6Kx8(&self.q6_k[s..s + n]),
        })
    }

    /// Tensors `indices`, if all were packed into one buffer one after the other: one view
    /// over all of them, whose rows are theirs in turn. A product over it is the products over
    /// each (a row's result depends on that row only), with one pass over the weights.
    pub fn span(&self, indices: &[usize]) -> Option<MatData<'_>> {
        let slot = |i: usize| self.slots.get(i).copied().flatten();
        let range = |s: Slot| match s {
            Slot::Q4_0(a, n)
            | Slot::Q4_1(a, n)
            | Slot::Q8_0(a, n)
            | Slot::Q5_0(a, n)
            | Slot::Q4K(a, n)
            | Slot::Q5K(a, n)
            | Slot::Q6K(a, n) => (a, n),
        };
        let first = slot(*indices.first()?)?;
        let mut last = first;
        for &i in &indices[1..] {
            let next = slot(i)?;
            let ((a, n), (b, _)) = (range(last), range(next));
            if std::mem::discriminant(&last) != std::mem::discriminant(&next) || a + n != b {
                return None;
            }
            last = next;
        }
        let (start, (l, ln)) = (range(first).0, range(last));
        Some(match first {
            Slot::Q4_0(..) => MatData::Q4_0x8(&self.q4_0[start..l + ln]),
            Slot::Q4_1(..) => MatData::Q4_1x8(&self.q4_1[start..l + ln]),
            Slot::Q8_0(..) => MatData::Q8_0x8(&self.q8_0[start..l + ln]),
            Slot::Q5_0(..) => MatData::Q5_0x8(&self.q5_0[start..l + ln]),
            Slot::Q4K(..) => MatData::Q4Kx8(&self.q4_k[start..l + ln]),
            Slot::Q5K(..) => MatData::Q5Kx8(&self.q5_k[start..l + ln]),
            Slot::Q6K(..) => MatData::Q6Kx8(&self.q6_k[start..l + ln]),
        })
    }

    /// The formats it holds packed matrices of.
    pub fn formats(&self) -> Formats {
        Formats {
            legacy: !(self.q4_0.is_empty()
                && self.q4_1.is_empty()
                && self.q8_0.is_empty()
                && self.q5_0.is_empty()),
            k_quants: !(self.q4_k.is_empty() && self.q5_k.is_empty() && self.q6_k.is_empty()),
        }
    }

    /// Whether `k` has the packed products of every format this holds.
    pub fn served_by(&self, k: &kernels_neon::Kernels) -> bool {
        let (have, need) = (Formats::of(k), self.formats());
        (have.legacy || !need.legacy) && (have.k_quants || !need.k_quants)
    }

    /// How many tensors were packed and their bytes.
    pub fn stats(&self) -> (usize, usize) {
        let n = self.slots.iter().flatten().count();
        let bytes = std::mem::size_of_val(&self.q4_0[..])
            + std::mem::size_of_val(&self.q4_1[..])
            + std::mem::size_of_val(&self.q8_0[..])
            + std::mem::size_of_val(&self.q5_0[..])
            + std::mem::size_of_val(&self.q4_k[..])
            + std::mem::size_of_val(&self.q5_k[..])
            + std::mem::size_of_val(&self.q6_k[..]);
        (n, bytes)
    }
}

/// `EDGELLM_PACK_K=0` leaves K-quant matrices in the file's layout, `1` packs them even on the
/// portable path (for A/B runs: the products are bit-identical, so the switch changes speed
/// and memory only).
pub const PACK_K_ENV: &str = "EDGELLM_PACK_K";

/// `EDGELLM_HUGEPAGES=0` leaves the packed weights on normal pages (for A/B runs, or a device
/// whose memory is so fragmented that the kernel's compaction for huge pages stalls start-up).
pub const HUGEPAGES_ENV: &str = "EDGELLM_HUGEPAGES";

/// Asks for transparent huge pages (2 MiB on x86-64 and 4 KiB-granule arm64) for a buffer
/// about to be written: a few dozen page faults instead of ~22,000 for 90 MB of weights, which
/// is time to the first token, and fewer TLB misses when decoding streams the weights. A hint:
/// where THP is off (`/sys/kernel/mm/transparent_hugepage/enabled` = never) nothing changes.
pub fn advise_huge_pages<T>(buf: &[T]) {
    const HUGE: usize = 2 << 20;
    if std::env::var_os(HUGEPAGES_ENV).is_some_and(|v| v == "0") {
        return;
    }
    let (start, len) = (buf.as_ptr() as usize, std::mem::size_of_val(buf));
    let lo = start.next_multiple_of(HUGE);
    let hi = (start + len) & !(HUGE - 1);
    if hi <= lo {
        return;
    }
    let Some(ptr) = std::ptr::NonNull::new(lo as *mut std::ffi::c_void) else {
        return;
    };
    // SAFETY: `lo..hi` lies inside `buf`, memory this process allocated and owns; MADV_HUGEPAGE
    // only changes how the kernel backs those pages (never their contents or mapping), so the
    // shared borrow is not written through.
    let r =
        unsafe { nix::sys::mman::madvise(ptr, hi - lo, nix::sys::mman::MmapAdvise::MADV_HUGEPAGE) };
    if let Err(e) = r {
        tracing::debug!("madvise(HUGEPAGE) on packed weights: {e}");
    }
}

/// Row `r` of a packed matrix of `nb` blocks per row, dequantized (embedding lookup of tied
/// embeddings).
pub fn packed_row_f32<P: PackedFormat>(w: &[P], nb: usize, r: usize, out: &mut [f32]) {
    let (g, k) = (r / PACK_ROWS, r % PACK_ROWS);
    let len = P::Row::BLOCK_LEN;
    for (b, o) in w[g * nb..][..nb].iter().zip(out.chunks_exact_mut(len)) {
        P::Row::dequantize_row(&[b.unpack(k)], o);
    }
}

#[cfg(test)]
mod tests {
    use super::{Formats, fits, mem_available};
    use kernels_neon::{Kernels, Path};
    use std::ffi::OsStr;

    #[test]
    fn k_quants_are_packed_by_default_on_every_path_with_fast_packed_products() {
        for p in Path::available() {
            let k = Kernels::for_path(p).unwrap();
            let has = k.packed_k.is_some();
            let default = Formats::with_switch(k, None).k_quants;
            assert_eq!(default, has && p != Path::Portable, "{p}: default");
            assert_eq!(
                Formats::with_switch(k, Some(OsStr::new("1"))).k_quants,
                has,
                "{p}: 1"
            );
            assert!(
                !Formats::with_switch(k, Some(OsStr::new("0"))).k_quants,
                "{p}: 0"
            );
            let other = Formats::with_switch(k, Some(OsStr::new("yes"))).k_quants;
            assert_eq!(other, default, "{p}: another value keeps the default");
        }
    }

    #[test]
    fn packing_needs_a_quarter_of_the_available_memory_to_spare() {
        let mib = 1u64 << 20;
        assert!(fits(86 << 20, 400 * mib));
        assert!(fits(300 << 20, 400 * mib));
        assert!(!fits(301 << 20, 400 * mib));
        assert!(!fits(700 << 20, 512 * mib));
        assert!(!fits(usize::MAX, u64::MAX / 2));
        assert!(fits(0, 0));
    }

    #[test]
    fn available_memory_is_read_on_linux() {
        let a = mem_available().expect("/proc/meminfo has MemAvailable");
        assert!(a > 0);
    }
}
