//! Per-block integer dot products of the three weight formats (ggml's `maddubs`/`madd` path)
//! behind one trait, so that the register tiles in `matmul.rs` are written once.
//!
//! The integer sum of a block is exact whatever the instruction sequence, so each format may
//! prepare its operands differently from ggml (Q4_0 keeps the nibbles unsigned and subtracts
//! `8 * y` per pair instead of using `sign`) without changing any result.

use super::simd::{f16_to_f32, load_i8x32, unpack_nibbles};
use crate::block::{BlockQ4_0, BlockQ4_1, BlockQ8_0, BlockQ8_1, f16};
use std::arch::x86_64::*;

/// A weight format as the AVX2 tiles see it.
///
/// # Safety
/// The `unsafe fn`s are `#[target_feature(enable = "avx2,fma,f16c")]`: callers must run with
/// those features (every caller is itself such a function, reached from the AVX2 table).
pub(super) trait Fmt {
    /// Weight block.
    type W: Copy;
    /// Activation block.
    type A: Copy;
    /// A weight block prepared for [`Fmt::isum`] (computed once, used for every token).
    type WP: Copy;
    /// An activation block prepared for [`Fmt::isum`] (computed once, used for every row).
    type AP: Copy;
    /// Whether the format has the `m * s` offset term (Q4_1).
    const HAS_MIN: bool;

    /// A placeholder value (to initialise arrays).
    unsafe fn wp_zero() -> Self::WP;
    unsafe fn prep_w(w: &Self::W) -> Self::WP;
    unsafe fn prep_a(a: &Self::A) -> Self::AP;
    /// Eight i32 whose sum is the block's exact integer dot product.
    unsafe fn isum(w: Self::WP, a: Self::AP) -> __m256i;
    fn w_d(w: &Self::W) -> f16;
    /// The weight offset `m` (0 unless `HAS_MIN`).
    fn w_m(w: &Self::W) -> f16;
    fn a_d(a: &Self::A) -> f16;
    /// The activation sum `s` (0 unless `HAS_MIN`).
    fn a_s(a: &Self::A) -> f16;
}

/// Q4_0 × Q8_0: `sum((q - 8) * y) = sum(q * y) - sum(8 * y)`, both through `maddubs` with the
/// unsigned nibbles (`8 * y` pairs are computed once per activation block).
pub(super) struct Q4_0;

impl Fmt for Q4_0 {
    type W = BlockQ4_0;
    type A = BlockQ8_0;
    type WP = __m256i;
    type AP = (__m256i, __m256i);
    const HAS_MIN: bool = false;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn wp_zero() -> __m256i {
        _mm256_setzero_si256()
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn prep_w(w: &BlockQ4_0) -> __m256i {
        unpack_nibbles(&w.qs)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn prep_a(a: &BlockQ8_0) -> (__m256i, __m256i) {
        let y = load_i8x32(&a.qs);
        (y, _mm256_maddubs_epi16(_mm256_set1_epi8(8), y))
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn isum(x: __m256i, (y, y8): (__m256i, __m256i)) -> __m256i {
        // Pairs: |q*y + q'*y'| <= 2*15*127 and |8y + 8y'| <= 2032: no i16 saturation.
        let p = _mm256_sub_epi16(_mm256_maddubs_epi16(x, y), y8);
        _mm256_madd_epi16(p, _mm256_set1_epi16(1))
    }
    #[inline]
    fn w_d(w: &BlockQ4_0) -> f16 {
        w.d
    }
    #[inline]
    fn w_m(_: &BlockQ4_0) -> f16 {
        f16::ZERO
    }
    #[inline]
    fn a_d(a: &BlockQ8_0) -> f16 {
        a.d
    }
    #[inline]
    fn a_s(_: &BlockQ8_0) -> f16 {
        f16::ZERO
    }
}

/// Q4_1 × Q8_1: `maddubs` of the unsigned nibbles and the activations; `m * s` added apart.
pub(super) struct Q4_1;

impl Fmt for Q4_1 {
    type W = BlockQ4_1;
    type A = BlockQ8_1;
    type WP = __m256i;
    type AP = __m256i;
    const HAS_MIN: bool = true;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn wp_zero() -> __m256i {
        _mm256_setzero_si256()
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn prep_w(w: &BlockQ4_1) -> __m256i {
        unpack_nibbles(&w.qs)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn prep_a(a: &BlockQ8_1) -> __m256i {
        load_i8x32(&a.qs)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn isum(x: __m256i, y: __m256i) -> __m256i {
        _mm256_madd_epi16(_mm256_maddubs_epi16(x, y), _mm256_set1_epi16(1))
    }
    #[inline]
    fn w_d(w: &BlockQ4_1) -> f16 {
        w.d
    }
    #[inline]
    fn w_m(w: &BlockQ4_1) -> f16 {
        w.m
    }
    #[inline]
    fn a_d(a: &BlockQ8_1) -> f16 {
        a.d
    }
    #[inline]
    fn a_s(a: &BlockQ8_1) -> f16 {
        a.s
    }
}

/// Q8_0 × Q8_0: ggml's sign trick, `maddubs(|x|, sign(y, x))`. `|x| <= 127` for quantizer
/// output (and 128 for a stray -128, still without i16 saturation: 2*128*127 < 32768).
pub(super) struct Q8_0;

impl Fmt for Q8_0 {
    type W = BlockQ8_0;
    type A = BlockQ8_0;
    type WP = (__m256i, __m256i);
    type AP = __m256i;
    const HAS_MIN: bool = false;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn wp_zero() -> (__m256i, __m256i) {
        (_mm256_setzero_si256(), _mm256_setzero_si256())
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn prep_w(w: &BlockQ8_0) -> (__m256i, __m256i) {
        let x = load_i8x32(&w.qs);
        (_mm256_sign_epi8(x, x), x)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn prep_a(a: &BlockQ8_0) -> __m256i {
        load_i8x32(&a.qs)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn isum((ax, x): (__m256i, __m256i), y: __m256i) -> __m256i {
        let p = _mm256_maddubs_epi16(ax, _mm256_sign_epi8(y, x));
        _mm256_madd_epi16(p, _mm256_set1_epi16(1))
    }
    #[inline]
    fn w_d(w: &BlockQ8_0) -> f16 {
        w.d
    }
    #[inline]
    fn w_m(_: &BlockQ8_0) -> f16 {
        f16::ZERO
    }
    #[inline]
    fn a_d(a: &BlockQ8_0) -> f16 {
        a.d
    }
    #[inline]
    fn a_s(_: &BlockQ8_0) -> f16 {
        f16::ZERO
    }
}

/// Converts a row of f16 scales to f32 (used for the activations' `d` and `s`).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn scales_to_f32(h: impl Iterator<Item = f16>, out: &mut Vec<f32>) {
    out.clear();
    out.extend(h.map(|v| f16_to_f32(v)));
}
