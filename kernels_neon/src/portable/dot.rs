//! Per-block integer dot products on `wide` 128-bit vectors.
//!
//! The 32 bytes of a block are read as 16-bit lanes; the even and odd bytes of each lane are
//! split with shifts (sign-extending the activations) and multiplied pairwise with `i16x8::dot`
//! (`pmaddwd` on SSE2, `smull`+`addp` on NEON). Weights and activations are split the same way,
//! so the pairing holds on either endianness. The result is 4 i32 whose sum is the block's
//! exact integer dot product.

use crate::block::{BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0, BlockQ8_1, f16};
use bytemuck::cast;
use wide::{CmpEq, i16x8, i32x4, u16x8};

/// A weight format as the portable tiles see it.
pub(super) trait Fmt {
    type W: Copy;
    type A: Copy;
    /// A weight block prepared for [`Fmt::isum`].
    type WP: Copy;
    /// An activation block prepared for [`Fmt::isum`].
    type AP: Copy;
    /// Whether the format has the `m * s` offset term (Q4_1).
    const HAS_MIN: bool;
    fn prep_w(w: &Self::W) -> Self::WP;
    fn prep_a(a: &Self::A) -> Self::AP;
    /// Four i32 whose sum is the block's exact integer dot product.
    fn isum(w: &Self::WP, a: &Self::AP) -> i32x4;
    fn w_d(w: &Self::W) -> f16;
    /// The weight offset `m` (0 unless `HAS_MIN`).
    fn w_m(w: &Self::W) -> f16;
    fn a_d(a: &Self::A) -> f16;
    /// The activation sum `s` (0 unless `HAS_MIN`).
    fn a_s(a: &Self::A) -> f16;
}

/// Signed bytes of 32: `[even 0..16, odd 0..16, even 16..32, odd 16..32]`, sign-extended.
#[inline]
fn split_i8(qs: &[i8; 32]) -> [i16x8; 4] {
    let [lo, hi]: [i16x8; 2] = cast(*qs);
    [(lo << 8) >> 8, lo >> 8, (hi << 8) >> 8, hi >> 8]
}

/// Nibbles of a Q4 block in the order of [`split_i8`]: low nibbles are values 0..16, high
/// nibbles 16..32, each split into even and odd bytes.
#[inline]
fn split_nibbles(qs: &[u8; 16]) -> [i16x8; 4] {
    let q: u16x8 = cast(*qs);
    let m = u16x8::splat(0x0f);
    [
        cast(q & m),
        cast((q >> 8) & m),
        cast((q >> 4) & m),
        cast(q >> 12),
    ]
}

/// The fifth bits of a Q5 block (`qh`: bit `j` for value `j`, little-endian) as 16 or 0, in
/// the order of [`split_nibbles`].
#[inline]
fn split_fifth_bits(qh: [u8; 4]) -> [i16x8; 4] {
    // Lane k of the even groups holds value 2k (bit 2k), of the odd groups value 2k+1.
    const EVEN: [u16; 8] = [1, 1 << 2, 1 << 4, 1 << 6, 1 << 8, 1 << 10, 1 << 12, 1 << 14];
    const ODD: [u16; 8] = [
        1 << 1,
        1 << 3,
        1 << 5,
        1 << 7,
        1 << 9,
        1 << 11,
        1 << 13,
        1 << 15,
    ];
    let q = u32::from_le_bytes(qh);
    let (lo, hi) = (
        i16x8::splat(q as u16 as i16),
        i16x8::splat((q >> 16) as u16 as i16),
    );
    let bits = |x: i16x8, m: [u16; 8]| {
        (x & cast::<_, i16x8>(m))
            .cmp_eq(i16x8::ZERO)
            .blend(i16x8::ZERO, i16x8::splat(16))
    };
    [bits(lo, EVEN), bits(lo, ODD), bits(hi, EVEN), bits(hi, ODD)]
}

/// The values of a Q5 block, 0..32, in the order of [`split_i8`].
#[inline]
fn split_q5(qs: &[u8; 16], qh: [u8; 4]) -> [i16x8; 4] {
    let (n, h) = (split_nibbles(qs), split_fifth_bits(qh));
    [n[0] | h[0], n[1] | h[1], n[2] | h[2], n[3] | h[3]]
}

#[inline]
fn dot4(x: &[i16x8; 4], y: &[i16x8; 4]) -> i32x4 {
    (x[0].dot(y[0]) + x[1].dot(y[1])) + (x[2].dot(y[2]) + x[3].dot(y[3]))
}

/// A format whose weight and activation blocks are both read as four `i16x8` (the order of
/// [`split_i8`]): the closures give a weight block's values, then its offset `m` and the
/// activation's sum `s` when the format has them (Q4_1, Q5_1: the tile adds `m * s`).
macro_rules! fmt {
    ($doc:literal, $f:ident, $w:ty, $a:ty, |$x:ident| $prep:expr,
     min: $m:expr, |$mw:pat_param| $me:expr, |$sa:pat_param| $se:expr) => {
        #[doc = $doc]
        pub(super) struct $f;

        impl Fmt for $f {
            type W = $w;
            type A = $a;
            type WP = [i16x8; 4];
            type AP = [i16x8; 4];
            const HAS_MIN: bool = $m;
            #[inline]
            fn prep_w($x: &$w) -> [i16x8; 4] {
                $prep
            }
            #[inline]
            fn prep_a(a: &$a) -> [i16x8; 4] {
                split_i8(&a.qs)
            }
            #[inline]
            fn isum(w: &[i16x8; 4], a: &[i16x8; 4]) -> i32x4 {
                dot4(w, a)
            }
            #[inline]
            fn w_d(w: &$w) -> f16 {
                w.d
            }
            #[inline]
            fn w_m($mw: &$w) -> f16 {
                $me
            }
            #[inline]
            fn a_d(a: &$a) -> f16 {
                a.d
            }
            #[inline]
            fn a_s($sa: &$a) -> f16 {
                $se
            }
        }
    };
}

fmt!("Q4_0 × Q8_0.", Q4_0, BlockQ4_0, BlockQ8_0,
    |w| split_nibbles(&w.qs).map(|v| v - i16x8::splat(8)),
    min: false, |_| f16::ZERO, |_| f16::ZERO);
fmt!("Q4_1 × Q8_1.", Q4_1, BlockQ4_1, BlockQ8_1,
    |w| split_nibbles(&w.qs),
    min: true, |w| w.m, |a| a.s);
fmt!("Q5_0 × Q8_0.", Q5_0, BlockQ5_0, BlockQ8_0,
    |w| split_q5(&w.qs, w.qh).map(|v| v - i16x8::splat(16)),
    min: false, |_| f16::ZERO, |_| f16::ZERO);
fmt!("Q5_1 × Q8_1.", Q5_1, BlockQ5_1, BlockQ8_1,
    |w| split_q5(&w.qs, w.qh),
    min: true, |w| w.m, |a| a.s);
fmt!("Q8_0 × Q8_0.", Q8_0, BlockQ8_0, BlockQ8_0,
    |w| split_i8(&w.qs),
    min: false, |_| f16::ZERO, |_| f16::ZERO);
