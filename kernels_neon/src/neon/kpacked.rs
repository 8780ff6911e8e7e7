//! Products over K-quant weights interleaved eight rows at a time ([`BlockQ4Kx8`],
//! [`BlockQ5Kx8`], [`BlockQ6Kx8`]), on base NEON and with `sdot`: the layout the engine packs
//! K-quant matrices into at load (`x86/kpacked.rs` documents it and the arithmetic).
//!
//! Sixteen bytes of a 32-byte granule hold four levels of four rows, so with `sdot` by element
//! (`sdot v.4s, w.16b, y.4b[j]`) a sub-block's sums for four rows land in four lanes; on base
//! NEON `smull`/`smlal` against the four activation bytes repeated do the same into i16 lanes
//! (one product per lane per granule: at most 8 · 31 · 128 < 2^15 for a 32-value sub-block,
//! 4 · 63 · 128 for Q6_K's 16), widened and paired at the end of the sub-block. Each
//! sub-block's scales for the four rows are one vector (lane-wise shifts and masks on the
//! rows' words of packed scales), applied with one `mla`; the mins and Q6_K's offset are
//! `mla`s of those vectors by the activations' `bsums`. The integers are exact, and the float
//! steps per row and token are `kseq`'s (x86's, lane for lane), so the results are the
//! unpacked K-quant products' bits on every path of both architectures.

use super::fp16::{h2f_hi, h2f_lo, load_h8};
use super::packed::sdot4;
use crate::block::{BlockQ4Kx8, BlockQ5Kx8, BlockQ6Kx8, BlockQ8K, PACK_ROWS};
use crate::hint::prefetch_ahead;
use core::arch::aarch64::*;

/// Tokens per tile of a matrix-matrix product: each granule's levels extracted once for them.
const TOKS: usize = 2;

/// How a path computes four rows' sums over `G` granules.
trait Isa {
    /// Per lane (row), `Σ_g q[g] · y[g / 4].4b[g % 4]`: granule `g` of four rows against four
    /// activation bytes.
    ///
    /// # Safety
    /// The CPU has the path's features (dotprod for [`Dotprod`]).
    unsafe fn dot<const G: usize>(q: &[int8x16_t; G], y: &[int8x16_t]) -> int32x4_t;
}

struct Neon;
struct Dotprod;

impl Isa for Neon {
    #[inline(always)]
    unsafe fn dot<const G: usize>(q: &[int8x16_t; G], y: &[int8x16_t]) -> int32x4_t {
        // SAFETY: NEON register intrinsics only; NEON is part of the aarch64 baseline.
        unsafe {
            // Rows 0, 1 (low half of each granule) and 2, 3 (high half), a product per lane.
            let (mut lo, mut hi) = (vdupq_n_s16(0), vdupq_n_s16(0));
            for (g, &w) in q.iter().enumerate() {
                let yv = vreinterpretq_s32_s8(y[g / 4]);
                let y4 = vreinterpret_s8_s32(match g % 4 {
                    0 => vdup_laneq_s32::<0>(yv),
                    1 => vdup_laneq_s32::<1>(yv),
                    2 => vdup_laneq_s32::<2>(yv),
                    _ => vdup_laneq_s32::<3>(yv),
                });
                lo = vmlal_s8(lo, vget_low_s8(w), y4);
                hi = vmlal_s8(hi, vget_high_s8(w), y4);
            }
            // [r0 r0 r1 r1] and [r2 r2 r3 r3] in i32, then paired.
            vpaddq_s32(vpaddlq_s16(lo), vpaddlq_s16(hi))
        }
    }
}

impl Isa for Dotprod {
    #[inline(always)]
    unsafe fn dot<const G: usize>(q: &[int8x16_t; G], y: &[int8x16_t]) -> int32x4_t {
        // SAFETY: the caller guarantees dotprod (this trait method's contract); the rest are
        // baseline NEON register intrinsics.
        unsafe {
            let mut acc = vdupq_n_s32(0);
            for (i, q4) in q.chunks_exact(4).enumerate() {
                acc = sdot4(acc, q4.try_into().expect("4 granules"), y[i]);
            }
            acc
        }
    }
}

