//! Activation quantizers (`quantize_row_q8_0`, `quantize_row_q8_1`), byte-identical to the
//! references: the same `amax` (NaN-ignoring max, as `f32::max`), the same scalar
//! `d = amax / 127`, `id = 1 / d` (or 0), the same products `x * id`, rounded half away from
//! zero by `fcvtas` (C `roundf`) and saturated to i8 by `sqxtn` (Rust's `as i8`).

use super::fp16::f2h;
use crate::block::{BlockQ8_0, BlockQ8_1, BlockQ8K, QK_K, QK8_0, QK8_1};
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

/// `quantize_row_q8_k`, byte-identical to the reference: the value of largest magnitude (the
/// first of equal ones, with its sign; NaN skipped, as the reference's `amax < |v|` skips it),
/// `iscale = -127 / max`, each `iscale · v` rounded by the reference's `nearest_int` (adding
/// 1.5 · 2^23 rounds to nearest even, as the scalar `f32` add does), `min(127)` and the low
/// byte kept (Rust's `as i8`, a truncating narrow), and each sixteen values' sum.
pub(crate) fn quantize_row_q8_k(x: &[f32], y: &mut [BlockQ8K]) {
    assert_eq!(
        x.len(),
        y.len() * QK_K,
        "quantize_row_q8_k: length mismatch"
    );
    let (xs, _) = x.as_chunks::<QK_K>();
    for (xb, yb) in xs.iter().zip(y.iter_mut()) {
        let (c, _) = xb.as_chunks::<4>();
        // SAFETY (whole block): each chunk is a valid `[f32; 4]` (`ld1` needs only element
        // alignment); the rest are NEON register intrinsics, part of the aarch64 baseline.
        unsafe {
            let load = |i: usize| vld1q_f32(c[i].as_ptr());
            let mut m = vdupq_n_f32(0.0);
            for i in 0..c.len() {
                // maxnm keeps the number when the other operand is NaN.
                m = vmaxnmq_f32(m, vabsq_f32(load(i)));
            }
            let amax = vmaxnmvq_f32(m);
            if amax == 0.0 {
                *yb = BlockQ8K::default();
                continue;
            }
            // The first value of that magnitude, with its sign.
            let at = vdupq_n_f32(amax);
            let mut max = amax;
            for (i, v) in c.iter().enumerate() {
                if vmaxvq_u32(vceqq_f32(vabsq_f32(load(i)), at)) != 0 {
                    max = *v.iter().find(|x| x.abs() == amax).unwrap_or(&amax);
                    break;
                }
            }
            let iscale = -127.0f32 / max;
            let magic = vdupq_n_f32(12_582_912.0);
            let mant = vdupq_n_s32(0x007f_ffff);
            let off = vdupq_n_s32(0x0040_0000);
            let top = vdupq_n_s32(127);
            let (qs, _) = yb.qs.as_chunks_mut::<16>();
            for (k, q) in qs.iter_mut().enumerate() {
                let n: [int32x4_t; 4] = core::array::from_fn(|j| {
                    let t = vaddq_f32(vmulq_n_f32(load(4 * k + j), iscale), magic);
                    let n = vsubq_s32(vandq_s32(vreinterpretq_s32_f32(t), mant), off);
                    vminq_s32(n, top)
                });
                let h0 = vmovn_high_s32(vmovn_s32(n[0]), n[1]);
                let h1 = vmovn_high_s32(vmovn_s32(n[2]), n[3]);
                let b = vmovn_high_s16(vmovn_s16(h0), h1);
                vst1q_s8(q.as_mut_ptr(), b);
                yb.bsums[k] = vaddlvq_s8(b);
            }
            yb.d = 1.0 / iscale;
        }
    }
}
