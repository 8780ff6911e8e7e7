use super::q8_0::{dequantize_q8_block, dot_q8_blocks, quantize_q8_block};
use crate::block::{BlockFormat, BlockQ8_1, QK8_1, f16};

/// ggml `quantize_row_q8_1_ref`: as Q8_0, plus `s = d * sum(q)` for the Q4_1 offset term.
pub fn quantize_row_q8_1_ref(x: &[f32], y: &mut [BlockQ8_1]) {
    assert_eq!(
        x.len(),
        y.len() * QK8_1,
        "quantize_row_q8_1_ref: length mismatch"
    );
    for (xb, yb) in x.chunks_exact(QK8_1).zip(y.iter_mut()) {
        let d = quantize_q8_block(xb, &mut yb.qs);
        let sum: i32 = yb.qs.iter().map(|&q| q as i32).sum();
        yb.d = f16::from_f32(d);
        yb.s = f16::from_f32(sum as f32 * d);
    }
}

/// Dequantizes Q8_1 (`x = q * d`); `s` is redundant.
pub fn dequantize_row_q8_1(x: &[BlockQ8_1], y: &mut [f32]) {
    assert_eq!(
        y.len(),
        x.len() * QK8_1,
        "dequantize_row_q8_1: length mismatch"
    );
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK8_1)) {
        dequantize_q8_block(xb.d, &xb.qs, yb);
    }
}

/// Q8_1 × Q8_1 (not used by the engine; it makes Q8_1 a complete [`BlockFormat`]).
pub fn vec_dot_q8_1_q8_1_ref(x: &[BlockQ8_1], y: &[BlockQ8_1]) -> f32 {
    assert_eq!(x.len(), y.len(), "vec_dot_q8_1_q8_1_ref: length mismatch");
    let mut sumf = 0.0f32;
    for (xb, yb) in x.iter().zip(y) {
        let sumi = dot_q8_blocks(&xb.qs, &yb.qs);
        sumf += sumi as f32 * (xb.d.to_f32() * yb.d.to_f32());
    }
    sumf
}

impl BlockFormat for BlockQ8_1 {
    const NAME: &'static str = "q8_1";
    const BLOCK_LEN: usize = QK8_1;
    const GGML_TYPE: u32 = 9;
    type Activation = BlockQ8_1;
    fn quantize_row_ref(x: &[f32], y: &mut [Self]) {
        quantize_row_q8_1_ref(x, y)
    }
    fn dequantize_row(x: &[Self], y: &mut [f32]) {
        dequantize_row_q8_1(x, y)
    }
    fn vec_dot_ref(x: &[Self], y: &[BlockQ8_1]) -> f32 {
        vec_dot_q8_1_q8_1_ref(x, y)
    }
}