/// 16 bytes at `x[at..]`.
#[inline(always)]
fn load16(x: &[u8], at: usize) -> uint8x16_t {
    let x: &[u8; 16] = x[at..at + 16].try_into().expect("16 bytes");
    // SAFETY: the reference covers 16 readable bytes; `ld1` has no alignment requirement.
    unsafe { vld1q_u8(x.as_ptr()) }
}

/// Activation values `at..at + 16`.
#[inline(always)]
fn y16(y: &BlockQ8K, at: usize) -> int8x16_t {
    let q: &[i8; 16] = y.qs[at..at + 16].try_into().expect("16 values");
    // SAFETY: the reference covers 16 readable bytes; `ld1` has no alignment requirement.
    unsafe { vld1q_s8(q.as_ptr()) }
}

/// Byte `j` (0..4) of each lane, unsigned.
#[inline(always)]
fn byte_u(v: uint32x4_t, j: usize) -> int32x4_t {
    // SAFETY: baseline NEON register intrinsics.
    unsafe {
        let s = vshlq_u32(v, vdupq_n_s32(-8 * j as i32));
        vreinterpretq_s32_u32(vandq_u32(s, vdupq_n_u32(0xff)))
    }
}

/// Byte `j` (0..4) of each lane, as i8.
#[inline(always)]
fn byte_s(v: uint32x4_t, j: usize) -> int32x4_t {
    // SAFETY: baseline NEON register intrinsics.
    unsafe {
        let s = vshlq_s32(vreinterpretq_s32_u32(v), vdupq_n_s32(24 - 8 * j as i32));
        vshrq_n_s32::<24>(s)
    }
}

/// The per-row results of one block for `T` tokens: `sumi[t][h]` and `off[t][h]` for rows
/// `4h..4h + 4`.
type Sums<const T: usize> = ([[int32x4_t; 2]; T], [[int32x4_t; 2]; T]);

/// A packed K-quant block's integer sums.
trait PkK: Copy {
    const HAS_MIN: bool;
    /// # Safety
    /// As [`Isa::dot`] for `I`.
    unsafe fn sums<I: Isa, const T: usize>(p: &Self, ys: &[&BlockQ8K; T]) -> Sums<T>;
    fn d(p: &Self) -> [float32x4_t; 2];
    fn dmin(p: &Self) -> [float32x4_t; 2];
}

/// Rows `4h..4h + 4`: their 6-bit scales of sub-blocks 0..4 and 4..8 and mins of 0..4 and
/// 4..8, a byte each per lane (`get_scale_min_k4` for four rows at once).
#[inline(always)]
fn q45_scales(scales: &[u8; 96], h: usize) -> [uint32x4_t; 4] {
    let w = |c: usize| {
        // SAFETY: a register reinterpretation.
        unsafe { vreinterpretq_u32_u8(load16(scales, 32 * c + 16 * h)) }
    };
    let (w0, w1, w2) = (w(0), w(1), w(2));
    // SAFETY: baseline NEON register intrinsics.
    unsafe {
        let m6 = vdupq_n_u32(0x3f3f_3f3f);
        let m4 = vdupq_n_u32(0x0f0f_0f0f);
        let m2 = vdupq_n_u32(0x0303_0303);
        let top = |x: uint32x4_t| vshlq_n_u32::<4>(vandq_u32(vshrq_n_u32::<6>(x), m2));
        [
            vandq_u32(w0, m6),
            vorrq_u32(vandq_u32(w2, m4), top(w0)),
            vandq_u32(w1, m6),
            vorrq_u32(vandq_u32(vshrq_n_u32::<4>(w2), m4), top(w1)),
        ]
    }
}

