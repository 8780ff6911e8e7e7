use crate::block::{BlockQ4K, K_SCALE_SIZE, QK_K};

/// ggml `get_scale_min_k4`: sub-block `j`'s (0..8) 6-bit scale and min. Scales 0..4 and mins
/// 0..4 are the low six bits of bytes 0..4 and 4..8; for 4..8 the low four bits come from a
/// nibble of bytes 8..12 and the high two from the top bits of bytes 0..8.
#[inline]
pub fn get_scale_min_k4(j: usize, q: &[u8; K_SCALE_SIZE]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// ggml `dequantize_row_q4_K`.
pub fn dequantize_row_q4_k(x: &[BlockQ4K], y: &mut [f32]) {
    assert_eq!(
        y.len(),
        x.len() * QK_K,
        "dequantize_row_q4_k: length mismatch"
    );
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = xb.d.to_f32();
        let min = xb.dmin.to_f32();
        for (p, (q, out)) in xb
            .qs
            .chunks_exact(32)
            .zip(yb.chunks_exact_mut(64))
            .enumerate()
        {
            let (sc1, m1) = get_scale_min_k4(2 * p, &xb.scales);
            let (sc2, m2) = get_scale_min_k4(2 * p + 1, &xb.scales);
            let (d1, m1) = (d * sc1 as f32, min * m1 as f32);
            let (d2, m2) = (d * sc2 as f32, min * m2 as f32);
            for l in 0..32 {
                out[l] = d1 * (q[l] & 0x0f) as f32 - m1;
                out[l + 32] = d2 * (q[l] >> 4) as f32 - m2;
            }
        }
    }
}
