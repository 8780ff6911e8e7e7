//! Products over weights interleaved eight rows at a time ([`BlockQ4_0x8`], …) with `sdot` by
//! element, for the dotprod and i8mm tables: the layout the engine packs at load.
//!
//! Sixteen bytes of a packed block hold four bytes of each of four rows, so
//! `sdot v.4s, w.16b, y.4b[j]` adds four rows' partial sums against activation bytes
//! `4j..4j+4` into four lanes: no pairwise reductions (`addp`) and one `fcvtl` for four rows'
//! scales. Per (row, token) pair the float sequence is `dot.rs`'s pair form, so the results are
//! the unpacked dotprod/i8mm products' bits. Q4 nibbles go into `sdot` as they are (0..15) and
//! Q4_0's `-8` is taken off the exact integer sum as `8 * sum(y)`: the same integer (Q5_0's
//! values 0..32 likewise, with `16 * sum(y)`).

use super::dot::ActBlock;
use super::fp16::{h2f_hi, h2f_lo, load_h8};
use crate::block::{
    BlockQ4_0x8, BlockQ4_1x8, BlockQ5_0x8, BlockQ8_0, BlockQ8_0x8, BlockQ8_1, PACK_ROWS,
};
use core::arch::aarch64::*;
use core::arch::asm;

/// `acc + sdot(a, b.4b[L])`: lane `k` gains `a[4k..4k+4] · b[4L..4L+4]`.
#[target_feature(enable = "dotprod")]
#[inline]
fn sdot_lane<const L: i32>(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    let mut acc = acc;
    // SAFETY: registers only; this function is compiled for dotprod, and calling it requires
    // the caller to vouch for the CPU feature (it is a `#[target_feature]` function).
    unsafe {
        asm!("sdot {acc:v}.4s, {a:v}.16b, {b:v}.4b[{l}]", acc = inout(vreg) acc,
             a = in(vreg) a, b = in(vreg) b, l = const L,
             options(pure, nomem, nostack, preserves_flags));
    }
    acc
}

/// `acc + sum_j sdot(v[j], y.4b[j])`.
#[target_feature(enable = "dotprod")]
#[inline]
pub(super) fn sdot4(acc: int32x4_t, v: &[int8x16_t; 4], y: int8x16_t) -> int32x4_t {
    let acc = sdot_lane::<0>(acc, v[0], y);
    let acc = sdot_lane::<1>(acc, v[1], y);
    let acc = sdot_lane::<2>(acc, v[2], y);
    sdot_lane::<3>(acc, v[3], y)
}

/// A packed format as these kernels see it.
pub(super) trait Pk: Copy + 'static {
    type A: ActBlock + Copy;
    const HAS_MIN: bool;
    /// Subtracted, times `sum(y)`, from the integer sums (Q4_0's offset of 8).
    const CORR: i32;
    /// Rows `4h..4h+4`: `[lo, hi]`, vector `lo[j]` to meet activation bytes `4j..4j+4` and
    /// `hi[j]` bytes `16 + 4j..`.
    fn vals(p: &Self, h: usize) -> [[int8x16_t; 4]; 2];
    fn scales(p: &Self) -> [float32x4_t; 2];
    /// The offsets `m` (Q4_1); zero for the formats without.
    #[inline(always)]
    fn mins(_: &Self) -> [float32x4_t; 2] {
        // SAFETY: baseline NEON register intrinsic.
        unsafe { [vdupq_n_f32(0.0); 2] }
    }
}

/// Rows `4h..4h+4` of a packed Q4 block: granule `c`'s low nibbles are values `4c..4c+4`, its
/// high nibbles values `16 + 4c..`.
#[inline(always)]
fn q4_vals(qs: &[u8; 128], h: usize) -> [[int8x16_t; 4]; 2] {
    // SAFETY: `qs[32c + 16h..][..16]` is in bounds (c < 4, h < 2); `ld1` has no alignment
    // requirement; the rest are baseline NEON register intrinsics.
    unsafe {
        let m = vdupq_n_u8(0x0f);
        let q: [uint8x16_t; 4] = core::array::from_fn(|c| vld1q_u8(qs[32 * c + 16 * h..].as_ptr()));
        [
            q.map(|v| vreinterpretq_s8_u8(vandq_u8(v, m))),
            q.map(|v| vreinterpretq_s8_u8(vshrq_n_u8::<4>(v))),
        ]
    }
}

