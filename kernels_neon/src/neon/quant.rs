//! Activation quantizers (`quantize_row_q8_0`, `quantize_row_q8_1`), byte-identical to the
//! references: the same `amax` (NaN-ignoring max, as `f32::max`), the same scalar
//! `d = amax / 127`, `id = 1 / d` (or 0), the same products `x * id`, rounded half away from
//! zero by `fcvtas` (C `roundf`) and saturated to i8 by `sqxtn` (Rust's `as i8`).

use super::fp16::f2h;
use crate::block::{BlockQ8_0, BlockQ8_1, QK8_0, QK8_1};
use core::arch::aarch64::*;

/// Quantizes one block of 32 values: returns `d` (f32, before its f16 rounding) and the 32
/// quantized values.
#[inline(always)]
fn quant_block(x: &[f32; 32]) -> (f32, [int8x16_t; 2]) {
    let (v, _) = x.as_chunks::<4>();
    // SAFETY: each chunk is a valid `[f32; 4]`; `ld1` needs only element alignment.
    let v: [float32x4_t; 8] = core::array::from_fn(|i| unsafe { vld1q_f32(v[i].as_ptr()) });
    // SAFETY (whole block): NEON register intrinsics only; NEON is part of the aarch64
    // baseline.
    unsafe {
        let a: [float32x4_t; 8] = v.map(|v| vabsq_f32(v));
        let m01 = vmaxnmq_f32(a[0], a[1]);
        let m23 = vmaxnmq_f32(a[2], a[3]);
        let m45 = vmaxnmq_f32(a[4], a[5]);
        let m67 = vmaxnmq_f32(a[6], a[7]);
        let m = vmaxnmq_f32(vmaxnmq_f32(m01, m23), vmaxnmq_f32(m45, m67));
        // The reference folds from 0.0 with `f32::max`: NaNs are ignored, an all-NaN block
        // gives 0.
        let amax = vmaxnmvq_f32(vmaxnmq_f32(m, vdupq_n_f32(0.0)));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let q: [int32x4_t; 8] = v.map(|v| vcvtaq_s32_f32(vmulq_n_f32(v, id)));
        let h: [int16x8_t; 4] =
            core::array::from_fn(|i| vqmovn_high_s32(vqmovn_s32(q[2 * i]), q[2 * i + 1]));
        let lo = vqmovn_high_s16(vqmovn_s16(h[0]), h[1]);
        let hi = vqmovn_high_s16(vqmovn_s16(h[2]), h[3]);
        (d, [lo, hi])
    }
}

#[inline(always)]
fn store_qs(qs: &mut [i8; 32], q: [int8x16_t; 2]) {
    // SAFETY: `qs` is valid for 32 writable bytes; `st1` has no alignment requirement.
    unsafe {
        vst1q_s8(qs.as_mut_ptr(), q[0]);
        vst1q_s8(qs.as_mut_ptr().add(16), q[1]);
    }
}

/// `quantize_row_q8_0`: `x.len() == y.len() * 32`.
pub(crate) fn quantize_row_q8_0(x: &[f32], y: &mut [BlockQ8_0]) {
    assert_eq!(
        x.len(),
        y.len() * QK8_0,
        "quantize_row_q8_0: length mismatch"
    );
    let (xs, _) = x.as_chunks::<QK8_0>();
    for (xb, yb) in xs.iter().zip(y.iter_mut()) {
        let (d, q) = quant_block(xb);
        yb.d = f2h(d);
        store_qs(&mut yb.qs, q);
    }
}

/// `quantize_row_q8_1`: as Q8_0, plus `s = f16(sum(q) * d)`.
pub(crate) fn quantize_row_q8_1(x: &[f32], y: &mut [BlockQ8_1]) {
    assert_eq!(
        x.len(),
        y.len() * QK8_1,
        "quantize_row_q8_1: length mismatch"
    );
    let (xs, _) = x.as_chunks::<QK8_1>();
    for (xb, yb) in xs.iter().zip(y.iter_mut()) {
        let (d, q) = quant_block(xb);
        yb.d = f2h(d);
        // Each half sums 16 values of at most 128 in magnitude: no i16 overflow.
        // SAFETY: baseline NEON register intrinsics.
        let sum = unsafe { vaddlvq_s8(q[0]) as i32 + vaddlvq_s8(q[1]) as i32 };
        yb.s = f2h(sum as f32 * d);
        store_qs(&mut yb.qs, q);
    }
}
