//! Activation quantizers, byte-identical to the references (`d = amax / 127`,
//! `id = d ? 1/d : 0`, round half away from zero like C's `roundf`, saturating like `as i8`).
//! ggml's own AVX2 quantizer rounds half to even and multiplies by `127/amax`; ours may not.
//!
//! Blocks go 8 at a time so that their two dependent divisions (`d`, then `1/d`) and the f16
//! conversions of `d` (and `s`) are one vector instruction each instead of a latency chain
//! per block; the IEEE results are the same as the reference's scalar ones.
//!
//! Q8_K (the K-quants' activations) follows ggml's `quantize_row_q8_K` instead: the signed
//! value of largest magnitude, `iscale = -127 / max`, and `nearest_int`'s magic-number
//! rounding, which is the same bit operations on a vector.

use super::simd::{hmax_ps, hsum_epi32, load_ps, store_i8x32, store_ps};
use crate::block::{BlockQ8_0, BlockQ8_1, BlockQ8K, QK_K, QK8_0, QK8_1, f16};
use std::arch::x86_64::*;

/// `quantize_row_q8_0` (AVX2).
pub(crate) fn quantize_row_q8_0(x: &[f32], y: &mut [BlockQ8_0]) {
    assert_eq!(
        x.len(),
        y.len() * QK8_0,
        "quantize_row_q8_0: length mismatch"
    );
    // SAFETY: this function is only reachable through the AVX2 table, which `dispatch` hands
    // out after `is_x86_feature_detected!` confirmed avx2, fma and f16c.
    unsafe { quantize::<BlockQ8_0>(x, y) }
}

/// `quantize_row_q8_1` (AVX2).
pub(crate) fn quantize_row_q8_1(x: &[f32], y: &mut [BlockQ8_1]) {
    assert_eq!(
        x.len(),
        y.len() * QK8_1,
        "quantize_row_q8_1: length mismatch"
    );
    // SAFETY: only reachable through the AVX2 table (avx2, fma and f16c detected at runtime).
    unsafe { quantize::<BlockQ8_1>(x, y) }
}

