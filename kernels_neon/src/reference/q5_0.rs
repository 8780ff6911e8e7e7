use crate::block::{BlockFormat, BlockQ5_0, BlockQ8_0, QK5_0, f16};

/// Value `j` (0..32) of a Q5_0/Q5_1 block as an unsigned 5-bit number: the nibble from `qs`,
/// bit 4 from bit `j` of `qh`.
#[inline]
pub fn q5_value(qs: &[u8; 16], qh: [u8; 4], j: usize) -> u8 {
    let h = u32::from_le_bytes(qh);
    let lo = if j < 16 {
        qs[j] & 0x0f
    } else {
        qs[j - 16] >> 4
    };
    lo | ((((h >> j) & 1) as u8) << 4)
}

/// ggml `dequantize_row_q5_0`.
pub fn dequantize_row_q5_0(x: &[BlockQ5_0], y: &mut [f32]) {
    assert_eq!(
        y.len(),
        x.len() * QK5_0,
        "dequantize_row_q5_0: length mismatch"
    );
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK5_0)) {
        let d = xb.d.to_f32();
        for (j, o) in yb.iter_mut().enumerate() {
            *o = (q5_value(&xb.qs, xb.qh, j) as i32 - 16) as f32 * d;
        }
    }
}

/// Packs 32 five-bit values as ggml: low nibbles in `qs` (values 0..16 low, 16..32 high), bit 4
/// of value `j` in bit `j` of `qh` (little-endian).
pub(super) fn pack_q5(q: &[u8; 32], qs: &mut [u8; 16], qh: &mut [u8; 4]) {
    let mut h = 0u32;
    for j in 0..16 {
        let (x0, x1) = (q[j], q[j + 16]);
        qs[j] = (x0 & 0x0f) | ((x1 & 0x0f) << 4);
        h |= (((x0 & 0x10) >> 4) as u32) << j;
        h |= (((x1 & 0x10) >> 4) as u32) << (j + 16);
    }
    *qh = h.to_le_bytes();
}

/// ggml `quantize_row_q5_0_ref`: `d = max / -16` of the value with the largest magnitude, so
/// that value maps to level 0 and the others to `x / d + 16` rounded (the `+ 16.5` truncation).
pub fn quantize_row_q5_0_ref(x: &[f32], y: &mut [BlockQ5_0]) {
    assert_eq!(
        x.len(),
        y.len() * QK5_0,
        "quantize_row_q5_0_ref: length mismatch"
    );
    for (xb, yb) in x.chunks_exact(QK5_0).zip(y.iter_mut()) {
        let max = super::signed_absmax(xb);
        let d = max / -16.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        yb.d = f16::from_f32(d);
        let mut q = [0u8; 32];
        for (o, &v) in q.iter_mut().zip(xb) {
            // C: `MIN(31, (int8_t)(x + 16.5f))`; Rust's `as` saturates where C's would be UB.
            *o = ((v * id + 16.5) as i8).min(31) as u8;
        }
        pack_q5(&q, &mut yb.qs, &mut yb.qh);
    }
}

/// ggml `ggml_vec_dot_q5_0_q8_0` (generic): `d_x d_y sum((q_x - 16) q_y)` per block.
pub fn vec_dot_q5_0_q8_0_ref(x: &[BlockQ5_0], y: &[BlockQ8_0]) -> f32 {
    assert_eq!(x.len(), y.len(), "vec_dot_q5_0_q8_0_ref: length mismatch");
    let mut sumf = 0.0f32;
    for (xb, yb) in x.iter().zip(y) {
        let mut sumi = 0i32;
        for (j, &q8) in yb.qs.iter().enumerate() {
            sumi += (q5_value(&xb.qs, xb.qh, j) as i32 - 16) * q8 as i32;
        }
        sumf += (xb.d.to_f32() * yb.d.to_f32()) * sumi as f32;
    }
    sumf
}

impl BlockFormat for BlockQ5_0 {
    const NAME: &'static str = "q5_0";
    const BLOCK_LEN: usize = QK5_0;
    const GGML_TYPE: u32 = 6;
    type Activation = BlockQ8_0;
    fn quantize_row_ref(x: &[f32], y: &mut [Self]) {
        quantize_row_q5_0_ref(x, y)
    }
    fn dequantize_row(x: &[Self], y: &mut [f32]) {
        dequantize_row_q5_0(x, y)
    }
    fn vec_dot_ref(x: &[Self], y: &[BlockQ8_0]) -> f32 {
        vec_dot_q5_0_q8_0_ref(x, y)
    }
}
