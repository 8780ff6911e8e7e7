//! Activation quantizers on `wide` vectors, byte-identical to the references: `d = amax/127`,
//! `id = d ? 1/d : 0`, round half away from zero, saturate like `as i8`. (The reference calls
//! `f32::round` per value, which is a libm call on targets without a rounding instruction.)

use crate::block::{BlockQ8_0, BlockQ8_1, BlockQ8K, QK_K, QK8_0, QK8_1, f16};
use crate::reference::nearest_int;
use wide::{CmpEq, CmpGe, CmpLt, f32x8, i32x8};

/// `quantize_row_q8_0` (portable).
pub(crate) fn quantize_row_q8_0(x: &[f32], y: &mut [BlockQ8_0]) {
    assert_eq!(
        x.len(),
        y.len() * QK8_0,
        "quantize_row_q8_0: length mismatch"
    );
    for (xb, yb) in x.as_chunks::<QK8_0>().0.iter().zip(y) {
        let (d, q) = quantize_block(xb);
        yb.d = f16::from_f32(d);
        store(&mut yb.qs, &q);
    }
}

/// `quantize_row_q8_1` (portable).
pub(crate) fn quantize_row_q8_1(x: &[f32], y: &mut [BlockQ8_1]) {
    assert_eq!(
        x.len(),
        y.len() * QK8_1,
        "quantize_row_q8_1: length mismatch"
    );
    for (xb, yb) in x.as_chunks::<QK8_1>().0.iter().zip(y) {
        let (d, q) = quantize_block(xb);
        yb.d = f16::from_f32(d);
        let sum = (q[0] + q[1] + q[2] + q[3]).reduce_add();
        yb.s = f16::from_f32(sum as f32 * d);
        store(&mut yb.qs, &q);
    }
}

fn store(qs: &mut [i8; 32], q: &[i32x8; 4]) {
    for (o, v) in qs.as_chunks_mut::<8>().0.iter_mut().zip(q) {
        *o = v.to_array().map(|i| i as i8);
    }
}

/// One block: `d` and the 32 values as i32 in `-128..=127`.
#[inline]
fn quantize_block(xb: &[f32; 32]) -> (f32, [i32x8; 4]) {
    let (c, _) = xb.as_chunks::<8>();
    let v = [
        f32x8::from(c[0]),
        f32x8::from(c[1]),
        f32x8::from(c[2]),
        f32x8::from(c[3]),
    ];
    // `f32x8::max` picks the non-NaN lane, like the reference's `f32::max` fold from 0.
    let m = v.iter().fold(f32x8::splat(0.0), |m, x| m.max(x.abs()));
    let amax = m.to_array().into_iter().fold(0.0f32, f32::max);
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let idv = f32x8::splat(id);
    let q = v.map(|x| {
        let t = x * idv;
        // `as i8`: NaN → 0 (masking with t == t), then saturation (clamping first rounds
        // the same way).
        let t = t & t.cmp_eq(t);
        let t = t
            .fast_max(f32x8::splat(-128.0))
            .fast_min(f32x8::splat(127.0));
        // Round half away from zero: `t - trunc(t)` is exact.
        let ti = t.fast_trunc_int();
        let frac = t - f32x8::from_i32x8(ti);
        let away = frac.abs().cmp_ge(f32x8::splat(0.5));
        let step = t
            .cmp_lt(f32x8::splat(0.0))
            .blend(f32x8::splat(-1.0), f32x8::splat(1.0));
        ti + (away & step).fast_trunc_int()
    });
    (d, q)
}

/// `quantize_row_q8_k` (portable), byte-identical to the reference: the largest magnitude found
/// lane-wise (eight running maxima, `f32::max` skipping NaN as the reference's `amax < |v|`
/// does) instead of a compare-and-branch per value, then the first value of it, with its sign;
/// the values rounded by the reference's `nearest_int` in straight-line loops the compiler
/// vectorises.
pub(crate) fn quantize_row_q8_k(x: &[f32], y: &mut [BlockQ8K]) {
    assert_eq!(
        x.len(),
        y.len() * QK_K,
        "quantize_row_q8_k: length mismatch"
    );
    for (xb, yb) in x.as_chunks::<QK_K>().0.iter().zip(y) {
        let mut lanes = [0.0f32; 8];
        for c in xb.as_chunks::<8>().0 {
            for (m, v) in lanes.iter_mut().zip(c) {
                *m = m.max(v.abs());
            }
        }
        let amax = lanes.iter().fold(0.0f32, |m, &v| m.max(v));
        if amax == 0.0 {
            *yb = BlockQ8K::default();
            continue;
        }
        let max = xb.iter().copied().find(|v| v.abs() == amax).unwrap_or(amax);
        let iscale = -127.0f32 / max;
        for (q, &v) in yb.qs.iter_mut().zip(xb) {
            // C stores `MIN(127, v)` into an int8_t: truncation, as `as i8`.
            *q = nearest_int(iscale * v).min(127) as i8;
        }
        for (s, q) in yb.bsums.iter_mut().zip(yb.qs.as_chunks::<16>().0) {
            *s = q.iter().map(|&v| v as i16).sum();
        }
        yb.d = 1.0 / iscale;
    }
}
