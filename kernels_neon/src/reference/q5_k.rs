use super::get_scale_min_k4;
use crate::block::{BlockQ5K, QK_K};

/// ggml `dequantize_row_q5_K`.
pub fn dequantize_row_q5_k(x: &[BlockQ5K], y: &mut [f32]) {
    assert_eq!(
        y.len(),
        x.len() * QK_K,
        "dequantize_row_q5_k: length mismatch"
    );
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = xb.d.to_f32();
        let min = xb.dmin.to_f32();
        for (p, (ql, out)) in xb
            .qs
            .chunks_exact(32)
            .zip(yb.chunks_exact_mut(64))
            .enumerate()
        {
            let (sc1, m1) = get_scale_min_k4(2 * p, &xb.scales);
            let (sc2, m2) = get_scale_min_k4(2 * p + 1, &xb.scales);
            let (d1, m1) = (d * sc1 as f32, min * m1 as f32);
            let (d2, m2) = (d * sc2 as f32, min * m2 as f32);
            let (u1, u2) = (1u8 << (2 * p), 2u8 << (2 * p));
            for l in 0..32 {
                let h1 = if xb.qh[l] & u1 != 0 { 16 } else { 0 };
                let h2 = if xb.qh[l] & u2 != 0 { 16 } else { 0 };
                out[l] = d1 * ((ql[l] & 0x0f) + h1) as f32 - m1;
                out[l + 32] = d2 * ((ql[l] >> 4) + h2) as f32 - m2;
            }
        }
    }
}
