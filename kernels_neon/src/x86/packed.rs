//! Products over weights interleaved eight rows at a time ([`BlockQ4_0x8`], …), for the
//! `avx512vnni` table: the layout the engine packs at load for decoding.
//!
//! One 32-byte load holds four bytes of each of eight rows, so one `vpdpbusd` against four
//! broadcast activation bytes leaves every row's partial sum in its own i32 lane: no
//! horizontal reduction, no per-row scale gathering (the eight scales are one `vcvtph2ps`),
//! and the matrix is one sequential stream. Per (row, token) pair and block the float
//! sequence is [`super::matmul`]'s tile's, `fma(f32(sumi), d_w * d_a, acc)` (then
//! `fma(m, s, acc)` for Q4_1), so the results are the AVX2 kernels' bits on the unpacked rows.

use super::dot::{Fmt, Q4_0, Q4_1, Q5_0, Q8_0Vnni, dpbusd, isum_bcast};
use super::matmul::chunk_scalars;
use super::simd::{load_ph, store_ps};
use crate::block::{
    BlockQ4_0x8, BlockQ4_1x8, BlockQ5_0x8, BlockQ8_0, BlockQ8_0x8, BlockQ8_1, PACK_ROWS,
    PackedFormat,
};
use std::arch::x86_64::*;
use std::mem::MaybeUninit;

/// A packed format as these kernels see it: its values as eight u8 vectors, vector `j` to be
/// multiplied with activation bytes `4j..4j+4`, and the activation scalars of the row format
/// (`F`: the `d`, the Q4_1 sum, or the integer correction of the unsigned values).
trait Pk: PackedFormat {
    type F: Fmt;
    /// # Safety
    /// Needs avx2, fma and f16c.
    unsafe fn values(p: &Self) -> [__m256i; 8];
    /// # Safety
    /// Needs avx2, fma and f16c.
    unsafe fn scales(p: &Self) -> (__m256, __m256);
    /// Where the activation block's integer correction lies (`Fmt::as_corr`), for formats
    /// that have one: a prompt tile broadcasts it from memory.
    fn corr(s: &<Self::F as Fmt>::AS) -> Option<&i32>;
}

/// Q4 values of a packed block: granule `c`'s low nibbles are values `4c..4c+4` (vector `c`),
/// its high nibbles values `16 + 4c..` (vector `4 + c`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn q4_values(qs: &[u8; 128]) -> [__m256i; 8] {
    let m = _mm256_set1_epi8(0x0f);
    let mut v = [_mm256_setzero_si256(); 8];
    for c in 0..4 {
        // SAFETY: `qs[32c..32c+32]` is in bounds (c < 4); `loadu` needs no alignment.
        let q = unsafe { _mm256_loadu_si256(qs[32 * c..].as_ptr().cast()) };
        v[c] = _mm256_and_si256(q, m);
        v[4 + c] = _mm256_and_si256(_mm256_srli_epi16::<4>(q), m);
    }
    v
}

