use super::q5_0::pack_q5;
use super::q5_value;
use crate::block::{BlockFormat, BlockQ5_1, BlockQ8_1, QK5_1, f16};

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

/// ggml `quantize_row_q5_1_ref`: min maps to 0, max to 31.
pub fn quantize_row_q5_1_ref(x: &[f32], y: &mut [BlockQ5_1]) {
    assert_eq!(
        x.len(),
        y.len() * QK5_1,
        "quantize_row_q5_1_ref: length mismatch"
    );
    for (xb, yb) in x.chunks_exact(QK5_1).zip(y.iter_mut()) {
        let (min, max) = super::min_max(xb);
        let d = (max - min) / 31.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        yb.d = f16::from_f32(d);
        yb.m = f16::from_f32(min);
        let mut q = [0u8; 32];
        for (o, &v) in q.iter_mut().zip(xb) {
            // C: `(uint8_t)(x + 0.5f)`, no clamp (the max lands on 31.5 at most).
            *o = ((v - min) * id + 0.5) as u8;
        }
        pack_q5(&q, &mut yb.qs, &mut yb.qh);
    }
}

/// ggml `ggml_vec_dot_q5_1_q8_1` (generic): `d_x d_y sum(q_x q_y) + m_x s_y` per block.
pub fn vec_dot_q5_1_q8_1_ref(x: &[BlockQ5_1], y: &[BlockQ8_1]) -> f32 {
    assert_eq!(x.len(), y.len(), "vec_dot_q5_1_q8_1_ref: length mismatch");
    let mut sumf = 0.0f32;
    for (xb, yb) in x.iter().zip(y) {
        let mut sumi = 0i32;
        for (j, &q8) in yb.qs.iter().enumerate() {
            sumi += q5_value(&xb.qs, xb.qh, j) as i32 * q8 as i32;
        }
        sumf += (xb.d.to_f32() * yb.d.to_f32()) * sumi as f32 + xb.m.to_f32() * yb.s.to_f32();
    }
    sumf
}

impl BlockFormat for BlockQ5_1 {
    const NAME: &'static str = "q5_1";
    const BLOCK_LEN: usize = QK5_1;
    const GGML_TYPE: u32 = 7;
    type Activation = BlockQ8_1;
    fn quantize_row_ref(x: &[f32], y: &mut [Self]) {
        quantize_row_q5_1_ref(x, y)
    }
    fn dequantize_row(x: &[Self], y: &mut [f32]) {
        dequantize_row_q5_1(x, y)
    }
    fn vec_dot_ref(x: &[Self], y: &[BlockQ8_1]) -> f32 {
        vec_dot_q5_1_q8_1_ref(x, y)
    }
}
