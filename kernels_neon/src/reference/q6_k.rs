use super::{GROUP_MAX_EPS, k_dot_aux32, make_qx_quants_rmse1, nearest_int};
use crate::block::{BlockFormat, BlockQ6K, BlockQ8K, QK_K, f16};

/// Value `l` (0..32) of the four in each of the 128-value halves: `(q1, q2, q3, q4)` for
/// positions `l`, `l + 32`, `l + 64`, `l + 96`, each in -32..32.
#[inline]
pub fn q6_values(ql: &[u8], qh: &[u8], l: usize) -> [i8; 4] {
    let h = qh[l];
    [
        ((ql[l] & 0x0f) | ((h & 3) << 4)) as i8 - 32,
        ((ql[l + 32] & 0x0f) | (((h >> 2) & 3) << 4)) as i8 - 32,
        ((ql[l] >> 4) | (((h >> 4) & 3) << 4)) as i8 - 32,
        ((ql[l + 32] >> 4) | (((h >> 6) & 3) << 4)) as i8 - 32,
    ]
}

/// ggml `dequantize_row_q6_K`.
pub fn dequantize_row_q6_k(x: &[BlockQ6K], y: &mut [f32]) {
    assert_eq!(
        y.len(),
        x.len() * QK_K,
        "dequantize_row_q6_k: length mismatch"
    );
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = xb.d.to_f32();
        for n in 0..2 {
            let (ql, qh) = (&xb.ql[64 * n..], &xb.qh[32 * n..]);
            let sc = &xb.scales[8 * n..];
            let out = &mut yb[128 * n..];
            for l in 0..32 {
                let is = l / 16;
                let q = q6_values(ql, qh, l);
                for (k, &qk) in q.iter().enumerate() {
                    out[l + 32 * k] = d * sc[is + 2 * k] as f32 * qk as f32;
                }
            }
        }
    }
}

/// ggml `quantize_row_q6_K_ref`: per sub-block of 16 a `make_qx_quants` fit (32 levels each
/// side, `x²` weights), the sixteen scales quantized to i8 against the largest in magnitude
/// (`-128 / max`), then the levels recomputed against the rounded scales.
pub fn quantize_row_q6_k_ref(x: &[f32], y: &mut [BlockQ6K]) {
    assert_eq!(
        x.len(),
        y.len() * QK_K,
        "quantize_row_q6_k_ref: length mismatch"
    );
    let mut l = [0i8; QK_K];
    let mut scales = [0.0f32; QK_K / 16];
    for (xb, yb) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        let mut max_scale = 0.0f32;
        let mut max_abs_scale = 0.0f32;
        for (ib, s) in scales.iter_mut().enumerate() {
            *s = make_qx_quants_rmse1(32, &xb[16 * ib..16 * ib + 16], &mut l[16 * ib..]);
            if s.abs() > max_abs_scale {
                max_abs_scale = s.abs();
                max_scale = *s;
            }
        }
        if max_abs_scale < GROUP_MAX_EPS {
            *yb = BlockQ6K::default();
            continue;
        }
        let iscale = -128.0f32 / max_scale;
        yb.d = f16::from_f32(1.0 / iscale);
        for (o, &s) in yb.scales.iter_mut().zip(&scales) {
            // C: `MIN(127, nearest_int(·))` stored into an int8_t (truncation, as `as i8`).
            *o = nearest_int(iscale * s).min(127) as i8;
        }
        for j in 0..QK_K / 16 {
            let d = yb.d.to_f32() * yb.scales[j] as f32;
            if d == 0.0 {
                continue; // keeps make_qx_quants' levels, as ggml
            }
            for ii in 0..16 {
                let q = nearest_int(xb[16 * j + ii] / d).clamp(-32, 31);
                l[16 * j + ii] = (q + 32) as i8;
            }
        }
        let lu = l.map(|v| v as u8);
        for n in 0..2 {
            let (ql, qh) = (&mut yb.ql[64 * n..], &mut yb.qh[32 * n..]);
            let lq = &lu[128 * n..];
            for i in 0..32 {
                let (q1, q2, q3, q4) = (lq[i], lq[i + 32], lq[i + 64], lq[i + 96]);
                ql[i] = (q1 & 0x0f) | ((q3 & 0x0f) << 4);
                ql[i + 32] = (q2 & 0x0f) | ((q4 & 0x0f) << 4);
                qh[i] = (q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6);
            }
        }
    }
}

/// ggml `ggml_vec_dot_q6_K_q8_K` (generic): lanes as in Q4_K, sixteen scales of 16, no mins.
pub fn vec_dot_q6_k_q8_k_ref(x: &[BlockQ6K], y: &[BlockQ8K]) -> f32 {
    assert_eq!(x.len(), y.len(), "vec_dot_q6_k_q8_k_ref: length mismatch");
    let mut sums = [0.0f32; 8];
    for (xb, yb) in x.iter().zip(y) {
        let mut aux8 = [0i8; QK_K];
        for n in 0..2 {
            let (ql, qh) = (&xb.ql[64 * n..], &xb.qh[32 * n..]);
            for l in 0..32 {
                for (k, q) in q6_values(ql, qh, l).into_iter().enumerate() {
                    aux8[128 * n + 32 * k + l] = q;
                }
            }
        }
        let scales = xb.scales.map(|s| s as i32);
        let aux32 = k_dot_aux32(&aux8, &yb.qs, &scales);
        let d = xb.d.to_f32() * yb.d;
        for (s, &a) in sums.iter_mut().zip(&aux32) {
            *s += d * a as f32;
        }
    }
    let mut sumf = 0.0f32;
    for s in sums {
        sumf += s;
    }
    sumf
}

impl BlockFormat for BlockQ6K {
    const NAME: &'static str = "q6_k";
    const BLOCK_LEN: usize = QK_K;
    const GGML_TYPE: u32 = 14;
    type Activation = BlockQ8K;
    fn quantize_row_ref(x: &[f32], y: &mut [Self]) {
        quantize_row_q6_k_ref(x, y)
    }
    fn dequantize_row(x: &[Self], y: &mut [f32]) {
        dequantize_row_q6_k(x, y)
    }
    fn vec_dot_ref(x: &[Self], y: &[BlockQ8K]) -> f32 {
        vec_dot_q6_k_q8_k_ref(x, y)
    }
}
