use crate::block::{BlockFormat, BlockQ4_1, BlockQ8_1, QK4_1, f16};

/// ggml `quantize_row_q4_1_ref`: min maps to 0, max to 15.
pub fn quantize_row_q4_1_ref(x: &[f32], y: &mut [BlockQ4_1]) {
    assert_eq!(
        x.len(),
        y.len() * QK4_1,
        "quantize_row_q4_1_ref: length mismatch"
    );
    for (xb, yb) in x.chunks_exact(QK4_1).zip(y.iter_mut()) {
        let (min, max) = super::min_max(xb);
        let d = (max - min) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        yb.d = f16::from_f32(d);
        yb.m = f16::from_f32(min);
        for j in 0..QK4_1 / 2 {
            let x0 = (xb[j] - min) * id;
            let x1 = (xb[QK4_1 / 2 + j] - min) * id;
            let q0 = ((x0 + 0.5) as i8).min(15) as u8;
            let q1 = ((x1 + 0.5) as i8).min(15) as u8;
            yb.qs[j] = q0 | (q1 << 4);
        }
    }
}

/// ggml `dequantize_row_q4_1`.
pub fn dequantize_row_q4_1(x: &[BlockQ4_1], y: &mut [f32]) {
    assert_eq!(
        y.len(),
        x.len() * QK4_1,
        "dequantize_row_q4_1: length mismatch"
    );
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK4_1)) {
        let d = xb.d.to_f32();
        let m = xb.m.to_f32();
        for j in 0..QK4_1 / 2 {
            yb[j] = (xb.qs[j] & 0x0f) as f32 * d + m;
            yb[j + QK4_1 / 2] = (xb.qs[j] >> 4) as f32 * d + m;
        }
    }
}

/// ggml `ggml_vec_dot_q4_1_q8_1` (generic): `d_x d_y sum(q_x q_y) + m_x s_y`.
pub fn vec_dot_q4_1_q8_1_ref(x: &[BlockQ4_1], y: &[BlockQ8_1]) -> f32 {
    assert_eq!(x.len(), y.len(), "vec_dot_q4_1_q8_1_ref: length mismatch");
    let mut sumf = 0.0f32;
    for (xb, yb) in x.iter().zip(y) {
        let mut sumi = 0i32;
        for j in 0..QK4_1 / 2 {
            let v0 = (xb.qs[j] & 0x0f) as i32;
            let v1 = (xb.qs[j] >> 4) as i32;
            sumi += v0 * yb.qs[j] as i32 + v1 * yb.qs[j + QK4_1 / 2] as i32;
        }
        sumf += (xb.d.to_f32() * yb.d.to_f32()) * sumi as f32 + xb.m.to_f32() * yb.s.to_f32();
    }
    sumf
}

impl BlockFormat for BlockQ4_1 {
    const NAME: &'static str = "q4_1";
    const BLOCK_LEN: usize = QK4_1;
    const GGML_TYPE: u32 = 3;
    type Activation = BlockQ8_1;
    fn quantize_row_ref(x: &[f32], y: &mut [Self]) {
        quantize_row_q4_1_ref(x, y)
    }
    fn dequantize_row(x: &[Self], y: &mut [f32]) {
        dequantize_row_q4_1(x, y)
    }
    fn vec_dot_ref(x: &[Self], y: &[BlockQ8_1]) -> f32 {
        vec_dot_q4_1_q8_1_ref(x, y)
    }
}