impl Pk for BlockQ4_0x8 {
    type F = Q4_0;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn values(p: &Self) -> [__m256i; 8] {
        q4_values(&p.qs)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scales(p: &Self) -> (__m256, __m256) {
        (load_ph(&p.d), _mm256_setzero_ps())
    }
    #[inline]
    fn corr(s: &(f32, i32)) -> Option<&i32> {
        Some(&s.1)
    }
}

impl Pk for BlockQ4_1x8 {
    type F = Q4_1;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn values(p: &Self) -> [__m256i; 8] {
        q4_values(&p.qs)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scales(p: &Self) -> (__m256, __m256) {
        (load_ph(&p.d), load_ph(&p.m))
    }
    #[inline]
    fn corr(_: &(f32, f32)) -> Option<&i32> {
        None
    }
}

/// Granule `C` of a packed Q5_0 block: its nibbles `q` with their fifth bits from `h` (the
/// block's `qh`, bit `C` of a byte for the low nibble, bit `4 + C` for the high one) moved to
/// bit 4. `L = 4 - C` and `R = C` are the shifts that do it; 16-bit shifts are exact here, as
/// no bit crosses into bit 4 of the neighbouring byte.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn q5_granule<const L: i32, const R: i32>(q: __m256i, h: __m256i) -> (__m256i, __m256i) {
    let (m, b4) = (_mm256_set1_epi8(0x0f), _mm256_set1_epi8(0x10));
    let lo = _mm256_or_si256(
        _mm256_and_si256(q, m),
        _mm256_and_si256(_mm256_slli_epi16::<L>(h), b4),
    );
    let hi = _mm256_or_si256(
        _mm256_and_si256(_mm256_srli_epi16::<4>(q), m),
        _mm256_and_si256(_mm256_srli_epi16::<R>(h), b4),
    );
    (lo, hi)
}

impl Pk for BlockQ5_0x8 {
    /// Values 0..32 with `16 * sum(y)` taken off, as the unpacked Q5_0 product.
    type F = Q5_0;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn values(p: &Self) -> [__m256i; 8] {
        // SAFETY: `qh` is 32 bytes and `qs[32c..32c+32]` is in bounds (c < 4); `loadu` needs
        // no alignment.
        let h = unsafe { _mm256_loadu_si256(p.qh.as_ptr().cast()) };
        let mut q = [_mm256_setzero_si256(); 4];
        for (c, q) in q.iter_mut().enumerate() {
            // SAFETY: as above.
            *q = unsafe { _mm256_loadu_si256(p.qs[32 * c..].as_ptr().cast()) };
        }
        let g = [
            q5_granule::<4, 0>(q[0], h),
            q5_granule::<3, 1>(q[1], h),
            q5_granule::<2, 2>(q[2], h),
            q5_granule::<1, 3>(q[3], h),
        ];
        [
            g[0].0, g[1].0, g[2].0, g[3].0, g[0].1, g[1].1, g[2].1, g[3].1,
        ]
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scales(p: &Self) -> (__m256, __m256) {
        (load_ph(&p.d), _mm256_setzero_ps())
    }
    #[inline]
    fn corr(s: &(f32, i32)) -> Option<&i32> {
        Some(&s.1)
    }
}

impl Pk for BlockQ8_0x8 {
    /// Signed weights as `x ^ 0x80 = x + 128` (unsigned, as `vpdpbusd` takes them) with the
    /// correction `128 * sum(y)`, as the unpacked VNNI product.
    type F = Q8_0Vnni;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn values(p: &Self) -> [__m256i; 8] {
        let flip = _mm256_set1_epi8(-128);
        let mut v = [_mm256_setzero_si256(); 8];
        for (c, v) in v.iter_mut().enumerate() {
            // SAFETY: `qs[32c..32c+32]` is in bounds (c < 8); `loadu` needs no alignment.
            let q = unsafe { _mm256_loadu_si256(p.qs[32 * c..].as_ptr().cast()) };
            *v = _mm256_xor_si256(q, flip);
        }
        v
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scales(p: &Self) -> (__m256, __m256) {
        (load_ph(&p.d), _mm256_setzero_ps())
    }
    #[inline]
    fn corr(s: &(f32, i32)) -> Option<&i32> {
        Some(&s.1)
    }
}

/// Activation blocks whose scalars a product converts at a time (on the stack).
const SCRATCH: usize = 2048;
/// Tokens per tile of a matrix-matrix product (one group of 8 rows).
const TOKS: usize = 4;

/// The four activation bytes `4j..4j+4`, broadcast.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn y4(y: &[i8; 32], j: usize) -> __m256i {
    let q = &y[4 * j..4 * j + 4];
    _mm256_set1_epi32(i32::from_le_bytes([
        q[0] as u8, q[1] as u8, q[2] as u8, q[3] as u8,
    ]))
}

/// `vals · y` per lane (exact), in two chains (a chain of eight `vpdpbusd` is latency-bound).
///
/// # Safety
/// avx512vnni and avx512vl besides this function's features.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn isum(vals: &[__m256i; 8], y: &[i8; 32]) -> __m256i {
    let mut part = [_mm256_setzero_si256(); 2];
    for (j, &v) in vals.iter().enumerate() {
        // SAFETY: the caller guarantees avx512vnni and avx512vl.
        part[j % 2] = unsafe { dpbusd(part[j % 2], v, y4(y, j)) };
    }
    _mm256_add_epi32(part[0], part[1])
}

/// One block's step of a (row group, token) accumulator: the tile's float sequence.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn step<F: Fmt>(acc: __m256, sumi: __m256i, scales: (__m256, __m256), s: &F::AS) -> __m256 {
    let sumi = if F::HAS_CORR {
        _mm256_sub_epi32(sumi, _mm256_set1_epi32(F::as_corr(s)))
    } else {
        sumi
    };
    step_corrected::<F>(acc, sumi, scales, s)
}

