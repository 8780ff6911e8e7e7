use super::q5_value;
use crate::block::{BlockQ5_1, QK5_1};

/// ggml `dequantize_row_q5_1`.
pub fn dequantize_row_q5_1(x: &[BlockQ5_1], y: &mut [f32]) {
    assert_eq!(
        y.len(),
        x.len() * QK5_1,
        "dequantize_row_q5_1: length mismatch"
    );
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK5_1)) {
        let d = xb.d.to_f32();
        let m = xb.m.to_f32();
        for (j, o) in yb.iter_mut().enumerate() {
            *o = q5_value(&xb.qs, xb.qh, j) as f32 * d + m;
        }
    }
}