/// Q4_K (`qh = None`) or Q5_K (layout as in `x86/kpacked.rs`).
///
/// # Safety
/// As [`Isa::dot`] for `I`.
#[inline(always)]
unsafe fn q45_sums<I: Isa, const T: usize>(
    qs: &[u8; 1024],
    qh: Option<&[u8; 256]>,
    scales: &[u8; 96],
    ys: &[&BlockQ8K; T],
) -> Sums<T> {
    // SAFETY: baseline NEON register intrinsics, and `I::dot`, which the caller vouches for.
    unsafe {
        let zero = vdupq_n_s32(0);
        let (mut sumi, mut off) = ([[zero; 2]; T], [[zero; 2]; T]);
        let m4 = vdupq_n_u8(0x0f);
        let sixteen = vdupq_n_u8(16);
        for h in 0..2 {
            let [sc_lo, sc_hi, mn_lo, mn_hi] = q45_scales(scales, h);
            for p in 0..4 {
                let sc = if p < 2 { sc_lo } else { sc_hi };
                let (s_lo, s_hi) = (byte_u(sc, (2 * p) % 4), byte_u(sc, (2 * p + 1) % 4));
                let mut lo = [vdupq_n_s8(0); 8];
                let mut hi = [vdupq_n_s8(0); 8];
                for c in 0..8 {
                    let v = load16(qs, 32 * (8 * p + c) + 16 * h);
                    let (mut l, mut u) = (vandq_u8(v, m4), vshrq_n_u8::<4>(v));
                    if let Some(qh) = qh {
                        let bits = load16(qh, 32 * c + 16 * h);
                        let b1 = vdupq_n_u8(1 << (2 * p));
                        let b2 = vdupq_n_u8(2 << (2 * p));
                        l = vorrq_u8(l, vandq_u8(vtstq_u8(bits, b1), sixteen));
                        u = vorrq_u8(u, vandq_u8(vtstq_u8(bits, b2), sixteen));
                    }
                    lo[c] = vreinterpretq_s8_u8(l);
                    hi[c] = vreinterpretq_s8_u8(u);
                }
                for t in 0..T {
                    let y = ys[t];
                    let yl = [y16(y, 64 * p), y16(y, 64 * p + 16)];
                    let yh = [y16(y, 64 * p + 32), y16(y, 64 * p + 48)];
                    let s = vmlaq_s32(sumi[t][h], I::dot(&lo, &yl), s_lo);
                    sumi[t][h] = vmlaq_s32(s, I::dot(&hi, &yh), s_hi);
                }
            }
            // Mins: `Σ_j min_j · (bsums[2j] + bsums[2j + 1])`.
            for j in 0..8 {
                let m = byte_u(if j < 4 { mn_lo } else { mn_hi }, j % 4);
                for t in 0..T {
                    let bs = ys[t].bsums[2 * j] as i32 + ys[t].bsums[2 * j + 1] as i32;
                    off[t][h] = vmlaq_n_s32(off[t][h], m, bs);
                }
            }
        }
        (sumi, off)
    }
}

impl PkK for BlockQ4Kx8 {
    const HAS_MIN: bool = true;
    #[inline(always)]
    unsafe fn sums<I: Isa, const T: usize>(p: &Self, ys: &[&BlockQ8K; T]) -> Sums<T> {
        // SAFETY: passed on from the caller.
        unsafe { q45_sums::<I, T>(&p.qs, None, &p.scales, ys) }
    }
    #[inline(always)]
    fn d(p: &Self) -> [float32x4_t; 2] {
        f32x8(&p.d)
    }
    #[inline(always)]
    fn dmin(p: &Self) -> [float32x4_t; 2] {
        f32x8(&p.dmin)
    }
}

impl PkK for BlockQ5Kx8 {
    const HAS_MIN: bool = true;
    #[inline(always)]
    unsafe fn sums<I: Isa, const T: usize>(p: &Self, ys: &[&BlockQ8K; T]) -> Sums<T> {
        // SAFETY: passed on from the caller.
        unsafe { q45_sums::<I, T>(&p.qs, Some(&p.qh), &p.scales, ys) }
    }
    #[inline(always)]
    fn d(p: &Self) -> [float32x4_t; 2] {
        f32x8(&p.d)
    }
    #[inline(always)]
    fn dmin(p: &Self) -> [float32x4_t; 2] {
        f32x8(&p.dmin)
    }
}

