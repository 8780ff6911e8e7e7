//! K-quant products (Q4_K, Q5_K, Q6_K against Q8_K activations), AVX2.
//!
//! A super-block (256 values) is unpacked once into eight registers of 32 unsigned levels
//! (0..16, 0..32 or 0..64) and its sub-block scales; each token then takes eight `maddubs` +
//! `madd` pairs against its activations, scaled per sub-block as i16, into one i32 vector: the
//! block's exact integer sum, reduced to one i32. The mins (Q4_K, Q5_K) and Q6_K's -32 offset
//! go through the activations' 16-value sums (`bsums`), in scalar integers. The f32 work is
//! then one sequence per (row, token) pair, the same on every SIMD path (NEON's too, so greedy
//! ids agree across architectures) and whatever called it (`vec_dot`, `matvec`, `matmul`):
//! per block `acc = fma(d_w · d_a, f32(sumi), acc)` and `mins = fma(dmin_w · d_a, f32(m), mins)`,
//! and `acc - mins` at the end. The walk's tolerance covers the reference's other order.
//!
//! No level times activation pair overflows `maddubs`' i16: 63 · 127 · 2 < 2^15.
//!
//! The `avx512vnni` table runs the same code with each `madd` + `add` of a product with its
//! scales fused into one `vpdpwssd` ([`Vnni`]): the same exact i32 sums, so the same bits.

use super::dot::dpwssd;
use super::simd::{f16_to_f32, load_i8x32};
use crate::block::{BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K, QK_K, f16};
use crate::kseq::{finish_block_off, scales_mins};
use crate::reference::{check_matmul, check_matvec};
use std::arch::x86_64::*;

/// Tokens of a matrix-matrix product that share one unpacking of a super-block (4, 8, 16:
/// pp128 of Gemma 3 Q4_K_M ~490, 550, 587 t/s on one Zen 4 thread, `edgellm bench`).
const MM_TOKS: usize = 16;

/// A super-block unpacked: the levels of values `32j..32j + 32` in `q[j]`, the scale of each
/// 16-value half of them (`scale[j]`: low half, high half, as i16 lanes), and what the
/// activations' 16-value sums are multiplied by (`bsum_mul`: the mins, or Q6_K's offset).
struct Unpacked {
    q: [__m256i; 8],
    scale: [__m256i; 8],
    d: f32,
    /// `Σ bsum_mul[i] · bsums[i]` is subtracted: times `dmin` apart from the block's sum
    /// (Q4_K, Q5_K: the mins, as the reference); with `dmin = None` from the integer sum itself
    /// (Q6_K: `32 · scale`, its levels' offset, so the block's sum stays exact). As 16 i16
    /// lanes (mins < 64; `32 · scale` within ±4096), for one `madd` against the `bsums`.
    bsum_mul: __m256i,
    dmin: Option<f32>,
}

trait KFormat {
    type W;
    fn unpack(w: &Self::W) -> Unpacked;
}

/// `acc + madd(p, scale)`: how a path adds a product's scaled pairs into its i32 sum.
trait Madd {
    /// # Safety
    /// The features of the enclosing `target_feature` body, and the table's own (see impls).
    unsafe fn madd_add(acc: __m256i, p: __m256i, scale: __m256i) -> __m256i;
}

/// AVX2: `madd` then `add`.
struct Avx2;
impl Madd for Avx2 {
    #[inline(always)]
    unsafe fn madd_add(acc: __m256i, p: __m256i, scale: __m256i) -> __m256i {
        // SAFETY: avx2, as every body of this file has.
        unsafe { _mm256_add_epi32(acc, _mm256_madd_epi16(p, scale)) }
    }
}

/// AVX-512 VNNI: one `vpdpwssd` ([`dpwssd`]): the same i32 sums as `madd` + `add` (nothing
/// comes near overflow: `|p| < 2^15`, scales within ±128).
struct Vnni;
impl Madd for Vnni {
    #[inline(always)]
    unsafe fn madd_add(acc: __m256i, p: __m256i, scale: __m256i) -> __m256i {
        // SAFETY: passed on from the caller (reached only through the `avx512vnni` table).
        unsafe { dpwssd(acc, p, scale) }
    }
}

