use super::nearest_int;
use crate::block::{BlockFormat, BlockQ8K, QK_K};

/// ggml `quantize_row_q8_K_ref`: `d = max / -127` of the value with the largest magnitude
/// (ggml's comment: -127, not -128, for IQ2_XXS's AVX path), values by `nearest_int`, and the
/// sums of each sixteen quants in `bsums`. An all-zero block gets `d = 0`, zero quants and
/// zero `bsums` (ggml leaves `bsums` as they were; nothing reads them when `d = 0`).
pub fn quantize_row_q8_k_ref(x: &[f32], y: &mut [BlockQ8K]) {
    assert_eq!(
        x.len(),
        y.len() * QK_K,
        "quantize_row_q8_k_ref: length mismatch"
    );
    for (xb, yb) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        let max = super::signed_absmax(xb);
        if max == 0.0 {
            *yb = BlockQ8K::default();
            continue;
        }
        let iscale = -127.0f32 / max;
        for (q, &v) in yb.qs.iter_mut().zip(xb) {
            // C stores `MIN(127, v)` into an int8_t: truncation, as `as i8`.
            *q = nearest_int(iscale * v).min(127) as i8;
        }
        for (s, q) in yb.bsums.iter_mut().zip(yb.qs.chunks_exact(16)) {
            *s = q.iter().map(|&v| v as i32).sum::<i32>() as i16;
        }
        yb.d = 1.0 / iscale;
    }
}

/// ggml `dequantize_row_q8_K`: `x = d * q`.
pub fn dequantize_row_q8_k(x: &[BlockQ8K], y: &mut [f32]) {
    assert_eq!(
        y.len(),
        x.len() * QK_K,
        "dequantize_row_q8_k: length mismatch"
    );
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        for (o, &q) in yb.iter_mut().zip(&xb.qs) {
            *o = xb.d * q as f32;
        }
    }
}

/// Q8_K × Q8_K. ggml has no such kernel (Q8_K is only ever an activation); this simple
/// reference, `sum_blocks d_x d_y sum(q_x q_y)`, only makes Q8_K a complete [`BlockFormat`].
pub fn vec_dot_q8_k_q8_k_ref(x: &[BlockQ8K], y: &[BlockQ8K]) -> f32 {
    assert_eq!(x.len(), y.len(), "vec_dot_q8_k_q8_k_ref: length mismatch");
    let mut sumf = 0.0f32;
    for (xb, yb) in x.iter().zip(y) {
        let sumi: i32 = xb
            .qs
            .iter()
            .zip(&yb.qs)
            .map(|(&a, &b)| a as i32 * b as i32)
            .sum();
        sumf += xb.d * yb.d * sumi as f32;
    }
    sumf
}

impl BlockFormat for BlockQ8K {
    const NAME: &'static str = "q8_k";
    const BLOCK_LEN: usize = QK_K;
    const GGML_TYPE: u32 = 15;
    type Activation = BlockQ8K;
    fn quantize_row_ref(x: &[f32], y: &mut [Self]) {
        quantize_row_q8_k_ref(x, y)
    }
    fn dequantize_row(x: &[Self], y: &mut [f32]) {
        dequantize_row_q8_k(x, y)
    }
    fn vec_dot_ref(x: &[Self], y: &[BlockQ8K]) -> f32 {
        vec_dot_q8_k_q8_k_ref(x, y)
    }
}
