//! ggml's K-quant helpers (`ggml-quants.c`), transcribed operation for operation: every
//! float expression keeps C's evaluation order and f32 precision, so the quantizers built on
//! them give llama.cpp's bytes (with FMA contraction off, see `tests/data/gen_kquants.c`).

use super::get_scale_min_k4;
use crate::block::{K_SCALE_SIZE, QK_K, f16};

/// ggml `GROUP_MAX_EPS`: below this a group counts as all zeros.
pub const GROUP_MAX_EPS: f32 = 1e-15;

/// ggml `nearest_int`: round half to even through the f32 mantissa (adding 1.5 · 2²³ puts the
/// integer in the low 23 bits). Exact for `|x| <= 4194303`; beyond that (and for NaN) ggml only
/// asserts in debug builds, here it gives some integer and never panics.
#[inline]
pub fn nearest_int(fval: f32) -> i32 {
    let val = fval + 12582912.0f32;
    (val.to_bits() as i32 & 0x007f_ffff) - 0x0040_0000
}

/// ggml `make_qkx2_quants`: levels `l` in `0..=nmax` and `(scale, the_min)` with
/// `x ≈ scale * l - the_min`, searching `nstep + 1` scales around `nmax / (max - min)` for the
/// least weighted error. `laux` is scratch; all slices have `x.len()` elements.
#[allow(clippy::too_many_arguments)]
pub fn make_qkx2_quants(
    nmax: i32,
    x: &[f32],
    weights: &[f32],
    l_out: &mut [u8],
    laux: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
) -> (f32, f32) {
    let n = x.len();
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l_out[..n].fill(0);
        return (0.0, -min);
    }
    let err = |diff: f32| if use_mad { diff.abs() } else { diff * diff };
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for i in 0..n {
        let l = nearest_int(iscale * (x[i] - min));
        l_out[i] = l.clamp(0, nmax) as u8;
        let diff = scale * l_out[i] as f32 + min - x[i];
        best_error += weights[i] * err(diff);
    }
    if nstep < 1 {
        return (scale, -min);
    }
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for i in 0..n {
            let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            laux[i] = l as u8;
            let (w, l) = (weights[i], l as f32);
            sum_l += w * l;
            sum_l2 += w * l * l;
            sum_xl += w * l * x[i];
        }
        let d = sum_w * sum_l2 - sum_l * sum_l;
        if d > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / d;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / d;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0.0f32;
            for i in 0..n {
                let diff = this_scale * laux[i] as f32 + this_min - x[i];
                cur_error += weights[i] * err(diff);
            }
            if cur_error < best_error {
                l_out[..n].copy_from_slice(&laux[..n]);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// ggml `make_qx_quants` for the one case the K-quant references use: `rmse_type == 1` and
/// no importance weights (`qw == NULL`), i.e. weights `x²`. Levels `nmax + l`, `l` in
/// `-nmax..nmax`, written to `l_out`; returns the scale.
pub fn make_qx_quants_rmse1(nmax: i32, x: &[f32], l_out: &mut [i8]) -> f32 {
    let n = x.len();
    let mut max = 0.0f32;
    let mut amax = 0.0f32;
    for &v in x {
        let ax = v.abs();
        if ax > amax {
            amax = ax;
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l_out[..n].fill(0);
        return 0.0;
    }
    // `-nmax / max` in C: the int is negated first, then converted.
    let mut iscale = (-nmax) as f32 / max;
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for i in 0..n {
        let l = nearest_int(iscale * x[i]).clamp(-nmax, nmax - 1);
        l_out[i] = (l + nmax) as i8;
        let w = x[i] * x[i];
        sumlx += w * x[i] * l as f32;
        suml2 += w * l as f32 * l as f32;
    }
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in -9..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(nmax as f32 + 0.1f32 * is as f32) / max;
        sumlx = 0.0;
        suml2 = 0.0;
        for &xi in x {
            let l = nearest_int(iscale * xi).clamp(-nmax, nmax - 1) as f32;
            let w = xi * xi;
            sumlx += w * xi * l;
            suml2 += w * l * l;
        }
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for i in 0..n {
                let l = nearest_int(iscale * x[i]).clamp(-nmax, nmax - 1);
                l_out[i] = (nmax + l) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// The part of `quantize_row_q4_K_ref` / `quantize_row_q5_K_ref` shared by both: per
/// sub-block of 32 a `make_qkx2_quants` fit, the eight scales and mins quantized to 6 bits
/// against the largest, then the levels recomputed against the rounded scales. Returns
/// `(d, dmin, scales)` and the levels (`0..=nmax`) in `l_out`.
pub fn quantize_k_super_block(
    x: &[f32],
    nmax: i32,
    rmin: f32,
    nstep: i32,
    l_out: &mut [u8; QK_K],
) -> (f16, f16, [u8; K_SCALE_SIZE]) {
    let mut laux = [0u8; 32];
    let mut weights = [0.0f32; 32];
    let mut mins = [0.0f32; QK_K / 32];
    let mut scales = [0.0f32; QK_K / 32];
    let mut max_scale = 0.0f32; // the min is subtracted, so scales are positive
    let mut max_min = 0.0f32;
    for j in 0..QK_K / 32 {
        let xs = &x[32 * j..32 * j + 32];
        let mut sum_x2 = 0.0f32;
        for &v in xs {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        for (w, &v) in weights.iter_mut().zip(xs) {
            *w = av_x + v.abs();
        }
        let lj = &mut l_out[32 * j..32 * j + 32];
        (scales[j], mins[j]) =
            make_qkx2_quants(nmax, xs, &weights, lj, &mut laux, rmin, 0.1, nstep, false);
        if scales[j] > max_scale {
            max_scale = scales[j];
        }
        if mins[j] > max_min {
            max_min = mins[j];
        }
    }
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let mut sc = [0u8; K_SCALE_SIZE];
    for j in 0..QK_K / 32 {
        // C stores `nearest_int` into a uint8_t (mod 256) before `MIN(63, ·)`; `as u8` too.
        let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
        if j < 4 {
            sc[j] = ls;
            sc[j + 4] = lm;
        } else {
            sc[j + 4] = (ls & 0x0f) | ((lm & 0x0f) << 4);
            sc[j - 4] |= (ls >> 4) << 6;
            sc[j] |= (lm >> 4) << 6;
        }
    }
    let d = f16::from_f32(max_scale / 63.0);
    let dmin = f16::from_f32(max_min / 63.0);
    for j in 0..QK_K / 32 {
        let (s, m) = get_scale_min_k4(j, &sc);
        let dj = d.to_f32() * s as f32;
        if dj == 0.0 {
            continue; // keeps make_qkx2_quants' levels, as ggml
        }
        let dm = dmin.to_f32() * m as f32;
        for ii in 0..32 {
            let l = nearest_int((x[32 * j + ii] + dm) / dj);
            l_out[32 * j + ii] = l.clamp(0, nmax) as u8;
        }
    }
    (d, dmin, sc)
}

/// The integer core of ggml's generic K-quant dot products: `aux32[l] += scale * q8 * a` over
/// chunks of 8 values, with `scales[k]` applying to sub-block `k` of `QK_K / scales.len()`
/// values. Integer sums, so the order inside does not matter; it is the eight lanes that the
/// caller's float sums follow.
pub fn k_dot_aux32(aux8: &[i8; QK_K], q8: &[i8; QK_K], scales: &[i32]) -> [i32; 8] {
    let sub = QK_K / scales.len();
    let mut aux32 = [0i32; 8];
    for (c, (a, q)) in aux8.chunks_exact(8).zip(q8.chunks_exact(8)).enumerate() {
        let scale = scales[c * 8 / sub];
        for l in 0..8 {
            // `aux16` in C: |q8 * a| <= 128 * 32 fits i16, so i32 here is the same value.
            let aux16 = q[l] as i32 * a[l] as i32;
            aux32[l] = aux32[l].wrapping_add(scale.wrapping_mul(aux16));
        }
    }
    aux32
}
