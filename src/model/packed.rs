//! Weight matrices repacked at load into the kernels' interleaved layout (`BlockQ4_0x8`, …),
//! for kernel paths that have products over it (`Kernels::packed`).
//!
//! Decoding streams every weight once per token, so its speed is the speed of the matrix-vector
//! product over memory. Interleaving eight rows lets one integer dot product fill eight lanes
//! with eight rows' sums (no horizontal reduction, one load for eight scales), and storing the
//! matrices in the order the forward pass reads them makes a token's weights nearly one
//! sequential stream. Packing moves bytes only: the products give the same bits as over the
//! file's layout, so answers do not change.
//!
//! The packed copy replaces the mapped file in RAM: once packed, the file's pages of the tensor
//! data are dropped from the resident set (a later read of an unpacked tensor faults its pages
//! back in), so peak RSS stays weights + KV + a little. A model opened with `--mlock` is not
//! packed: its locked file pages could not be dropped, and the weights would take twice the RAM.

use super::matrix::{Mat, MatData};
use kernels_neon::{
    BlockFormat, BlockQ4_0x8, BlockQ4_1x8, BlockQ8_0x8, PACK_ROWS, PackedFormat, pack_matrix,
};

/// Where a packed tensor lives.
#[derive(Clone, Copy, Debug)]
enum Slot {
    Q4_0(usize, usize),
    Q4_1(usize, usize),
    Q8_0(usize, usize),
}

/// The packed matrices of one model, one buffer per block format, each in forward order.
#[derive(Default)]
pub struct Packed {
    q4_0: Vec<BlockQ4_0x8>,
    q4_1: Vec<BlockQ4_1x8>,
    q8_0: Vec<BlockQ8_0x8>,
    /// By tensor index in the file.
    slots: Vec<Option<Slot>>,
}

/// Whether `m` can be packed: a quantized format with a packed layout, whole groups of 8 rows.
fn packable(m: &Mat<'_>) -> bool {
    let quantized = matches!(
        m.data,
        MatData::Q4_0(_) | MatData::Q4_1(_) | MatData::Q8_0(_)
    );
    quantized && m.rows > 0 && m.rows.is_multiple_of(PACK_ROWS) && m.cols >= 32
}

/// Source bytes packed between two calls of the release callback: the file's pages go as the
/// copy grows, so the two are never both resident for more than this (and a page or two).
const RELEASE_STEP: usize = 1 << 20;

fn push<P: PackedFormat>(
    dst: &mut Vec<P>,
    w: &[P::Row],
    nb: usize,
    release: &dyn Fn(&[u8]),
) -> (usize, usize) {
    let start = dst.len();
    let n = w.len() / PACK_ROWS;
    // Within the capacity reserved up front: no reallocation, and the zeroes cost little next
    // to the page faults that come with them.
    dst.resize(start + n, P::zeroed());
    let groups_per_step = (RELEASE_STEP / std::mem::size_of::<P>() / nb).max(1);
    let out = dst[start..].chunks_mut(nb * groups_per_step);
    for (step, out) in w.chunks(nb * PACK_ROWS * groups_per_step).zip(out) {
        pack_matrix(step, nb, out);
        release(bytemuck::cast_slice(step));
    }
    (start, n)
}

