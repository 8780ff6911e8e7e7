//! Building blocks of the portable path on `wide` vectors: exact f16 conversions done with
//! integer bit manipulation (so they need no F16C / FP16 hardware), and a vectorised `exp`.

use crate::block::f16;
use bytemuck::cast;
use wide::{CmpEq, CmpGt, CmpLt, f32x8, i32x8};

/// 2^112: scales an f16 bit pattern placed in an f32's exponent/mantissa to its value.
const TWO_POW_112: f32 = f32::from_bits(0x7780_0000);

/// f16 bit patterns → f32, exact, like `half`/F16C: subnormals widened, infinities kept, NaN
/// quieted (`0x7fc0_0000 | mantissa << 13`) with its sign.
#[inline]
pub(super) fn f16x8_to_f32x8(h: [u16; 8]) -> f32x8 {
    let hu = i32x8::from(h.map(i32::from));
    let em = hu & i32x8::splat(0x7fff);
    let sign = (hu & i32x8::splat(0x8000)) << 16;
    // Finite values (normal, subnormal, zero): one exact multiplication by a power of two.
    let finite: i32x8 = cast(cast::<i32x8, f32x8>(em << 13) * f32x8::splat(TWO_POW_112));
    let special = em.cmp_gt(i32x8::splat(0x7bff));
    let nan = em.cmp_gt(i32x8::splat(0x7c00));
    let special_bits = (em << 13) | i32x8::splat(0x7f80_0000) | (nan & i32x8::splat(0x0040_0000));
    cast(special.blend(special_bits, finite) | sign)
}

/// One f16 → f32, exact, as [`f16x8_to_f32x8`] (branch-free for finite values; `half`'s
/// conversion is a runtime feature check and a call on x86, and a branchy bit loop elsewhere).
#[inline]
pub(super) fn f16_to_f32(h: f16) -> f32 {
    let h = u32::from(h.to_bits());
    let em = h & 0x7fff;
    let bits = if em < 0x7c00 {
        (f32::from_bits(em << 13) * TWO_POW_112).to_bits()
    } else {
        (em << 13) | 0x7f80_0000 | if em > 0x7c00 { 0x0040_0000 } else { 0 }
    };
    f32::from_bits(bits | (h & 0x8000) << 16)
}

/// f32 → f16 bit patterns, round to nearest even, like `half`/F16C: overflow to infinity,
/// subnormals rounded, NaN quieted (`0x7e00 | mantissa >> 13`) with its sign. The branchless
/// form is F. Giesen's `float_to_half_fast3_rtne`.
#[inline]
pub(super) fn f32x8_to_f16x8(v: f32x8) -> [u16; 8] {
    let x: i32x8 = cast(v);
    let sign = x & i32x8::splat(i32::MIN);
    let a = x ^ sign;
    // |x| >= 65536 (after rounding everything from 65520 up overflows), infinities, NaN.
    let big = a.cmp_gt(i32x8::splat(0x4780_0000 - 1));
    let nan = a.cmp_gt(i32x8::splat(0x7f80_0000));
    let o_big = nan.blend(
        i32x8::splat(0x7e00) | ((a & i32x8::splat(0x007f_ffff)) >> 13),
        i32x8::splat(0x7c00),
    );
    // |x| < 2^-14: an f16 subnormal or zero. Adding 0.5 aligns the mantissa so that the
    // float addition itself rounds to nearest even.
    let small = a.cmp_lt(i32x8::splat(0x3880_0000));
    let o_small = cast::<f32x8, i32x8>(cast::<i32x8, f32x8>(a) + f32x8::splat(0.5))
        - i32x8::splat(0x3f00_0000);
    // Normal: rebias the exponent, round on bit 12 with ties to the even mantissa.
    let odd = (a >> 13) & i32x8::splat(1);
    let o_norm = (a + i32x8::splat(0xfff - 0x3800_0000) + odd) >> 13;
    let o: i32x8 =
        big.blend(o_big, small.blend(o_small, o_norm)) | ((sign >> 16) & i32x8::splat(0x8000));
    o.to_array().map(|b| b as u16)
}

