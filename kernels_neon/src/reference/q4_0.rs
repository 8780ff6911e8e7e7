use crate::block::{BlockFormat, BlockQ4_0, BlockQ8_0, QK4_0, f16};

/// ggml `quantize_row_q4_0_ref`: the value of largest magnitude maps to -8, so its sign is kept.
pub fn quantize_row_q4_0_ref(x: &[f32], y: &mut [BlockQ4_0]) {
    assert_eq!(
        x.len(),
        y.len() * QK4_0,
        "quantize_row_q4_0_ref: length mismatch"
    );
    for (xb, yb) in x.chunks_exact(QK4_0).zip(y.iter_mut()) {
        let max = super::signed_absmax(xb);
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        yb.d = f16::from_f32(d);
        for j in 0..QK4_0 / 2 {
            let x0 = xb[j] * id;
            let x1 = xb[QK4_0 / 2 + j] * id;
            // `as i8` truncates toward zero like C's (int8_t) cast (and saturates where C is UB).
            let q0 = ((x0 + 8.5) as i8).min(15) as u8;
            let q1 = ((x1 + 8.5) as i8).min(15) as u8;
            yb.qs[j] = q0 | (q1 << 4);
        }
    }
}

/// ggml `dequantize_row_q4_0`.
pub fn dequantize_row_q4_0(x: &[BlockQ4_0], y: &mut [f32]) {
    assert_eq!(
        y.len(),
        x.len() * QK4_0,
        "dequantize_row_q4_0: length mismatch"
    );
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK4_0)) {
        let d = xb.d.to_f32();
        for j in 0..QK4_0 / 2 {
            yb[j] = ((xb.qs[j] & 0x0f) as i32 - 8) as f32 * d;
            yb[j + QK4_0 / 2] = ((xb.qs[j] >> 4) as i32 - 8) as f32 * d;
        }
    }
}

/// ggml `ggml_vec_dot_q4_0_q8_0` (generic): exact integer sum per block, then scaled.
pub fn vec_dot_q4_0_q8_0_ref(x: &[BlockQ4_0], y: &[BlockQ8_0]) -> f32 {
    assert_eq!(x.len(), y.len(), "vec_dot_q4_0_q8_0_ref: length mismatch");
    let mut sumf = 0.0f32;
    for (xb, yb) in x.iter().zip(y) {
        let mut sumi = 0i32;
        for j in 0..QK4_0 / 2 {
            let v0 = (xb.qs[j] & 0x0f) as i32 - 8;
            let v1 = (xb.qs[j] >> 4) as i32 - 8;
            sumi += v0 * yb.qs[j] as i32 + v1 * yb.qs[j + QK4_0 / 2] as i32;
        }
        sumf += sumi as f32 * (xb.d.to_f32() * yb.d.to_f32());
    }
    sumf
}

impl BlockFormat for BlockQ4_0 {
    const NAME: &'static str = "q4_0";
    const BLOCK_LEN: usize = QK4_0;
    const GGML_TYPE: u32 = 2;
    type Activation = BlockQ8_0;
    fn quantize_row_ref(x: &[f32], y: &mut [Self]) {
        quantize_row_q4_0_ref(x, y)
    }
    fn dequantize_row(x: &[Self], y: &mut [f32]) {
        dequantize_row_q4_0(x, y)
    }
    fn vec_dot_ref(x: &[Self], y: &[BlockQ8_0]) -> f32 {
        vec_dot_q4_0_q8_0_ref(x, y)
    }
}