/// [`step`] on a block sum whose correction is already subtracted.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn step_corrected<F: Fmt>(
    acc: __m256,
    sumi: __m256i,
    (wd, wm): (__m256, __m256),
    s: &F::AS,
) -> __m256 {
    let scale = _mm256_mul_ps(wd, _mm256_set1_ps(F::as_d(s)));
    let acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), scale, acc);
    if F::HAS_MIN {
        _mm256_fmadd_ps(wm, _mm256_set1_ps(F::as_s(s)), acc)
    } else {
        acc
    }
}

/// Access to the activation blocks' `y` bytes, whatever their format.
trait Act: Copy {
    fn qs(&self) -> &[i8; 32];
}
impl Act for BlockQ8_0 {
    #[inline]
    fn qs(&self) -> &[i8; 32] {
        &self.qs
    }
}
impl Act for BlockQ8_1 {
    #[inline]
    fn qs(&self) -> &[i8; 32] {
        &self.qs
    }
}

/// `out` (`[row][tok]`) for every group of `w`, in chunks of activation blocks whose scalars
/// are converted once; a group × 1 token per pass when `n_tok == 1`, else a group × `TOKS`
/// tokens.
///
/// # Safety
/// avx512vnni and avx512vl besides this function's features; shapes as [`check_packed`].
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn run<P: Pk>(w: &[P], a: &[<P::F as Fmt>::A], nb: usize, n_tok: usize, out: &mut [f32])
where
    <P::F as Fmt>::A: Act,
{
    let groups = out.len() / n_tok / PACK_ROWS;
    let kb_max = nb.min(SCRATCH);
    let tc = (SCRATCH / kb_max).max(1);
    let mut scratch = [const { MaybeUninit::<<P::F as Fmt>::AS>::uninit() }; SCRATCH];
    let mut t0 = 0;
    while t0 < n_tok {
        let tcn = tc.min(n_tok - t0);
        let mut k0 = 0;
        while k0 < nb {
            let kb = kb_max.min(nb - k0);
            let sc = chunk_scalars::<P::F>(a, (nb, t0, tcn, k0, kb), &mut scratch);
            let ch = Chunk {
                w,
                a,
                sc,
                nb,
                n_tok,
                k0,
                kb,
                t0,
            };
            if n_tok == 1 {
                for g in 0..groups {
                    // SAFETY: as this function.
                    unsafe { mv_tile::<P>(&ch, g, out) };
                }
            } else {
                for g in 0..groups {
                    let mut t = t0;
                    while t < t0 + tcn {
                        let rn = TOKS.min(t0 + tcn - t);
                        // SAFETY: as this function.
                        unsafe {
                            match rn {
                                TOKS => mm_tile::<P, TOKS>(&ch, g, t, out),
                                1 => mm_tile::<P, 1>(&ch, g, t, out),
                                2 => mm_tile::<P, 2>(&ch, g, t, out),
                                _ => mm_tile::<P, 3>(&ch, g, t, out),
                            }
                        }
                        t += rn;
                    }
                }
            }
            k0 += kb;
        }
        t0 += tcn;
    }
}

/// A product's operands and the chunk being worked on: blocks `k0..k0 + kb` of every group and
/// token, tokens `t0..` with their scalars in `sc` (`sc[(t - t0) * kb + b]`).
struct Chunk<'a, P: Pk> {
    w: &'a [P],
    a: &'a [<P::F as Fmt>::A],
    sc: &'a [<P::F as Fmt>::AS],
    nb: usize,
    n_tok: usize,
    k0: usize,
    kb: usize,
    t0: usize,
}

