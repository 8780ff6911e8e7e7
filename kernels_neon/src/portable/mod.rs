//! Portable SIMD through `wide`: the path on any target without a hand-written one, and the
//! fallback on x86 without AVX2. Safe code only; `wide` picks SSE2/NEON/simd128/scalar
//! implementations at compile time from the target's baseline features.
//!
//! - `quant`: Q8_0/Q8_1 activation quantizers, byte-identical to the references.
//! - Q5_0 and Q5_1 go through the Q4 tiles with their fifth bits unpacked.
//! - `kquant`: Q4_K, Q5_K and Q6_K × Q8_K on the other fast paths' arithmetic sequence
//!   (`kseq`), so their bits match AVX2's and NEON's; the Q8_K quantizer is the reference's.
//! - `dot`: per-block integer dot products on 16-bit lanes.
//! - `matmul`: one register tile for `vec_dot`, `matvec` (4 rows per pass) and `matmul`
//!   (4 rows × 2 tokens), with a row's result independent of the tiling.
//! - `ops`: the f32 operations (`rope_norm` is the reference's loop); `simd`: exact f16
//!   conversions and `exp` on vectors.

mod dot;
mod kquant;
mod matmul;
mod ops;
mod quant;
mod simd;

use crate::dispatch::{Kernels, Path};

/// Walks a `rows × n_tok` output in tiles of at most `rm × rn` (smaller ones at the bottom and
/// right edges), calling `tile(r, t, rows_here, toks_here)` for each: the one tile order of the
/// quantized products (`matmul`, `kquant`).
#[inline(always)]
fn for_each_tile(
    rows: usize,
    n_tok: usize,
    rm: usize,
    rn: usize,
    mut tile: impl FnMut(usize, usize, usize, usize),
) {
    let mut r = 0;
    while r < rows {
        let m = rm.min(rows - r);
        let mut t = 0;
        while t < n_tok {
            let n = rn.min(n_tok - t);
            tile(r, t, m, n);
            t += n;
        }
        r += m;
    }
}

/// The portable table. Every kernel but `rope_norm` has a vectorised version.
pub(crate) const TABLE: Kernels = Kernels {
    path: Path::Portable,
    quantize_row_q8_0: quant::quantize_row_q8_0,
    quantize_row_q8_1: quant::quantize_row_q8_1,
    vec_dot_q4_0_q8_0: matmul::vec_dot_q4_0_q8_0,
    vec_dot_q4_1_q8_1: matmul::vec_dot_q4_1_q8_1,
    vec_dot_q8_0_q8_0: matmul::vec_dot_q8_0_q8_0,
    matvec_q4_0_q8_0: matmul::matvec_q4_0_q8_0,
    matvec_q4_1_q8_1: matmul::matvec_q4_1_q8_1,
    matvec_q8_0_q8_0: matmul::matvec_q8_0_q8_0,
    matmul_q4_0_q8_0: matmul::matmul_q4_0_q8_0,
    matmul_q4_1_q8_1: matmul::matmul_q4_1_q8_1,
    matmul_q8_0_q8_0: matmul::matmul_q8_0_q8_0,
    packed: None,
    packed_k: Some(kquant::PACKED_K),
    more: crate::dispatch::MoreFormats {
        quantize_row_q8_k: quant::quantize_row_q8_k,
        vec_dot_q5_0_q8_0: matmul::vec_dot_q5_0_q8_0,
        vec_dot_q5_1_q8_1: matmul::vec_dot_q5_1_q8_1,
        matvec_q5_0_q8_0: matmul::matvec_q5_0_q8_0,
        matvec_q5_1_q8_1: matmul::matvec_q5_1_q8_1,
        matmul_q5_0_q8_0: matmul::matmul_q5_0_q8_0,
        matmul_q5_1_q8_1: matmul::matmul_q5_1_q8_1,
        vec_dot_q4_k_q8_k: kquant::vec_dot_q4_k_q8_k,
        matvec_q4_k_q8_k: kquant::matvec_q4_k_q8_k,
        matmul_q4_k_q8_k: kquant::matmul_q4_k_q8_k,
        vec_dot_q6_k_q8_k: kquant::vec_dot_q6_k_q8_k,
        matvec_q6_k_q8_k: kquant::matvec_q6_k_q8_k,
        matmul_q6_k_q8_k: kquant::matmul_q6_k_q8_k,
        vec_dot_q5_k_q8_k: kquant::vec_dot_q5_k_q8_k,
        matvec_q5_k_q8_k: kquant::matvec_q5_k_q8_k,
        matmul_q5_k_q8_k: kquant::matmul_q5_k_q8_k,
    },
    rms_norm: ops::rms_norm,
    softmax: ops::softmax,
    silu_mul: ops::silu_mul,
    gelu_mul: ops::gelu_mul,
    // Interleaved pairs need lane swaps `wide` does not offer; built from arrays they were
    // slower than the reference's plain loop, which the compiler vectorises well enough.
    rope_norm: crate::reference::rope_norm_ref,
    rope_neox: ops::rope_neox,
    add: ops::add,
    scale: ops::scale,
    dot_f32: ops::dot_f32,
    axpy_f32: ops::axpy_f32,
    dot_f16: ops::dot_f16,
    axpy_f16: ops::axpy_f16,
    scores_f16: ops::scores_f16,
    mix_f16: ops::mix_f16,
    f16_to_f32_row: ops::f16_to_f32_row,
    f32_to_f16_row: ops::f32_to_f16_row,
};