/// Eight f16 (four rows' scales each half) as two f32 vectors, exactly.
#[inline(always)]
fn f32x8(h: &[crate::block::f16; 8]) -> [float32x4_t; 2] {
    let v = load_h8(h);
    [h2f_lo(v), h2f_hi(v)]
}

impl Pk for BlockQ4_0x8 {
    type A = BlockQ8_0;
    const HAS_MIN: bool = false;
    const CORR: i32 = 8;
    #[inline(always)]
    fn vals(p: &Self, h: usize) -> [[int8x16_t; 4]; 2] {
        q4_vals(&p.qs, h)
    }
    #[inline(always)]
    fn scales(p: &Self) -> [float32x4_t; 2] {
        f32x8(&p.d)
    }
}

impl Pk for BlockQ4_1x8 {
    type A = BlockQ8_1;
    const HAS_MIN: bool = true;
    const CORR: i32 = 0;
    #[inline(always)]
    fn vals(p: &Self, h: usize) -> [[int8x16_t; 4]; 2] {
        q4_vals(&p.qs, h)
    }
    #[inline(always)]
    fn scales(p: &Self) -> [float32x4_t; 2] {
        f32x8(&p.d)
    }
    #[inline(always)]
    fn mins(p: &Self) -> [float32x4_t; 2] {
        f32x8(&p.m)
    }
}

impl Pk for BlockQ5_0x8 {
    type A = BlockQ8_0;
    const HAS_MIN: bool = false;
    const CORR: i32 = 16;
    /// The nibbles as Q4's, each granule's fifth bits (bit `c` of `qh`'s byte for the low
    /// nibble, bit `4 + c` for the high one) shifted to bit 4 and or-ed in: values 0..32.
    #[inline(always)]
    fn vals(p: &Self, h: usize) -> [[int8x16_t; 4]; 2] {
        let [lo, hi] = q4_vals(&p.qs, h);
        // SAFETY: `qh[16h..][..16]` is in bounds (h < 2); `ld1` has no alignment requirement;
        // the rest are baseline NEON register intrinsics.
        unsafe {
            let bits = vld1q_u8(p.qh[16 * h..].as_ptr());
            let b4 = vdupq_n_u8(0x10);
            let low = [
                vshlq_n_u8::<4>(bits),
                vshlq_n_u8::<3>(bits),
                vshlq_n_u8::<2>(bits),
                vshlq_n_u8::<1>(bits),
            ];
            let high = [
                bits,
                vshrq_n_u8::<1>(bits),
                vshrq_n_u8::<2>(bits),
                vshrq_n_u8::<3>(bits),
            ];
            let with =
                |v: int8x16_t, f: uint8x16_t| vorrq_s8(v, vreinterpretq_s8_u8(vandq_u8(f, b4)));
            [
                core::array::from_fn(|c| with(lo[c], low[c])),
                core::array::from_fn(|c| with(hi[c], high[c])),
            ]
        }
    }
    #[inline(always)]
    fn scales(p: &Self) -> [float32x4_t; 2] {
        f32x8(&p.d)
    }
}

impl Pk for BlockQ8_0x8 {
    type A = BlockQ8_0;
    const HAS_MIN: bool = false;
    const CORR: i32 = 0;
    #[inline(always)]
    fn vals(p: &Self, h: usize) -> [[int8x16_t; 4]; 2] {
        // SAFETY: `qs[32c + 16h..][..16]` is in bounds (c < 8, h < 2); `ld1` has no alignment
        // requirement.
        let v = |c: usize| unsafe { vld1q_s8(p.qs[32 * c + 16 * h..].as_ptr()) };
        [
            core::array::from_fn(|j| v(j)),
            core::array::from_fn(|j| v(4 + j)),
        ]
    }
    #[inline(always)]
    fn scales(p: &Self) -> [float32x4_t; 2] {
        f32x8(&p.d)
    }
}

