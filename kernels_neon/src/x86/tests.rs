//! The AVX2 internals beyond what the path-generic tests in `tests/` reach: the vectorised
//! exp and the F16C conversions over their whole ranges.

use crate::block::*;

fn avx2() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

#[test]
fn exp_is_within_a_few_ulp() {
    if !avx2() {
        return;
    }
    use super::simd::{exp_ps, load_ps, store_ps};
    use std::arch::x86_64::__m256;
    // SAFETY: avx2, fma and f16c were detected above.
    let exp8 = |v: [f32; 8]| unsafe {
        let e: __m256 = exp_ps(load_ps(&v));
        let mut o = [0.0f32; 8];
        store_ps(&mut o, e);
        o
    };
    let mut x = -110.0f32;
    while x < 90.0 {
        let v = std::array::from_fn(|k| x + 0.01 * k as f32);
        let got = exp8(v);
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
    let s = exp8([
        f32::NEG_INFINITY,
        f32::INFINITY,
        f32::NAN,
        0.0,
        -0.0,
        1.0,
        89.0,
        -200.0,
    ]);
    assert_eq!(
        (s[0], s[1], s[3], s[4], s[6], s[7]),
        (0.0, f32::INFINITY, 1.0, 1.0, f32::INFINITY, 0.0)
    );
    assert!(s[2].is_nan());
}

#[test]
fn f16_conversions_match_half_everywhere() {
    if !avx2() {
        return;
    }
    let all: Vec<f16> = (0..=u16::MAX).map(f16::from_bits).collect();
    let mut got = vec![0.0f32; all.len()];
    super::ops::f16_to_f32_row(&all, &mut got);
    for (h, g) in all.iter().zip(&got) {
        assert_eq!(
            g.to_bits(),
            h.to_f32().to_bits(),
            "f16 {:#06x}",
            h.to_bits()
        );
    }
    // Around every f16: neighbours and midpoints (ties), both signs, and a sweep of all
    // exponents; an odd length exercises the tail.
    let mut xs = Vec::new();
    for bits in 0..0x7c00u16 {
        let (lo, hi) = (
            f16::from_bits(bits).to_f32(),
            f16::from_bits(bits + 1).to_f32(),
        );
        let mid = ((lo as f64 + hi as f64) / 2.0) as f32;
        for f in [lo, mid, hi] {
            for d in [-1i32, 0, 1] {
                let b = f32::from_bits((f.to_bits() as i32 + d).max(0) as u32);
                xs.extend([b, -b]);
            }
        }
    }
    xs.extend((0..=u32::MAX / 9973).map(|i| f32::from_bits(i.wrapping_mul(9973))));
    xs.extend([f32::NAN, f32::INFINITY, 65519.99, 65520.0, 1e-45]);
    let mut got = vec![f16::ZERO; xs.len()];
    super::ops::f32_to_f16_row(&xs, &mut got);
    for (x, g) in xs.iter().zip(&got) {
        assert_eq!(
            g.to_bits(),
            f16::from_f32(*x).to_bits(),
            "f32 {x:e} ({:#010x})",
            x.to_bits()
        );
    }
}