/// Two i16 scales for the two 16-value halves of a 32-value register.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn scale_pair(lo: i16, hi: i16) -> __m256i {
    _mm256_set_m128i(_mm_set1_epi16(hi), _mm_set1_epi16(lo))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn load_u8x32(x: &[u8]) -> __m256i {
    let x: &[u8; 32] = x[..32].try_into().expect("32 bytes");
    // SAFETY: the reference covers 32 readable bytes; `loadu` has no alignment requirement.
    unsafe { _mm256_loadu_si256(x.as_ptr().cast()) }
}

/// 16 i16 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn load_i16x16(x: &[i16; 16]) -> __m256i {
    // SAFETY: the reference covers 32 readable bytes; `loadu` has no alignment requirement.
    unsafe { _mm256_loadu_si256(x.as_ptr().cast()) }
}

/// Q4_K and Q5_K scales (as i16 lanes) and mins, per 16 values.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn k_scales(scales: &[u8; 12]) -> ([__m256i; 8], __m256i) {
    let (sc, mins) = scales_mins(scales);
    // One scale per 32-value register: both its halves have sub-block j's. Mins are 6 bits.
    (
        std::array::from_fn(|j| _mm256_set1_epi16(sc[2 * j] as i16)),
        load_i16x16(&mins.map(|m| m as i16)),
    )
}

struct Q4K;
impl KFormat for Q4K {
    type W = BlockQ4K;
    #[inline(always)]
    fn unpack(w: &BlockQ4K) -> Unpacked {
        // SAFETY: called only from the `target_feature` bodies below.
        unsafe { unpack_q4_q5(&w.qs, None, &w.scales, w.d, w.dmin) }
    }
}

struct Q5K;
impl KFormat for Q5K {
    type W = BlockQ5K;
    #[inline(always)]
    fn unpack(w: &BlockQ5K) -> Unpacked {
        // SAFETY: called only from the `target_feature` bodies below.
        unsafe { unpack_q4_q5(&w.qs, Some(&w.qh), &w.scales, w.d, w.dmin) }
    }
}

/// A Q4_K block (`qh = None`) or a Q5_K block with its fifth bits: sub-block `2p` is the low
/// nibbles of `qs[32p..]`, `2p + 1` the high ones; bit `2p` / `2p + 1` of `qh[l]` is value
/// `l`'s fifth bit in them.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn unpack_q4_q5(
    qs: &[u8; 128],
    qh: Option<&[u8; 32]>,
    scales: &[u8; 12],
    d: f16,
    dmin: f16,
) -> Unpacked {
    let m4 = _mm256_set1_epi8(0x0f);
    let sixteen = _mm256_set1_epi8(16);
    let qh = qh.map(|h| load_u8x32(h));
    let bit = |k: usize| match qh {
        Some(qh) => {
            let m = _mm256_set1_epi8((1u8 << k) as i8);
            _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, m), m), sixteen)
        }
        None => _mm256_setzero_si256(),
    };
    let mut q = [_mm256_setzero_si256(); 8];
    for p in 0..4 {
        let b = load_u8x32(&qs[32 * p..]);
        q[2 * p] = _mm256_or_si256(_mm256_and_si256(b, m4), bit(2 * p));
        q[2 * p + 1] = _mm256_or_si256(
            _mm256_and_si256(_mm256_srli_epi16::<4>(b), m4),
            bit(2 * p + 1),
        );
    }
    let (scale, bsum_mul) = k_scales(scales);
    Unpacked {
        q,
        scale,
        d: f16_to_f32(d),
        bsum_mul,
        dmin: Some(f16_to_f32(dmin)),
    }
}