/// `quantize_row_q8_k` (AVX2), byte-identical to the reference.
pub(crate) fn quantize_row_q8_k(x: &[f32], y: &mut [BlockQ8K]) {
    assert_eq!(
        x.len(),
        y.len() * QK_K,
        "quantize_row_q8_k: length mismatch"
    );
    // SAFETY: only reachable through the AVX2 tables (avx2, fma and f16c detected at runtime).
    unsafe { quantize_q8_k(x, y) }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn quantize_q8_k(x: &[f32], y: &mut [BlockQ8K]) {
    let sign = _mm256_set1_ps(-0.0);
    for (xb, yb) in x.as_chunks::<QK_K>().0.iter().zip(y.iter_mut()) {
        let (c, _) = xb.as_chunks::<8>();
        // The largest magnitude, NaN skipped as the reference's `amax < |v|` skips it:
        // `max_ps(|v|, m)` keeps `m` when `|v|` is NaN.
        let mut m = _mm256_setzero_ps();
        for v in c {
            m = _mm256_max_ps(_mm256_andnot_ps(sign, load_ps(v)), m);
        }
        let amax = hmax_ps(m);
        if amax == 0.0 {
            *yb = BlockQ8K::default();
            continue;
        }
        // Its first value, with its sign: the reference keeps the first of equal magnitudes.
        let at = _mm256_set1_ps(amax);
        let mut max = amax;
        for v in c {
            let eq = _mm256_cmp_ps::<_CMP_EQ_OQ>(_mm256_andnot_ps(sign, load_ps(v)), at);
            let lanes = _mm256_movemask_ps(eq);
            if lanes != 0 {
                max = v[lanes.trailing_zeros() as usize];
                break;
            }
        }
        let iscale = -127.0f32 / max;
        let is = _mm256_set1_ps(iscale);
        // `nearest_int(iscale * v)`: the bits of `iscale * v + 1.5 · 2^23`, masked.
        let magic = _mm256_set1_ps(12_582_912.0);
        let mant = _mm256_set1_epi32(0x007f_ffff);
        let off = _mm256_set1_epi32(0x0040_0000);
        let top = _mm256_set1_epi32(127);
        let byte = _mm256_set1_epi32(0xff);
        let (qs, _) = yb.qs.as_chunks_mut::<32>();
        for (v, q) in c.as_chunks::<4>().0.iter().zip(qs) {
            let l: [__m256i; 4] = std::array::from_fn(|k| {
                let t = _mm256_mul_ps(is, load_ps(&v[k]));
                let t = _mm256_castps_si256(_mm256_add_ps(t, magic));
                let n = _mm256_sub_epi32(_mm256_and_si256(t, mant), off);
                // `MIN(127, n)` stored into an int8_t: its low byte, as `as i8`.
                _mm256_and_si256(_mm256_min_epi32(n, top), byte)
            });
            // Bytes 0..=255 in every i32 lane: the unsigned packs do not saturate.
            let p = _mm256_packus_epi16(
                _mm256_packus_epi32(l[0], l[1]),
                _mm256_packus_epi32(l[2], l[3]),
            );
            let p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            store_i8x32(q, p);
        }
        for (s, q) in yb.bsums.iter_mut().zip(yb.qs.chunks_exact(16)) {
            *s = q.iter().map(|&v| v as i32).sum::<i32>() as i16;
        }
        yb.d = 1.0 / iscale;
    }
}

/// The two 8-bit activation blocks: Q8_1 also stores `s = d * sum(q)`.
trait Q8Block {
    const HAS_SUM: bool;
    /// `d`, `s` (Q8_1) and the values.
    fn parts(&mut self) -> (&mut f16, Option<&mut f16>, &mut [i8; 32]);
}

impl Q8Block for BlockQ8_0 {
    const HAS_SUM: bool = false;
    #[inline]
    fn parts(&mut self) -> (&mut f16, Option<&mut f16>, &mut [i8; 32]) {
        (&mut self.d, None, &mut self.qs)
    }
}

impl Q8Block for BlockQ8_1 {
    const HAS_SUM: bool = true;
    #[inline]
    fn parts(&mut self) -> (&mut f16, Option<&mut f16>, &mut [i8; 32]) {
        (&mut self.d, Some(&mut self.s), &mut self.qs)
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn quantize<B: Q8Block>(x: &[f32], y: &mut [B]) {
    let (xb, _) = x.as_chunks::<32>();
    for (x8, y8) in xb.chunks(8).zip(y.chunks_mut(8)) {
        // Pad a short last group with zero blocks (d = 0, nothing stored for them).
        let mut v = [[_mm256_setzero_ps(); 4]; 8];
        let mut amax = [0.0f32; 8];
        for (k, b) in x8.iter().enumerate() {
            v[k] = load_block(b);
            amax[k] = block_amax(&v[k]);
        }
        let d = _mm256_div_ps(load_ps(&amax), _mm256_set1_ps(127.0));
        let inv = _mm256_div_ps(_mm256_set1_ps(1.0), d);
        let id = _mm256_and_ps(inv, _mm256_cmp_ps::<_CMP_NEQ_OQ>(d, _mm256_setzero_ps()));
        let mut ids = [0.0f32; 8];
        store_ps(&mut ids, id);
        let mut q = [[_mm256_setzero_si256(); 4]; 8];
        let mut sums = [0i32; 8];
        for k in 0..x8.len() {
            q[k] = quantize_values(&v[k], ids[k]);
            if B::HAS_SUM {
                let s = _mm256_add_epi32(
                    _mm256_add_epi32(q[k][0], q[k][1]),
                    _mm256_add_epi32(q[k][2], q[k][3]),
                );
                sums[k] = hsum_epi32(s);
            }
        }
        let dh: [u16; 8] = to_f16x8(d);
        let sh: [u16; 8] = if B::HAS_SUM {
            // SAFETY: `sums` is 8 i32 = 32 readable bytes; `loadu` has no alignment requirement.
            let si = unsafe { _mm256_loadu_si256(sums.as_ptr().cast()) };
            to_f16x8(_mm256_mul_ps(_mm256_cvtepi32_ps(si), d))
        } else {
            [0; 8]
        };
        for (k, yb) in y8.iter_mut().enumerate() {
            let (d, s, qs) = yb.parts();
            *d = f16::from_bits(dh[k]);
            if let Some(s) = s {
                *s = f16::from_bits(sh[k]);
            }
            store_i8x32(qs, pack(q[k]));
        }
    }
}

/// f32 → f16 bits, round to nearest even (F16C, as `half` does).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn to_f16x8(v: __m256) -> [u16; 8] {
    let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
    let mut out = [0u16; 8];
    // SAFETY: `out` is 16 writable bytes; `storeu` has no alignment requirement.
    unsafe { _mm_storeu_si128(out.as_mut_ptr().cast(), h) };
    out
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn load_block(xb: &[f32; 32]) -> [__m256; 4] {
    let (c, _) = xb.as_chunks::<8>();
    [
        load_ps(&c[0]),
        load_ps(&c[1]),
        load_ps(&c[2]),
        load_ps(&c[3]),
    ]
}

/// `max |v|` of a block, skipping NaN like the reference's `f32::max` fold from 0:
/// `max_ps(a, b)` returns `b` when either is NaN, so `max_ps(|v|, acc)` keeps `acc`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn block_amax(v: &[__m256; 4]) -> f32 {
    let sign = _mm256_set1_ps(-0.0);
    let zero = _mm256_setzero_ps();
    let m01 = _mm256_max_ps(
        _mm256_andnot_ps(sign, v[1]),
        _mm256_max_ps(_mm256_andnot_ps(sign, v[0]), zero),
    );
    let m23 = _mm256_max_ps(
        _mm256_andnot_ps(sign, v[3]),
        _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), zero),
    );
    let m = _mm256_max_ps(m01, m23);
    // No NaN left: any reduction order.
    hmax_ps(m)
}

