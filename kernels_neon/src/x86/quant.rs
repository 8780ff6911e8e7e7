//! Activation quantizers, byte-identical to the references (`d = amax / 127`,
//! `id = d ? 1/d : 0`, round half away from zero like C's `roundf`, saturating like `as i8`).
//! ggml's own AVX2 quantizer rounds half to even and multiplies by `127/amax`; ours may not.

use super::simd::{hmax_ps, hsum_epi32, load_ps, store_i8x32};
use crate::block::{BlockQ8_0, BlockQ8_1, QK8_0, QK8_1, f16};
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
    unsafe { q8_0_body(x, y) }
}

/// `quantize_row_q8_1` (AVX2).
pub(crate) fn quantize_row_q8_1(x: &[f32], y: &mut [BlockQ8_1]) {
    assert_eq!(
        x.len(),
        y.len() * QK8_1,
        "quantize_row_q8_1: length mismatch"
    );
    // SAFETY: only reachable through the AVX2 table (avx2, fma and f16c detected at runtime).
    unsafe { q8_1_body(x, y) }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn q8_0_body(x: &[f32], y: &mut [BlockQ8_0]) {
    for (xb, yb) in x.as_chunks::<QK8_0>().0.iter().zip(y) {
        let (d, q) = quantize_block(xb);
        yb.d = f16::from_f32(d);
        store_i8x32(&mut yb.qs, pack(q));
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn q8_1_body(x: &[f32], y: &mut [BlockQ8_1]) {
    for (xb, yb) in x.as_chunks::<QK8_1>().0.iter().zip(y) {
        let (d, q) = quantize_block(xb);
        yb.d = f16::from_f32(d);
        let sum = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
        yb.s = f16::from_f32(hsum_epi32(sum) as f32 * d);
        store_i8x32(&mut yb.qs, pack(q));
    }
}

/// One block: the scale `d` and the 32 quantized values as 4×8 i32 in `-128..=127`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn quantize_block(xb: &[f32; 32]) -> (f32, [__m256i; 4]) {
    let v: [__m256; 4] = std::array::from_fn(|k| load_ps(xb[k * 8..][..8].try_into().unwrap()));
    let sign = _mm256_set1_ps(-0.0);
    let zero = _mm256_setzero_ps();
    // `max_ps(a, b)` returns `b` when either is NaN, so `max_ps(|v|, acc)` skips NaN exactly
    // like the reference's `f32::max` fold from 0.
    let abs = |k: usize| _mm256_andnot_ps(sign, v[k]);
    let m01 = _mm256_max_ps(abs(1), _mm256_max_ps(abs(0), zero));
    let m23 = _mm256_max_ps(abs(3), _mm256_max_ps(abs(2), zero));
    let amax = hmax_ps(_mm256_max_ps(m01, m23));

    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let idv = _mm256_set1_ps(id);
    let half = _mm256_set1_ps(0.5);
    let one = _mm256_set1_ps(1.0);
    let q = std::array::from_fn(|k| {
        let t = _mm256_mul_ps(v[k], idv);
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
    });
    (d, q)
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
