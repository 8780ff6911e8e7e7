use crate::block::{BlockQ5_0, QK5_0};

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