/// `round(v * id) as i8` for the 32 values, as 4×8 i32 in `-128..=127`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn quantize_values(v: &[__m256; 4], id: f32) -> [__m256i; 4] {
    let sign = _mm256_set1_ps(-0.0);
    let idv = _mm256_set1_ps(id);
    let half = _mm256_set1_ps(0.5);
    let one = _mm256_set1_ps(1.0);
    v.map(|x| {
        let t = _mm256_mul_ps(x, idv);
        // `as i8` semantics: NaN → 0, then saturate (clamping first rounds the same way).
        let t = _mm256_and_ps(t, _mm256_cmp_ps::<_CMP_ORD_Q>(t, t));
        let t = _mm256_min_ps(
            _mm256_max_ps(t, _mm256_set1_ps(-128.0)),
            _mm256_set1_ps(127.0),
        );
        // Round half away from zero: `t - trunc(t)` is exact.
        let tr = _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(t);
        let frac = _mm256_andnot_ps(sign, _mm256_sub_ps(t, tr));
        let away = _mm256_or_ps(_mm256_and_ps(t, sign), one);
        let up = _mm256_and_ps(_mm256_cmp_ps::<_CMP_GE_OQ>(frac, half), away);
        _mm256_cvttps_epi32(_mm256_add_ps(tr, up))
    })
}

/// Packs 4×8 i32 (already in i8 range) into 32 bytes in order.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn pack(q: [__m256i; 4]) -> __m256i {
    let p = _mm256_packs_epi16(
        _mm256_packs_epi32(q[0], q[1]),
        _mm256_packs_epi32(q[2], q[3]),
    );
    _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
}
