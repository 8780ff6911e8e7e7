use crate::block::{BlockFormat, BlockQ8_0, QK8_0, f16};

/// ggml `quantize_row_q8_0_ref`: `d = amax / 127`, values rounded half away from zero.
pub fn quantize_row_q8_0_ref(x: &[f32], y: &mut [BlockQ8_0]) {
    assert_eq!(
        x.len(),
        y.len() * QK8_0,
        "quantize_row_q8_0_ref: length mismatch"
    );
    for (xb, yb) in x.chunks_exact(QK8_0).zip(y.iter_mut()) {
        yb.d = f16::from_f32(quantize_q8_block(xb, &mut yb.qs));
    }
}

/// The 8-bit block quantizer shared by Q8_0 and Q8_1: `d = amax / 127`, `q = round(x / d)`
/// (half away from zero, as C's `roundf`). Returns `d` in f32.
pub(super) fn quantize_q8_block(x: &[f32], qs: &mut [i8; 32]) -> f32 {
    let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    for (q, &v) in qs.iter_mut().zip(x) {
        *q = (v * id).round() as i8;
    }
    d
}

/// `y = q * d` for one 8-bit block.
pub(super) fn dequantize_q8_block(d: f16, qs: &[i8; 32], y: &mut [f32]) {
    let d = d.to_f32();
    for (o, &q) in y.iter_mut().zip(qs) {
        *o = q as f32 * d;
    }
}

/// Exact integer dot product of two 8-bit blocks.
pub(super) fn dot_q8_blocks(a: &[i8; 32], b: &[i8; 32]) -> i32 {
    a.iter().zip(b).map(|(&x, &y)| x as i32 * y as i32).sum()
}

/// ggml `dequantize_row_q8_0`.
pub fn dequantize_row_q8_0(x: &[BlockQ8_0], y: &mut [f32]) {
    assert_eq!(
        y.len(),
        x.len() * QK8_0,
        "dequantize_row_q8_0: length mismatch"
    );
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK8_0)) {
        dequantize_q8_block(xb.d, &xb.qs, yb);
    }
}

/// ggml `ggml_vec_dot_q8_0_q8_0` (generic).
pub fn vec_dot_q8_0_q8_0_ref(x: &[BlockQ8_0], y: &[BlockQ8_0]) -> f32 {
    assert_eq!(x.len(), y.len(), "vec_dot_q8_0_q8_0_ref: length mismatch");
    let mut sumf = 0.0f32;
    for (xb, yb) in x.iter().zip(y) {
        let sumi = dot_q8_blocks(&xb.qs, &yb.qs);
        sumf += sumi as f32 * (xb.d.to_f32() * yb.d.to_f32());
    }
    sumf
}

impl BlockFormat for BlockQ8_0 {
    const NAME: &'static str = "q8_0";
    const BLOCK_LEN: usize = QK8_0;
    const GGML_TYPE: u32 = 8;
    type Activation = BlockQ8_0;
    fn quantize_row_ref(x: &[f32], y: &mut [Self]) {
        quantize_row_q8_0_ref(x, y)
    }
    fn dequantize_row(x: &[Self], y: &mut [f32]) {
        dequantize_row_q8_0(x, y)
    }
    fn vec_dot_ref(x: &[Self], y: &[BlockQ8_0]) -> f32 {
        vec_dot_q8_0_q8_0_ref(x, y)
    }
}