/// `e^x` lanewise within ~2 ulp of `f32::exp`: the same Cephes polynomial and range handling
/// as the AVX2 path (0 below -104 and for -inf, +inf above ln(f32::MAX), NaN kept).
#[inline]
pub(super) fn exp8(x: f32x8) -> f32x8 {
    const LO: f32 = -104.0;
    const HI: f32 = 88.722_84;
    // ln 2 split as Cephes does: 0.693359375 (exact in 9 bits) + -2.12194440e-4.
    const LN2_HI: f32 = f32::from_bits(0x3f31_8000);
    let xc = x.fast_max(f32x8::splat(LO)).fast_min(f32x8::splat(HI));
    // Round x*log2(e) to nearest even with the 1.5*2^23 trick (|x*log2 e| < 2^22).
    let magic = f32x8::splat(12_582_912.0);
    let tm = xc * f32x8::splat(std::f32::consts::LOG2_E) + magic;
    let n = tm - magic;
    let ni = cast::<f32x8, i32x8>(tm) - cast::<f32x8, i32x8>(magic);
    let r = n.mul_neg_add(f32x8::splat(LN2_HI), xc);
    let r = n.mul_neg_add(f32x8::splat(-2.121_944_4e-4), r);
    let mut p = f32x8::splat(1.987_569_1e-4);
    p = p.mul_add(r, f32x8::splat(1.398_2e-3));
    p = p.mul_add(r, f32x8::splat(8.333_452e-3));
    p = p.mul_add(r, f32x8::splat(4.166_579_6e-2));
    p = p.mul_add(r, f32x8::splat(1.666_666_5e-1));
    p = p.mul_add(r, f32x8::splat(0.5));
    let y = p.mul_add(r * r, r) + f32x8::splat(1.0);
    let n1 = ni >> 1;
    let n2 = ni - n1;
    let p1: f32x8 = cast((n1 + i32x8::splat(127)) << 23);
    let p2: f32x8 = cast((n2 + i32x8::splat(127)) << 23);
    let res = y * p1 * p2;
    let res = x
        .cmp_gt(f32x8::splat(HI))
        .blend(f32x8::splat(f32::INFINITY), res);
    let res = x.cmp_lt(f32x8::splat(LO)).blend(f32x8::splat(0.0), res);
    // NaN lanes compare unequal to themselves: pass them through.
    x.cmp_eq(x).blend(res, x)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_to_f32_is_exact_for_every_f16() {
        for base in (0..=u16::MAX).step_by(8) {
            let h: [u16; 8] = std::array::from_fn(|k| base + k as u16);
            let got = f16x8_to_f32x8(h).to_array();
            for k in 0..8 {
                let want = f16::from_bits(h[k]).to_f32();
                assert_eq!(got[k].to_bits(), want.to_bits(), "f16 {:#06x}", h[k]);
                let one = f16_to_f32(f16::from_bits(h[k]));
                assert_eq!(one.to_bits(), want.to_bits(), "f16 {:#06x} (scalar)", h[k]);
            }
        }
    }

    fn check_f32_to_f16(xs: &[f32]) {
        for c in xs.chunks(8) {
            let mut v = [0.0f32; 8];
            v[..c.len()].copy_from_slice(c);
            let got = f32x8_to_f16x8(f32x8::from(v));
            for k in 0..c.len() {
                let want = f16::from_f32(c[k]).to_bits();
                assert_eq!(got[k], want, "f32 {:e} ({:#010x})", c[k], c[k].to_bits());
            }
        }
    }

    #[test]
    fn f32_to_f16_rounds_like_half_around_every_f16() {
        // Every f16 value, its f32 neighbours and the midpoints to the next f16, both signs.
        let mut xs = Vec::new();
        for bits in 0..0x7c00u16 {
            let lo = f16::from_bits(bits).to_f32();
            let hi = f16::from_bits(bits + 1).to_f32();
            let mid = (lo as f64 + hi as f64) / 2.0;
            for f in [lo, mid as f32, hi] {
                for d in [-1i32, 0, 1] {
                    let b = (f.to_bits() as i32 + d).max(0) as u32;
                    xs.push(f32::from_bits(b));
                    xs.push(-f32::from_bits(b));
                }
            }
        }
        xs.extend([
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::MAX,
            f32::MIN_POSITIVE,
            1e-45,
            65504.0,
            65519.99,
            65520.0,
        ]);
        xs.extend([
            f32::NAN,
            -f32::NAN,
            f32::from_bits(0x7f80_0001),
            f32::from_bits(0xffc1_2345),
        ]);
        check_f32_to_f16(&xs);
        // And a sweep over all exponents.
        let sweep: Vec<f32> = (0..=u32::MAX / 9973)
            .map(|i| f32::from_bits(i.wrapping_mul(9973)))
            .collect();
        check_f32_to_f16(&sweep);
    }

    #[test]
    fn exp_is_within_a_few_ulp() {
        let mut x = -110.0f32;
        while x < 90.0 {
            let v = [
                x,
                x + 0.01,
                x + 0.02,
                x + 0.03,
                x + 0.04,
                x + 0.05,
                x + 0.06,
                x + 0.07,
            ];
            let got = exp8(f32x8::from(v)).to_array();
            for k in 0..8 {
                let want = v[k].exp();
                let tol = 4.0 * f32::EPSILON * want + 2.0 * f32::from_bits(1);
                assert!(
                    got[k] == want || (got[k] - want).abs() <= tol,
                    "exp({}) = {} want {}",
                    v[k],
                    got[k],
                    want
                );
            }
            x += 0.08;
        }
        let s = exp8(f32x8::from([
            f32::NEG_INFINITY,
            f32::INFINITY,
            f32::NAN,
            0.0,
            -0.0,
            1.0,
            89.0,
            -200.0,
        ]))
        .to_array();
        assert_eq!(s[0], 0.0);
        assert_eq!(s[1], f32::INFINITY);
        assert!(s[2].is_nan());
        assert_eq!((s[3], s[4]), (1.0, 1.0));
        assert_eq!(s[6], f32::INFINITY);
        assert_eq!(s[7], 0.0);
    }
}
