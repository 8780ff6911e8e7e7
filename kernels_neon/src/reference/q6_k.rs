use crate::block::{BlockQ6K, QK_K};

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
