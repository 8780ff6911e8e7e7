use super::q4_k::{sub_block_pair, vec_dot_k_mins};
use super::quantize_k_super_block;
use crate::block::{BlockFormat, BlockQ5K, BlockQ8K, QK_K};

/// ggml `dequantize_row_q5_K`.
pub fn dequantize_row_q5_k(x: &[BlockQ5K], y: &mut [f32]) {
    assert_eq!(
        y.len(),
        x.len() * QK_K,
        "dequantize_row_q5_k: length mismatch"
    );
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = xb.d.to_f32();
        let min = xb.dmin.to_f32();
        for (p, (ql, out)) in xb
            .qs
            .chunks_exact(32)
            .zip(yb.chunks_exact_mut(64))
            .enumerate()
        {
            let [(d1, m1), (d2, m2)] = sub_block_pair(d, min, &xb.scales, p);
            let (u1, u2) = (1u8 << (2 * p), 2u8 << (2 * p));
            for l in 0..32 {
                let h1 = if xb.qh[l] & u1 != 0 { 16 } else { 0 };
                let h2 = if xb.qh[l] & u2 != 0 { 16 } else { 0 };
                out[l] = d1 * ((ql[l] & 0x0f) + h1) as f32 - m1;
                out[l + 32] = d2 * ((ql[l] >> 4) + h2) as f32 - m2;
            }
        }
    }
}

/// ggml `quantize_row_q5_K_ref`: as Q4_K with 31 levels (15 steps from -0.5); bit 4 of each
/// level goes to `qh`.
pub fn quantize_row_q5_k_ref(x: &[f32], y: &mut [BlockQ5K]) {
    assert_eq!(
        x.len(),
        y.len() * QK_K,
        "quantize_row_q5_k_ref: length mismatch"
    );
    let mut l = [0u8; QK_K];
    for (xb, yb) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        (yb.d, yb.dmin, yb.scales) = quantize_k_super_block(xb, 31, -0.5, 15, &mut l);
        yb.qh = [0; QK_K / 8];
        for (p, ql) in yb.qs.chunks_exact_mut(32).enumerate() {
            let (m1, m2) = (1u8 << (2 * p), 2u8 << (2 * p));
            for j in 0..32 {
                let (mut l1, mut l2) = (l[64 * p + j], l[64 * p + j + 32]);
                if l1 > 15 {
                    l1 -= 16;
                    yb.qh[j] |= m1;
                }
                if l2 > 15 {
                    l2 -= 16;
                    yb.qh[j] |= m2;
                }
                ql[j] = l1 | (l2 << 4);
            }
        }
    }
}

/// ggml `ggml_vec_dot_q5_K_q8_K` (generic), summation order included.
pub fn vec_dot_q5_k_q8_k_ref(x: &[BlockQ5K], y: &[BlockQ8K]) -> f32 {
    assert_eq!(x.len(), y.len(), "vec_dot_q5_k_q8_k_ref: length mismatch");
    let blocks = x.iter().map(|xb| {
        let mut aux8 = [0i8; QK_K];
        for (p, q) in xb.qs.chunks_exact(32).enumerate() {
            let (m1, m2) = (1u8 << (2 * p), 2u8 << (2 * p));
            for l in 0..32 {
                let h1 = if xb.qh[l] & m1 != 0 { 16 } else { 0 };
                let h2 = if xb.qh[l] & m2 != 0 { 16 } else { 0 };
                aux8[64 * p + l] = (q[l] & 0x0f) as i8 + h1;
                aux8[64 * p + 32 + l] = (q[l] >> 4) as i8 + h2;
            }
        }
        (aux8, xb.d, xb.dmin, xb.scales)
    });
    vec_dot_k_mins(blocks, y)
}

impl BlockFormat for BlockQ5K {
    const NAME: &'static str = "q5_k";
    const BLOCK_LEN: usize = QK_K;
    const GGML_TYPE: u32 = 13;
    type Activation = BlockQ8K;
    fn quantize_row_ref(x: &[f32], y: &mut [Self]) {
        quantize_row_q5_k_ref(x, y)
    }
    fn dequantize_row(x: &[Self], y: &mut [f32]) {
        dequantize_row_q5_k(x, y)
    }
    fn vec_dot_ref(x: &[Self], y: &[BlockQ8K]) -> f32 {
        vec_dot_q5_k_q8_k_ref(x, y)
    }
}