impl PkK for BlockQ6Kx8 {
    const HAS_MIN: bool = false;
    #[inline(always)]
    unsafe fn sums<I: Isa, const T: usize>(p: &Self, ys: &[&BlockQ8K; T]) -> Sums<T> {
        // SAFETY: passed on from the caller.
        unsafe { q6_sums::<I, T>(p, ys) }
    }
    #[inline(always)]
    fn d(p: &Self) -> [float32x4_t; 2] {
        f32x8(&p.d)
    }
    #[inline(always)]
    fn dmin(_: &Self) -> [float32x4_t; 2] {
        // SAFETY: baseline NEON register intrinsic.
        unsafe { [vdupq_n_f32(0.0); 2] }
    }
}

/// Eight f16 as two f32 vectors (rows 0..4, 4..8), exactly.
#[inline(always)]
fn f32x8(h: &[crate::block::f16; 8]) -> [float32x4_t; 2] {
    let v = load_h8(h);
    [h2f_lo(v), h2f_hi(v)]
}

/// Q6_K (layout as in `x86/kpacked.rs`): value `128n + 32k + l` from `ql` granule
/// `16n + 8(k & 1) + l / 4` and `qh` granule `8n + l / 4`, sub-block `8n + 2k + l / 16`.
///
/// # Safety
/// As [`Isa::dot`] for `I`.
#[inline(always)]
unsafe fn q6_sums<I: Isa, const T: usize>(p: &BlockQ6Kx8, ys: &[&BlockQ8K; T]) -> Sums<T> {
    let scales: &[u8; 128] = bytemuck::cast_ref(&p.scales);
    // SAFETY: baseline NEON register intrinsics, and `I::dot`, which the caller vouches for.
    unsafe {
        let zero = vdupq_n_s32(0);
        let (mut sumi, mut off) = ([[zero; 2]; T], [[zero; 2]; T]);
        let m2 = vdupq_n_u8(0x03);
        for h in 0..2 {
            let sc: [uint32x4_t; 4] =
                core::array::from_fn(|c| vreinterpretq_u32_u8(load16(scales, 32 * c + 16 * h)));
            for n in 0..2 {
                for hh in 0..2 {
                    for k in 0..4 {
                        let i = 8 * n + 2 * k + hh;
                        let s = byte_s(sc[i / 4], i % 4);
                        let q: [int8x16_t; 4] = core::array::from_fn(|c| {
                            let l4 = 4 * hh + c;
                            let ql = load16(&p.ql, 32 * (16 * n + 8 * (k & 1) + l4) + 16 * h);
                            let qh = load16(&p.qh, 32 * (8 * n + l4) + 16 * h);
                            // The level's two high bits alone in each byte, then shifted
                            // in above its low nibble: `sli` keeps only the destination's
                            // low four bits, so the low nibbles need no mask.
                            let hb = match k {
                                0 => vandq_u8(qh, m2),
                                1 => vandq_u8(vshrq_n_u8::<2>(qh), m2),
                                2 => vandq_u8(vshrq_n_u8::<4>(qh), m2),
                                _ => vshrq_n_u8::<6>(qh),
                            };
                            let lo = if k < 2 { ql } else { vshrq_n_u8::<4>(ql) };
                            vreinterpretq_s8_u8(vsliq_n_u8::<4>(lo, hb))
                        });
                        for t in 0..T {
                            let y = [y16(ys[t], 128 * n + 32 * k + 16 * hh)];
                            sumi[t][h] = vmlaq_s32(sumi[t][h], I::dot(&q, &y), s);
                            // The levels' offset: `32 · scale_i · bsums[i]`.
                            off[t][h] = vmlaq_n_s32(off[t][h], s, 32 * ys[t].bsums[i] as i32);
                        }
                    }
                }
            }
        }
        (sumi, off)
    }
}