/// The accumulators of rows `8g..8g+8` × token `t` (read back unless this is the first chunk).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn load_acc(out: &[f32], n_tok: usize, g: usize, t: usize, first: bool) -> __m256 {
    if first {
        return _mm256_setzero_ps();
    }
    let l: [f32; 8] = std::array::from_fn(|k| out[(g * PACK_ROWS + k) * n_tok + t]);
    super::simd::load_ps(&l)
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn store_acc(out: &mut [f32], n_tok: usize, g: usize, t: usize, acc: __m256) {
    let mut l = [0.0f32; 8];
    store_ps(&mut l, acc);
    for (k, v) in l.iter().enumerate() {
        out[(g * PACK_ROWS + k) * n_tok + t] = *v;
    }
}

/// Group `g`, one token. One group at a time keeps the whole product one sequential stream,
/// which the hardware prefetchers follow at the memory's bandwidth (measured on Zen 4: two
/// groups side by side, i.e. two streams 2.6 KB apart, ran a cold product at a third of it,
/// and software prefetching on top of the single stream gained nothing).
///
/// # Safety
/// avx512vnni and avx512vl besides this function's features.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn mv_tile<P: Pk>(c: &Chunk<'_, P>, g: usize, out: &mut [f32])
where
    <P::F as Fmt>::A: Act,
{
    let (nb, kb, k0) = (c.nb, c.kb, c.k0);
    let mut acc = load_acc(out, 1, g, 0, k0 == 0);
    let wg = &c.w[g * nb + k0..][..kb];
    let ys = &c.a[k0..][..kb];
    for ((p, y), s) in wg.iter().zip(ys).zip(c.sc) {
        // SAFETY: avx2, fma, f16c as this function; avx512vnni and avx512vl by contract.
        let sumi = unsafe { isum(&P::values(p), y.qs()) };
        // SAFETY: as above.
        acc = step::<P::F>(acc, sumi, unsafe { P::scales(p) }, s);
    }
    store_acc(out, 1, g, 0, acc);
}

/// One token's activation blocks of a chunk and their scalars.
type TokenBlocks<'a, P> = (
    &'a [<<P as Pk>::F as Fmt>::A],
    &'a [<<P as Pk>::F as Fmt>::AS],
);

/// Group `g` × tokens `t..t + RN`: each block's values unpacked once for the `RN` tokens, the
/// tokens written out one by one so that their accumulators stay in registers.
///
/// # Safety
/// avx512vnni and avx512vl besides this function's features.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn mm_tile<P: Pk, const RN: usize>(c: &Chunk<'_, P>, g: usize, t: usize, out: &mut [f32])
where
    <P::F as Fmt>::A: Act,
{
    const { assert!(RN >= 1 && RN <= 4) };
    let (nb, kb, k0, n) = (c.nb, c.kb, c.k0, c.n_tok);
    let mut acc: [__m256; 4] = std::array::from_fn(|j| {
        if j < RN {
            load_acc(out, n, g, t + j, k0 == 0)
        } else {
            _mm256_setzero_ps()
        }
    });
    let wg = &c.w[g * nb + k0..][..kb];
    let tok = |j: usize| -> TokenBlocks<'_, P> {
        let j = j.min(RN - 1);
        (
            &c.a[(t + j) * nb + k0..][..kb],
            &c.sc[(t - c.t0 + j) * kb..][..kb],
        )
    };
    let (t0, t1, t2, t3) = (tok(0), tok(1), tok(2), tok(3));
    for (b, p) in wg.iter().enumerate() {
        // SAFETY: avx2, fma, f16c as this function.
        let (vals, sc) = unsafe { (P::values(p), P::scales(p)) };
        let token = |acc: &mut __m256, (a, s): TokenBlocks<'_, P>| {
            let s = &s[b];
            // SAFETY: avx512vnni and avx512vl by contract.
            let sumi = unsafe { isum_bcast(&vals, a[b].qs(), P::corr(s)) };
            *acc = step_corrected::<P::F>(*acc, sumi, sc, s);
        };
        token(&mut acc[0], t0);
        if RN > 1 {
            token(&mut acc[1], t1);
        }
        if RN > 2 {
            token(&mut acc[2], t2);
        }
        if RN > 3 {
            token(&mut acc[3], t3);
        }
    }
    for (j, acc) in acc.iter().take(RN).enumerate() {
        store_acc(out, n, g, t + j, *acc);
    }
}

packed_table!(
    "AVX2 + AVX512-VNNI",
    "avx2, fma, f16c, avx512vnni, avx512vl"
);