struct Q6K;
impl KFormat for Q6K {
    type W = BlockQ6K;
    #[inline(always)]
    fn unpack(w: &BlockQ6K) -> Unpacked {
        // SAFETY: called only from the `target_feature` bodies below.
        unsafe { unpack_q6k(w) }
    }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn unpack_q6k(w: &BlockQ6K) -> Unpacked {
    let m4 = _mm256_set1_epi8(0x0f);
    let m2 = _mm256_set1_epi8(0x03);
    let mut q = [_mm256_setzero_si256(); 8];
    let mut scale = [_mm256_setzero_si256(); 8];
    let mut bsum_mul = [0i16; 16];
    for n in 0..2 {
        let ql0 = load_u8x32(&w.ql[64 * n..]);
        let ql1 = load_u8x32(&w.ql[64 * n + 32..]);
        let qh = load_u8x32(&w.qh[32 * n..]);
        // High two bits of the four values at l, l + 32, l + 64, l + 96 (`q6_values`).
        let hi = |s: i32| {
            let h = match s {
                0 => qh,
                2 => _mm256_srli_epi16::<2>(qh),
                4 => _mm256_srli_epi16::<4>(qh),
                _ => _mm256_srli_epi16::<6>(qh),
            };
            _mm256_slli_epi16::<4>(_mm256_and_si256(h, m2))
        };
        let lo0 = _mm256_and_si256(ql0, m4);
        let lo1 = _mm256_and_si256(ql1, m4);
        let up0 = _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), m4);
        let up1 = _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), m4);
        q[4 * n] = _mm256_or_si256(lo0, hi(0));
        q[4 * n + 1] = _mm256_or_si256(lo1, hi(2));
        q[4 * n + 2] = _mm256_or_si256(up0, hi(4));
        q[4 * n + 3] = _mm256_or_si256(up1, hi(6));
        for k in 0..4 {
            // Values l + 32k, l in 0..16 and 16..32: scales 8n + 2k and 8n + 2k + 1.
            let (a, b) = (w.scales[8 * n + 2 * k], w.scales[8 * n + 2 * k + 1]);
            scale[4 * n + k] = scale_pair(a as i16, b as i16);
            bsum_mul[8 * n + 2 * k] = 32 * a as i16;
            bsum_mul[8 * n + 2 * k + 1] = 32 * b as i16;
        }
    }
    Unpacked {
        q,
        scale,
        d: f16_to_f32(w.d),
        bsum_mul: load_i16x16(&bsum_mul),
        dmin: None,
    }
}

/// The sums of the 8 i32 lanes of `v` and of `o`, reduced together.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn hsum2_epi32(v: __m256i, o: __m256i) -> (i32, i32) {
    // [v01 v23 o01 o23 | v45 v67 o45 o67], then the halves added, then the pairs.
    let h = _mm256_hadd_epi32(v, o);
    let s = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h));
    let s = _mm_hadd_epi32(s, s);
    (_mm_cvtsi128_si32(s), _mm_extract_epi32::<1>(s))
}

/// One block's contribution for one token: `acc = fma(d · d_a, f32(sumi), acc)`, and the mins'
/// `mins = fma(dmin · d_a, f32(Σ bsum_mul · bsums), mins)`, or that sum taken from `sumi`
/// when there is no `dmin` (exact). Both integer sums in vector lanes, reduced together.
///
/// # Safety
/// As [`Madd::madd_add`] for `S`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn block<S: Madd>(u: &Unpacked, a: &BlockQ8K, acc: &mut f32, mins: &mut f32) {
    let mut v = _mm256_setzero_si256();
    for j in 0..8 {
        let y = load_i8x32(a.qs[32 * j..32 * j + 32].try_into().expect("32 values"));
        let p = _mm256_maddubs_epi16(u.q[j], y);
        // SAFETY: passed on from the caller.
        v = unsafe { S::madd_add(v, p, u.scale[j]) };
    }
    let o = _mm256_madd_epi16(load_i16x16(&a.bsums), u.bsum_mul);
    let (sumi, off) = hsum2_epi32(v, o);
    finish_block_off(sumi, off, u.d, u.dmin, a.d, acc, mins);
}

/// `out[t] = dot(row, a[t])` for `T` tokens of `nb` blocks each (`a`: `T · nb` blocks).
///
/// # Safety
/// As [`Madd::madd_add`] for `S`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn row_tokens<F: KFormat, S: Madd, const T: usize>(
    row: &[F::W],
    a: &[BlockQ8K],
    out: &mut [f32],
) {
    let nb = row.len();
    let mut acc = [0.0f32; T];
    let mut mins = [0.0f32; T];
    for (b, w) in row.iter().enumerate() {
        let u = F::unpack(w);
        for t in 0..T {
            // SAFETY: passed on from the caller.
            unsafe { block::<S>(&u, &a[t * nb + b], &mut acc[t], &mut mins[t]) };
        }
    }
    for t in 0..T {
        out[t] = acc[t] - mins[t];
    }
}

