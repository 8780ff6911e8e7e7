use crate::block::{BlockFormat, BlockQ8_0, QK8_0, f16};

/// ggml `quantize_row_q8_0_ref`: `d = amax / 127`, values rounded half away from zero.
pub fn quantize_row_q8_0_ref(x: &[f32], y: &mut [BlockQ8_0]) {
    assert_eq!(
        x.len(),
        y.len() * QK8_0,
        "quantize_row_q8_0_ref: length mismatch"
    );
    for (xb, yb) in x.chunks_exact(QK8_0).zip(y.iter_mut()) {
        let amax = xb.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        yb.d = f16::from_f32(d);
        for (q, &v) in yb.qs.iter_mut().zip(xb) {
            *q = (v * id).round() as i8;
        }
    }
}

/// ggml `dequantize_row_q8_0`.
pub fn dequantize_row_q8_0(x: &[BlockQ8_0], y: &mut [f32]) {
    assert_eq!(
        y.len(),
        x.len() * QK8_0,
        "dequantize_row_q8_0: length mismatch"
    );
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK8_0)) {
        let d = xb.d.to_f32();
        for (o, &q) in yb.iter_mut().zip(&xb.qs) {
            *o = q as f32 * d;
        }
    }
}

/// ggml `ggml_vec_dot_q8_0_q8_0` (generic).
pub fn vec_dot_q8_0_q8_0_ref(x: &[BlockQ8_0], y: &[BlockQ8_0]) -> f32 {
    assert_eq!(x.len(), y.len(), "vec_dot_q8_0_q8_0_ref: length mismatch");
    let mut sumf = 0.0f32;
    for (xb, yb) in x.iter().zip(y) {
        let sumi: i32 = xb
            .qs
            .iter()
            .zip(&yb.qs)
            .map(|(&a, &b)| a as i32 * b as i32)
            .sum();
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
