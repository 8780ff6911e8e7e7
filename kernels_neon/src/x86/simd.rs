//! Small AVX2 building blocks shared by the kernels: loads and stores from references,
//! horizontal reductions, f16 scalars and a vectorised `exp`.
//!
//! Every function here is `#[target_feature(enable = "avx2,fma,f16c")]`: it can only be
//! called from code that itself runs with those features (the kernels of the AVX2 table,
//! which `dispatch` hands out only after runtime detection), or through `unsafe`.

use crate::block::f16;
use std::arch::x86_64::*;

/// Loads 8 f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn load_ps(x: &[f32; 8]) -> __m256 {
    // SAFETY: the reference covers 32 readable bytes; `loadu` has no alignment requirement.
    unsafe { _mm256_loadu_ps(x.as_ptr()) }
}

/// Stores 8 f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn store_ps(x: &mut [f32; 8], v: __m256) {
    // SAFETY: the reference covers 32 writable bytes; `storeu` has no alignment requirement.
    unsafe { _mm256_storeu_ps(x.as_mut_ptr(), v) }
}

/// Loads 32 signed bytes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn load_i8x32(x: &[i8; 32]) -> __m256i {
    // SAFETY: the reference covers 32 readable bytes; `loadu` has no alignment requirement.
    unsafe { _mm256_loadu_si256(x.as_ptr().cast()) }
}

/// Stores 32 signed bytes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn store_i8x32(x: &mut [i8; 32], v: __m256i) {
    // SAFETY: the reference covers 32 writable bytes; `storeu` has no alignment requirement.
    unsafe { _mm256_storeu_si256(x.as_mut_ptr().cast(), v) }
}

/// Loads 8 f16 and widens them (exact).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn load_ph(x: &[f16; 8]) -> __m256 {
    // SAFETY: the reference covers 16 readable bytes; `loadu` has no alignment requirement.
    let h = unsafe { _mm_loadu_si128(x.as_ptr().cast()) };
    _mm256_cvtph_ps(h)
}

/// Narrows 8 f32 to f16, round-to-nearest-even, and stores them.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn store_ph(x: &mut [f16; 8], v: __m256) {
    let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
    // SAFETY: the reference covers 16 writable bytes; `storeu` has no alignment requirement.
    unsafe { _mm_storeu_si128(x.as_mut_ptr().cast(), h) }
}

/// f16 → f32 of one value (exact).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn f16_to_f32(h: f16) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h.to_bits() as i32)))
}

/// Sum of the 8 lanes, always in the same order (so that a row's result does not depend on
/// which kernel computed it).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn hsum_ps(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// Maximum of the 8 lanes (no NaN in `v`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn hmax_ps(v: __m256) -> f32 {
    let s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_max_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// Sum of the 8 i32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn hsum_epi32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01>(s));
    _mm_cvtsi128_si32(s)
}

/// Adds the 8 lanes of `v` to two f64x4 accumulators (for sums that ggml keeps in f64).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn acc_pd(acc: &mut [__m256d; 2], v: __m256) {
    acc[0] = _mm256_add_pd(acc[0], _mm256_cvtps_pd(_mm256_castps256_ps128(v)));
    acc[1] = _mm256_add_pd(acc[1], _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(v)));
}

/// Sum of two f64x4 accumulators.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn hsum_pd(acc: [__m256d; 2]) -> f64 {
    let v = _mm256_add_pd(acc[0], acc[1]);
    let s = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd::<1>(v));
    let s = _mm_add_sd(s, _mm_unpackhi_pd(s, s));
    _mm_cvtsd_f64(s)
}

/// `e^x` lanewise, within ~2 ulp of `f32::exp` over the whole range: Cephes' `expf`
/// (`x = n ln2 + r`, degree-7 polynomial in `r`), with `2^n` applied in two halves so that
/// results down to the subnormals and up to `f32::MAX` are right; `-inf` and anything below
/// the smallest subnormal give 0, above `ln(f32::MAX)` +inf, NaN stays NaN.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn exp_ps(x: __m256) -> __m256 {
    const LO: f32 = -104.0;
    const HI: f32 = 88.722_84;
    // ln 2 split as Cephes does: 0.693359375 (exact in 9 bits) + -2.12194440e-4.
    const LN2_HI: f32 = f32::from_bits(0x3f31_8000);
    // `max(LO, x)` / `min(HI, ..)` return their second operand when it is NaN: NaN survives.
    let xc = _mm256_min_ps(_mm256_set1_ps(HI), _mm256_max_ps(_mm256_set1_ps(LO), x));
    let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
        xc,
        _mm256_set1_ps(std::f32::consts::LOG2_E),
    ));
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_HI), xc);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.121_944_4e-4), r);
    let mut p = _mm256_set1_ps(1.987_569_1e-4);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.398_2e-3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.333_452e-3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.166_579_6e-2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.666_666_5e-1));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5));
    let y = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r);
    let y = _mm256_add_ps(y, _mm256_set1_ps(1.0));
    // 2^n = 2^n1 * 2^n2 with both halves normal for n in [-150, 128].
    let ni = _mm256_cvtps_epi32(n);
    let n1 = _mm256_srai_epi32::<1>(ni);
    let n2 = _mm256_sub_epi32(ni, n1);
    let bias = _mm256_set1_epi32(127);
    let p1 = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(n1, bias)));
    let p2 = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(n2, bias)));
    let res = _mm256_mul_ps(_mm256_mul_ps(y, p1), p2);
    let res = _mm256_blendv_ps(
        res,
        _mm256_set1_ps(f32::INFINITY),
        _mm256_cmp_ps::<_CMP_GT_OQ>(x, _mm256_set1_ps(HI)),
    );
    // Zero below LO (including -inf); NaN compares "not less than" and is kept.
    _mm256_and_ps(res, _mm256_cmp_ps::<_CMP_NLT_UQ>(x, _mm256_set1_ps(LO)))
}