/// Group `g` (blocks `g · nb..` of `w`) × tokens `t0..t0 + T`, into `out` (`[row][tok]`).
///
/// # Safety
/// As [`Isa::dot`] for `I`; `w` holds group `g`, `a` `n_tok` tokens of `nb` blocks, `out` the
/// group's rows × `n_tok`.
#[inline(always)]
unsafe fn tile<P: PkK, I: Isa, const T: usize>(
    w: &[P],
    nb: usize,
    a: &[BlockQ8K],
    n_tok: usize,
    g: usize,
    t0: usize,
    out: &mut [f32],
) {
    // SAFETY: baseline NEON register intrinsics, and `P::sums`, as the caller vouches for `I`.
    unsafe {
        let zero = vdupq_n_f32(0.0);
        let (mut acc, mut mins) = ([[zero; 2]; T], [[zero; 2]; T]);
        let wg = &w[g * nb..(g + 1) * nb];
        for (b, p) in wg.iter().enumerate() {
            if t0 == 0 {
                // The first token tile streams the weights from memory, out of order within
                // a block (as on x86).
                prefetch_ahead(w, g * nb + b);
            }
            let ys: [&BlockQ8K; T] = core::array::from_fn(|j| &a[(t0 + j) * nb + b]);
            let (sumi, off) = P::sums::<I, T>(p, &ys);
            let (d, dmin) = (P::d(p), P::dmin(p));
            for j in 0..T {
                let da = ys[j].d;
                for h in 0..2 {
                    let si = if P::HAS_MIN {
                        let dm = vmulq_n_f32(dmin[h], da);
                        mins[j][h] = vfmaq_f32(mins[j][h], vcvtq_f32_s32(off[j][h]), dm);
                        sumi[j][h]
                    } else {
                        vsubq_s32(sumi[j][h], off[j][h])
                    };
                    let dd = vmulq_n_f32(d[h], da);
                    acc[j][h] = vfmaq_f32(acc[j][h], vcvtq_f32_s32(si), dd);
                }
            }
        }
        for j in 0..T {
            for h in 0..2 {
                let mut l = [0.0f32; 4];
                vst1q_f32(l.as_mut_ptr(), vsubq_f32(acc[j][h], mins[j][h]));
                for (k, x) in l.iter().enumerate() {
                    out[(g * PACK_ROWS + 4 * h + k) * n_tok + t0 + j] = *x;
                }
            }
        }
    }
}

/// Every group × token, a group at a time (one sequential stream of weights).
///
/// # Safety
/// As [`Isa::dot`] for `I`; shapes as `check_packed` checks them, `nb > 0`.
#[inline(always)]
unsafe fn run<P: PkK, I: Isa>(w: &[P], a: &[BlockQ8K], nb: usize, n_tok: usize, out: &mut [f32]) {
    let groups = out.len() / n_tok / PACK_ROWS;
    for g in 0..groups {
        let mut t = 0;
        // SAFETY (both calls): passed on from the caller.
        while t + TOKS <= n_tok {
            unsafe { tile::<P, I, TOKS>(w, nb, a, n_tok, g, t, out) };
            t += TOKS;
        }
        if t < n_tok {
            unsafe { tile::<P, I, 1>(w, nb, a, n_tok, g, t, out) };
        }
    }
}

/// [`run`] on base NEON.
///
/// # Safety
/// Shapes as [`run`] (base NEON is the aarch64 baseline).
unsafe fn run_neon<P: PkK>(w: &[P], a: &[BlockQ8K], nb: usize, n_tok: usize, out: &mut [f32]) {
    // SAFETY: `Neon` needs nothing beyond the aarch64 baseline; shapes passed on.
    unsafe { run::<P, Neon>(w, a, nb, n_tok, out) }
}

packed_k_table!("base NEON", "the aarch64 baseline", run_neon);

/// With `sdot`: only in the DOTPROD and I8MM tables.
pub(super) mod dotprod {
    use super::*;

    /// [`run`] with `sdot`.
    ///
    /// # Safety
    /// The CPU has dotprod; shapes as [`run`].
    #[target_feature(enable = "dotprod")]
    unsafe fn run_dotprod<P: PkK>(
        w: &[P],
        a: &[BlockQ8K],
        nb: usize,
        n_tok: usize,
        out: &mut [f32],
    ) {
        // SAFETY: this function runs with dotprod; shapes passed on.
        unsafe { run::<P, Dotprod>(w, a, nb, n_tok, out) }
    }

    packed_k_table!("dotprod", "dotprod", run_dotprod);
}