impl Packed {
    /// Packs `mats` (tensor index, matrix), in this order; the ones that cannot be packed and
    /// repeats (tied embeddings) are left out. Each buffer is allocated once, at its final size.
    /// `release` is handed each piece of source data once it is packed.
    pub fn build(n_tensors: usize, mats: &[(usize, Mat<'_>)], release: &dyn Fn(&[u8])) -> Packed {
        let mut p = Packed {
            slots: vec![None; n_tensors],
            ..Packed::default()
        };
        let mut want = [0usize; 3];
        let mut seen = vec![false; n_tensors];
        for (i, m) in mats {
            if packable(m) && !std::mem::replace(&mut seen[*i], true) {
                let blocks = m.rows / PACK_ROWS * (m.cols / 32);
                match m.data {
                    MatData::Q4_0(_) => want[0] += blocks,
                    MatData::Q4_1(_) => want[1] += blocks,
                    _ => want[2] += blocks,
                }
            }
        }
        p.q4_0.reserve_exact(want[0]);
        p.q4_1.reserve_exact(want[1]);
        p.q8_0.reserve_exact(want[2]);
        advise_huge_pages(p.q4_0.spare_capacity_mut());
        advise_huge_pages(p.q4_1.spare_capacity_mut());
        advise_huge_pages(p.q8_0.spare_capacity_mut());
        for (i, m) in mats {
            if !packable(m) || p.slots[*i].is_some() {
                continue;
            }
            let nb = m.cols / 32;
            p.slots[*i] = Some(match m.data {
                MatData::Q4_0(w) => {
                    let (s, n) = push(&mut p.q4_0, w, nb, release);
                    Slot::Q4_0(s, n)
                }
                MatData::Q4_1(w) => {
                    let (s, n) = push(&mut p.q4_1, w, nb, release);
                    Slot::Q4_1(s, n)
                }
                MatData::Q8_0(w) => {
                    let (s, n) = push(&mut p.q8_0, w, nb, release);
                    Slot::Q8_0(s, n)
                }
                _ => unreachable!("packable() admits only quantized matrices"),
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
        })
    }

    /// Tensors `indices`, if all were packed into one buffer one after the other: one view
    /// over all of them, whose rows are theirs in turn. A product over it is the products over
    /// each (a row's result depends on that row only), with one pass over the weights.
    pub fn span(&self, indices: &[usize]) -> Option<MatData<'_>> {
        let slot = |i: usize| self.slots.get(i).copied().flatten();
        let range = |s: Slot| match s {
            Slot::Q4_0(a, n) | Slot::Q4_1(a, n) | Slot::Q8_0(a, n) => (a, n),
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
        })
    }

    /// How many tensors were packed and their bytes.
    pub fn stats(&self) -> (usize, usize) {
        let n = self.slots.iter().flatten().count();
        let bytes = std::mem::size_of_val(&self.q4_0[..])
            + std::mem::size_of_val(&self.q4_1[..])
            + std::mem::size_of_val(&self.q8_0[..]);
        (n, bytes)
    }
}

/// `EDGELLM_HUGEPAGES=0` leaves the packed weights on normal pages (for A/B runs, or a device
/// whose memory is so fragmented that the kernel's compaction for huge pages stalls start-up).
pub const HUGEPAGES_ENV: &str = "EDGELLM_HUGEPAGES";

/// Asks for transparent huge pages (2 MiB on x86-64 and 4 KiB-granule arm64) for a buffer
/// about to be written: a few dozen page faults instead of ~22,000 for 90 MB of weights, which
/// is time to the first token, and fewer TLB misses when decoding streams the weights. A hint:
/// where THP is off (`/sys/kernel/mm/transparent_hugepage/enabled` = never) nothing changes.
pub fn advise_huge_pages<T>(buf: &mut [std::mem::MaybeUninit<T>]) {
    const HUGE: usize = 2 << 20;
    if std::env::var_os(HUGEPAGES_ENV).is_some_and(|v| v == "0") {
        return;
    }
    let (start, len) = (buf.as_mut_ptr() as usize, std::mem::size_of_val(buf));
    let lo = start.next_multiple_of(HUGE);
    let hi = (start + len) & !(HUGE - 1);
    if hi <= lo {
        return;
    }
    let Some(ptr) = std::ptr::NonNull::new(lo as *mut std::ffi::c_void) else {
        return;
    };
    // SAFETY: `lo..hi` lies inside `buf`, memory this process allocated and owns; MADV_HUGEPAGE
    // only changes how the kernel backs those pages, never their contents or mapping.
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
    for (b, o) in w[g * nb..][..nb].iter().zip(out.chunks_exact_mut(32)) {
        P::Row::dequantize_row(&[b.unpack(k)], o);
    }
}