/// `out[r · n_tok + t] = dot(w[r], a[t])`: rows one at a time, `MM_TOKS` tokens per unpacking.
///
/// # Safety
/// As [`Madd::madd_add`] for `S`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn product<F: KFormat, S: Madd>(
    w: &[F::W],
    a: &[BlockQ8K],
    nb: usize,
    n_tok: usize,
    out: &mut [f32],
) {
    for (row, o) in w.chunks_exact(nb).zip(out.chunks_exact_mut(n_tok)) {
        let mut t = 0;
        // SAFETY (both calls): passed on from the caller.
        while t + MM_TOKS <= n_tok {
            let a = &a[t * nb..(t + MM_TOKS) * nb];
            unsafe { row_tokens::<F, S, MM_TOKS>(row, a, &mut o[t..]) };
            t += MM_TOKS;
        }
        while t < n_tok {
            let a = &a[t * nb..(t + 1) * nb];
            unsafe { row_tokens::<F, S, 1>(row, a, &mut o[t..]) };
            t += 1;
        }
    }
}

macro_rules! k_kernels {
    ($madd:ty, $fmt:ty, $w:ty, $dot:ident, $mv:ident, $mm:ident) => {
        #[doc = concat!("`vec_dot` of ", stringify!($w), " × Q8_K.")]
        pub(crate) fn $dot(x: &[$w], y: &[BlockQ8K]) -> f32 {
            assert_eq!(
                x.len(),
                y.len(),
                concat!(stringify!($dot), ": length mismatch")
            );
            if x.is_empty() {
                return 0.0;
            }
            let mut out = [0.0f32];
            // SAFETY: only reachable through the AVX2 tables, which `dispatch` hands out after
            // `is_x86_feature_detected!` confirmed avx2, fma and f16c (and, for the `Vnni`
            // kernels, only through the `avx512vnni` table: avx512vnni and avx512vl too);
            // lengths checked above.
            unsafe { product::<$fmt, $madd>(x, y, x.len(), 1, &mut out) };
            out[0]
        }

        #[doc = concat!("Matrix-vector product of ", stringify!($w), " × Q8_K.")]
        pub(crate) fn $mv(w: &[$w], a: &[BlockQ8K], out: &mut [f32]) {
            let nb = check_matvec(w, a, out);
            if nb == 0 || out.is_empty() {
                out.fill(0.0);
                return;
            }
            // SAFETY: as above; `check_matvec` guarantees `w.len() == out.len() * nb`.
            unsafe { product::<$fmt, $madd>(w, a, nb, 1, out) };
        }

        #[doc = concat!("Matrix-matrix product of ", stringify!($w), " × Q8_K.")]
        pub(crate) fn $mm(w: &[$w], a: &[BlockQ8K], n_tok: usize, out: &mut [f32]) {
            let (nb, rows) = check_matmul(w, a, n_tok, out);
            if nb == 0 || rows == 0 {
                out.fill(0.0);
                return;
            }
            // SAFETY: as above; `check_matmul` guarantees the shapes.
            unsafe { product::<$fmt, $madd>(w, a, nb, n_tok, out) };
        }
    };
}

/// The three formats' entry points over one way of adding the scaled pairs.
macro_rules! k_formats {
    ($madd:ty) => {
        k_kernels!(
            $madd,
            Q4K,
            BlockQ4K,
            vec_dot_q4_k_q8_k,
            matvec_q4_k_q8_k,
            matmul_q4_k_q8_k
        );
        k_kernels!(
            $madd,
            Q5K,
            BlockQ5K,
            vec_dot_q5_k_q8_k,
            matvec_q5_k_q8_k,
            matmul_q5_k_q8_k
        );
        k_kernels!(
            $madd,
            Q6K,
            BlockQ6K,
            vec_dot_q6_k_q8_k,
            matvec_q6_k_q8_k,
            matmul_q6_k_q8_k
        );
    };
}

k_formats!(Avx2);

/// The `avx512vnni` table's K-quant products: the AVX2 code with `vpdpwssd`.
pub(super) mod vnni {
    use super::*;
    k_formats!(Vnni);
}

const _: () = assert!(QK_K == 256);
