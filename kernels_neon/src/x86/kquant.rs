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

use super::simd::{f16_to_f32, hsum_epi32, load_i8x32};
use crate::block::{BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K, QK_K, f16};
use crate::kseq::{finish_block, scales_mins};
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
    /// (Q6_K: `32 · scale`, its levels' offset, so the block's sum stays exact).
    bsum_mul: [i32; 16],
    dmin: Option<f32>,
}

trait KFormat {
    type W;
    fn unpack(w: &Self::W) -> Unpacked;
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

/// Q4_K and Q5_K scales (as i16 lanes) and mins, per 16 values.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn k_scales(scales: &[u8; 12]) -> ([__m256i; 8], [i32; 16]) {
    let (sc, mins) = scales_mins(scales);
    // One scale per 32-value register: both its halves have sub-block j's.
    (
        std::array::from_fn(|j| _mm256_set1_epi16(sc[2 * j] as i16)),
        mins,
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
    let mut bsum_mul = [0i32; 16];
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
            bsum_mul[8 * n + 2 * k] = 32 * a as i32;
            bsum_mul[8 * n + 2 * k + 1] = 32 * b as i32;
        }
    }
    Unpacked {
        q,
        scale,
        d: f16_to_f32(w.d),
        bsum_mul,
        dmin: None,
    }
}

/// One block's contribution for one token: `acc = fma(d · d_a, f32(sumi), acc)`, and the mins'
/// `mins = fma(dmin · d_a, f32(Σ bsum_mul · bsums), mins)`, or that sum taken from `sumi`
/// when there is no `dmin` (exact).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn block(u: &Unpacked, a: &BlockQ8K, acc: &mut f32, mins: &mut f32) {
    let mut v = _mm256_setzero_si256();
    for j in 0..8 {
        let y = load_i8x32(a.qs[32 * j..32 * j + 32].try_into().expect("32 values"));
        let p = _mm256_maddubs_epi16(u.q[j], y);
        v = _mm256_add_epi32(v, _mm256_madd_epi16(p, u.scale[j]));
    }
    finish_block(hsum_epi32(v), u.d, u.dmin, &u.bsum_mul, a, acc, mins);
}

/// `out[t] = dot(row, a[t])` for `T` tokens of `nb` blocks each (`a`: `T · nb` blocks).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn row_tokens<F: KFormat, const T: usize>(row: &[F::W], a: &[BlockQ8K], out: &mut [f32]) {
    let nb = row.len();
    let mut acc = [0.0f32; T];
    let mut mins = [0.0f32; T];
    for (b, w) in row.iter().enumerate() {
        let u = F::unpack(w);
        for t in 0..T {
            block(&u, &a[t * nb + b], &mut acc[t], &mut mins[t]);
        }
    }
    for t in 0..T {
        out[t] = acc[t] - mins[t];
    }
}

/// `out[r · n_tok + t] = dot(w[r], a[t])`: rows one at a time, `MM_TOKS` tokens per unpacking.
#[target_feature(enable = "avx2,fma,f16c")]
fn product<F: KFormat>(w: &[F::W], a: &[BlockQ8K], nb: usize, n_tok: usize, out: &mut [f32]) {
    for (row, o) in w.chunks_exact(nb).zip(out.chunks_exact_mut(n_tok)) {
        let mut t = 0;
        while t + MM_TOKS <= n_tok {
            row_tokens::<F, MM_TOKS>(row, &a[t * nb..(t + MM_TOKS) * nb], &mut o[t..]);
            t += MM_TOKS;
        }
        while t < n_tok {
            row_tokens::<F, 1>(row, &a[t * nb..(t + 1) * nb], &mut o[t..]);
            t += 1;
        }
    }
}

macro_rules! k_kernels {
    ($fmt:ty, $w:ty, $dot:ident, $mv:ident, $mm:ident) => {
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
            // `is_x86_feature_detected!` confirmed avx2, fma and f16c; lengths checked above.
            unsafe { product::<$fmt>(x, y, x.len(), 1, &mut out) };
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
            unsafe { product::<$fmt>(w, a, nb, 1, out) };
        }

        #[doc = concat!("Matrix-matrix product of ", stringify!($w), " × Q8_K.")]
        pub(crate) fn $mm(w: &[$w], a: &[BlockQ8K], n_tok: usize, out: &mut [f32]) {
            let (nb, rows) = check_matmul(w, a, n_tok, out);
            if nb == 0 || rows == 0 {
                out.fill(0.0);
                return;
            }
            // SAFETY: as above; `check_matmul` guarantees the shapes.
            unsafe { product::<$fmt>(w, a, nb, n_tok, out) };
        }
    };
}

k_kernels!(
    Q4K,
    BlockQ4K,
    vec_dot_q4_k_q8_k,
    matvec_q4_k_q8_k,
    matmul_q4_k_q8_k
);
k_kernels!(
    Q5K,
    BlockQ5K,
    vec_dot_q5_k_q8_k,
    matvec_q5_k_q8_k,
    matmul_q5_k_q8_k
);
k_kernels!(
    Q6K,
    BlockQ6K,
    vec_dot_q6_k_q8_k,
    matvec_q6_k_q8_k,
    matmul_q6_k_q8_k
);

const _: () = assert!(QK_K == 256);