/// `CORR * sum(y)` of an activation block, exact.
#[inline(always)]
fn corr<P: Pk>(y: [int8x16_t; 2]) -> i32 {
    if P::CORR == 0 {
        return 0;
    }
    // SAFETY: baseline NEON register intrinsics; a sum of 16 i8 fits the i16 of `saddlv`.
    let s = unsafe { i32::from(vaddlvq_s8(y[0])) + i32::from(vaddlvq_s8(y[1])) };
    P::CORR * s
}

/// Group `g` (rows `8g..8g+8`) × tokens `t..t + T`, in the pair form, into `out` (`[row][tok]`).
///
/// # Safety
/// The CPU has dotprod; `w` holds the group's `nb` blocks at `g * nb`, `a` the tokens' `nb`
/// blocks, `out` the rows × `n_tok` outputs (checked by the caller through `check_packed`).
#[target_feature(enable = "dotprod")]
#[inline]
unsafe fn tile<P: Pk, const T: usize>(
    w: &[P],
    a: &[P::A],
    nb: usize,
    n_tok: usize,
    g: usize,
    t: usize,
    out: &mut [f32],
) {
    let wg = &w[g * nb..(g + 1) * nb];
    let toks: [&[P::A]; T] = core::array::from_fn(|j| &a[(t + j) * nb..(t + j + 1) * nb]);
    // SAFETY: baseline NEON register intrinsic. (Safe inside a `target_feature` function on
    // newer compilers, hence the `allow`; 1.88 needs the block.)
    #[allow(unused_unsafe)]
    let zero = unsafe { vdupq_n_f32(0.0) };
    let mut acc = [[zero; 2]; T];
    let mut msum = [[zero; 2]; T];
    for (b, p) in wg.iter().enumerate() {
        let dw = P::scales(p);
        let mw = P::mins(p);
        let ys: [[int8x16_t; 2]; T] = core::array::from_fn(|j| toks[j][b].qs());
        let da: [f32; T] = core::array::from_fn(|j| toks[j][b].d());
        let cs: [i32; T] = core::array::from_fn(|j| corr::<P>(ys[j]));
        for h in 0..2 {
            let [lo, hi] = P::vals(p, h);
            for j in 0..T {
                // SAFETY: this function runs with dotprod; the rest are baseline NEON
                // register intrinsics.
                #[allow(unused_unsafe)]
                unsafe {
                    let z = vdupq_n_s32(0);
                    let s = vaddq_s32(sdot4(z, &lo, ys[j][0]), sdot4(z, &hi, ys[j][1]));
                    let isum = vsubq_s32(s, vdupq_n_s32(cs[j]));
                    acc[j][h] =
                        vfmaq_f32(acc[j][h], vcvtq_f32_s32(isum), vmulq_n_f32(dw[h], da[j]));
                    if P::HAS_MIN {
                        msum[j][h] = vfmaq_n_f32(msum[j][h], mw[h], toks[j][b].s());
                    }
                }
            }
        }
    }
    for j in 0..T {
        for h in 0..2 {
            let v = if P::HAS_MIN {
                // SAFETY: baseline NEON register intrinsic.
                #[allow(unused_unsafe)]
                unsafe {
                    vaddq_f32(acc[j][h], msum[j][h])
                }
            } else {
                acc[j][h]
            };
            let mut l = [0.0f32; 4];
            // SAFETY: `l` is valid for 4 writable f32.
            unsafe { vst1q_f32(l.as_mut_ptr(), v) };
            for (k, x) in l.iter().enumerate() {
                out[(g * PACK_ROWS + 4 * h + k) * n_tok + t + j] = *x;
            }
        }
    }
}

/// # Safety
/// The CPU has dotprod; shapes checked by `check_packed` (`nb > 0`).
#[target_feature(enable = "dotprod")]
unsafe fn run<P: Pk>(w: &[P], a: &[P::A], nb: usize, n_tok: usize, out: &mut [f32]) {
    let groups = out.len() / n_tok / PACK_ROWS;
    for g in 0..groups {
        let mut t = 0;
        // SAFETY: as this function.
        unsafe {
            while t + 2 <= n_tok {
                tile::<P, 2>(w, a, nb, n_tok, g, t, out);
                t += 2;
            }
            if t < n_tok {
                tile::<P, 1>(w, a, nb, n_tok, g, t, out);
            }
        }
    }
}

packed_table!("dotprod", "dotprod");
