use super::{k_dot_aux32, quantize_k_super_block};
use crate::block::{BlockFormat, BlockQ4K, BlockQ8K, K_SCALE_SIZE, QK_K, f16};

/// ggml `get_scale_min_k4`: sub-block `j`'s (0..8) 6-bit scale and min. Scales 0..4 and mins
/// 0..4 are the low six bits of bytes 0..4 and 4..8; for 4..8 the low four bits come from a
/// nibble of bytes 8..12 and the high two from the top bits of bytes 0..8.
#[inline]
pub fn get_scale_min_k4(j: usize, q: &[u8; K_SCALE_SIZE]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// The scales and offsets of sub-blocks `2p` and `2p + 1` of a Q4_K/Q5_K super-block as the
/// dequantizers use them: `((d·sc, dmin·m), (d·sc', dmin·m'))`.
#[inline]
pub(crate) fn sub_block_pair(d: f32, min: f32, scales: &[u8; 12], p: usize) -> [(f32, f32); 2] {
    [2 * p, 2 * p + 1].map(|j| {
        let (sc, m) = get_scale_min_k4(j, scales);
        (d * sc as f32, min * m as f32)
    })
}

/// ggml `dequantize_row_q4_K`.
pub fn dequantize_row_q4_k(x: &[BlockQ4K], y: &mut [f32]) {
    assert_eq!(
        y.len(),
        x.len() * QK_K,
        "dequantize_row_q4_k: length mismatch"
    );
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = xb.d.to_f32();
        let min = xb.dmin.to_f32();
        for (p, (q, out)) in xb
            .qs
            .chunks_exact(32)
            .zip(yb.chunks_exact_mut(64))
            .enumerate()
        {
            let [(d1, m1), (d2, m2)] = sub_block_pair(d, min, &xb.scales, p);
            for l in 0..32 {
                out[l] = d1 * (q[l] & 0x0f) as f32 - m1;
                out[l + 32] = d2 * (q[l] >> 4) as f32 - m2;
            }
        }
    }
}

/// ggml `quantize_row_q4_K_ref`: per sub-block of 32 a `make_qkx2_quants` fit with 15 levels
/// (20 steps from -1), 6-bit scales and mins, then nibbles packed as the dequantizer reads them.
pub fn quantize_row_q4_k_ref(x: &[f32], y: &mut [BlockQ4K]) {
    assert_eq!(
        x.len(),
        y.len() * QK_K,
        "quantize_row_q4_k_ref: length mismatch"
    );
    let mut l = [0u8; QK_K];
    for (xb, yb) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        (yb.d, yb.dmin, yb.scales) = quantize_k_super_block(xb, 15, -1.0, 20, &mut l);
        for (p, q) in yb.qs.chunks_exact_mut(32).enumerate() {
            for (i, o) in q.iter_mut().enumerate() {
                *o = l[64 * p + i] | (l[64 * p + i + 32] << 4);
            }
        }
    }
}

/// ggml's generic Q4_K/Q5_K dot product given the unpacked levels `aux8`: integer sums per
/// lane (`aux32`), float sums per lane across all blocks (`sums[8]`), the mins' term
/// subtracted from `sumf` per block, the eight lanes added last. That order is the reference.
pub(super) fn vec_dot_k_mins(
    blocks: impl Iterator<Item = ([i8; QK_K], f16, f16, [u8; K_SCALE_SIZE])>,
    y: &[BlockQ8K],
) -> f32 {
    let mut sums = [0.0f32; 8];
    let mut sumf = 0.0f32;
    for ((aux8, d, dmin, sc), yb) in blocks.zip(y) {
        let (mut scales, mut mins) = ([0i32; 8], [0i32; 8]);
        for j in 0..8 {
            let (s, m) = get_scale_min_k4(j, &sc);
            (scales[j], mins[j]) = (s as i32, m as i32);
        }
        let mut sumi = 0i32;
        for (j, &b) in yb.bsums.iter().enumerate() {
            sumi = sumi.wrapping_add(b as i32 * mins[j / 2]);
        }
        let aux32 = k_dot_aux32(&aux8, &yb.qs, &scales);
        let d = d.to_f32() * yb.d;
        for (s, &a) in sums.iter_mut().zip(&aux32) {
            *s += d * a as f32;
        }
        let dmin = dmin.to_f32() * yb.d;
        sumf -= dmin * sumi as f32;
    }
    for s in sums {
        sumf += s;
    }
    sumf
}

/// ggml `ggml_vec_dot_q4_K_q8_K` (generic), summation order included.
pub fn vec_dot_q4_k_q8_k_ref(x: &[BlockQ4K], y: &[BlockQ8K]) -> f32 {
    assert_eq!(x.len(), y.len(), "vec_dot_q4_k_q8_k_ref: length mismatch");
    let blocks = x.iter().map(|xb| {
        let mut aux8 = [0i8; QK_K];
        for (p, q) in xb.qs.chunks_exact(32).enumerate() {
            for l in 0..32 {
                aux8[64 * p + l] = (q[l] & 0x0f) as i8;
                aux8[64 * p + 32 + l] = (q[l] >> 4) as i8;
            }
        }
        (aux8, xb.d, xb.dmin, xb.scales)
    });
    vec_dot_k_mins(blocks, y)
}

impl BlockFormat for BlockQ4K {
    const NAME: &'static str = "q4_k";
    const BLOCK_LEN: usize = QK_K;
    const GGML_TYPE: u32 = 12;
    type Activation = BlockQ8K;
    fn quantize_row_ref(x: &[f32], y: &mut [Self]) {
        quantize_row_q4_k_ref(x, y)
    }
    fn dequantize_row(x: &[Self], y: &mut [f32]) {
        dequantize_row_q4_k(x, y)
    }
    fn vec_dot_ref(x: &[Self], y: &[BlockQ8K]) -> f32 {
        vec_dot_q4_k_q8_k_ref(x, y)
    }
}
