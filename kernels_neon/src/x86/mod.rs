//! x86_64 AVX2 + FMA + F16C.
//!
//! Safety model: the kernels are safe functions that check their slice lengths and then call
//! a `#[target_feature(enable = "avx2,fma,f16c")]` body in an `unsafe` block. They are
//! `pub(crate)` and reachable only through [`AVX2`], which `dispatch::Kernels::for_path`
//! hands out only after `is_x86_feature_detected!` confirmed avx2, fma and f16c. Nothing here
//! uses AVX-512 except EVEX instructions on 256-bit registers written as `asm!` (`vpdpbusd`,
//! and in the packed prompt tiles its embedded-broadcast form) in the [`AVX512VNNI`] table's
//! integer sums, which `dispatch` hands out only after also detecting avx512vnni and
//! avx512vl; nothing depends on build-time CPU flags.
//!
//! - `quant`: Q8_0/Q8_1 activation quantizers, byte-identical to the references.
//! - `dot`: integer dot products (`maddubs`/`madd`) of Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 for groups of four
//!   weight rows, reduced together.
//! - `matmul`: one register tile for `vec_dot`, `matvec` (8 rows per pass, weights
//!   prefetched) and `matmul` (8 rows × 3 tokens), with a row's result independent of the
//!   tiling; nothing allocated (activation scales converted into a stack scratch).
//! - `kquant`: Q4_K, Q5_K and Q6_K against Q8_K, a super-block unpacked once per row and
//!   shared by up to sixteen tokens.
//! - `packed`: products over weights interleaved 8 rows at a time (`avx512vnni` only).
//! - `kpacked`: products over K-quant weights interleaved 8 rows at a time (both tables).
//! - `ops`: the f32 operations (Cephes `exp` polynomial in softmax/silu), f16 conversions
//!   through F16C.
//! - `attention`: scores and weighted sums over the f16 KV cache for a group of query heads.
//! - `simd`: loads/stores from references, reductions, `exp`.

/// Safe entry points over `#[target_feature]` bodies: see the safety model above.
macro_rules! avx2_entry {
    ($(#[$m:meta])* $name:ident($($arg:ident: $ty:ty),*) $(-> $ret:ty)? => $body:ident) => {
        $(#[$m])*
        pub(crate) fn $name($($arg: $ty),*) $(-> $ret)? {
            // SAFETY: only reachable through the AVX2 table, which `dispatch` hands out after
            // `is_x86_feature_detected!` confirmed avx2, fma and f16c. Lengths are checked in
            // the body before any access.
            unsafe { $body($($arg),*) }
        }
    };
}

mod attention;
mod dot;
mod kpacked;
mod kquant;
mod matmul;
mod ops;
mod packed;
mod quant;
mod simd;
#[cfg(test)]
mod tests;

use crate::dispatch::{Kernels, MoreFormats, Path};

/// The AVX2 table. Every kernel has a fast version.
pub(crate) const AVX2: Kernels = Kernels {
    path: Path::Avx2,
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
    packed_k: Some(kpacked::PACKED_K),
    more: MoreFormats {
        quantize_row_q8_k: quant::quantize_row_q8_k,
        vec_dot_q4_k_q8_k: kquant::vec_dot_q4_k_q8_k,
        vec_dot_q5_k_q8_k: kquant::vec_dot_q5_k_q8_k,
        vec_dot_q6_k_q8_k: kquant::vec_dot_q6_k_q8_k,
        matvec_q4_k_q8_k: kquant::matvec_q4_k_q8_k,
        matvec_q5_k_q8_k: kquant::matvec_q5_k_q8_k,
        matvec_q6_k_q8_k: kquant::matvec_q6_k_q8_k,
        matmul_q4_k_q8_k: kquant::matmul_q4_k_q8_k,
        matmul_q5_k_q8_k: kquant::matmul_q5_k_q8_k,
        matmul_q6_k_q8_k: kquant::matmul_q6_k_q8_k,
        vec_dot_q5_0_q8_0: matmul::vec_dot_q5_0_q8_0,
        vec_dot_q5_1_q8_1: matmul::vec_dot_q5_1_q8_1,
        matvec_q5_0_q8_0: matmul::matvec_q5_0_q8_0,
        matvec_q5_1_q8_1: matmul::matvec_q5_1_q8_1,
        matmul_q5_0_q8_0: matmul::matmul_q5_0_q8_0,
        matmul_q5_1_q8_1: matmul::matmul_q5_1_q8_1,
    },
    rms_norm: ops::rms_norm,
    softmax: ops::softmax,
    silu_mul: ops::silu_mul,
    gelu_mul: ops::gelu_mul,
    rope_norm: ops::rope_norm,
    rope_neox: ops::rope_neox,
    add: ops::add,
    scale: ops::scale,
    dot_f32: ops::dot_f32,
    axpy_f32: ops::axpy_f32,
    dot_f16: ops::dot_f16,
    axpy_f16: ops::axpy_f16,
    scores_f16: attention::scores_f16,
    mix_f16: attention::mix_f16,
    f16_to_f32_row: ops::f16_to_f32_row,
    f32_to_f16_row: ops::f32_to_f16_row,
};

/// The AVX2 table with the quantized matrix-matrix products' integer sums through AVX512-VNNI
/// `vpdpbusd` (256-bit, `asm!`), Q4_0, Q5_0 and Q8_0 on weights repacked per 8-row group:
/// bit-identical results, fewer instructions per block (prompt processing), and products over
/// weights packed at load (`packed.rs`), which the engine uses for decoding. `vec_dot` and
/// `matvec` over the file's layout are AVX2's. Handed out only
/// after `is_x86_feature_detected!` confirmed avx512vnni and avx512vl besides the AVX2 set.
pub(crate) const AVX512VNNI: Kernels = Kernels {
    path: Path::Avx512Vnni,
    matmul_q4_0_q8_0: matmul::vnni::matmul_q4_0_q8_0,
    matmul_q4_1_q8_1: matmul::vnni::matmul_q4_1_q8_1,
    matmul_q8_0_q8_0: matmul::vnni::matmul_q8_0_q8_0,
    packed: Some(packed::PACKED),
    packed_k: Some(kpacked::vnni::PACKED_K),
    more: MoreFormats {
        matmul_q5_0_q8_0: matmul::vnni::matmul_q5_0_q8_0,
        matmul_q5_1_q8_1: matmul::vnni::matmul_q5_1_q8_1,
        vec_dot_q4_k_q8_k: kquant::vnni::vec_dot_q4_k_q8_k,
        vec_dot_q5_k_q8_k: kquant::vnni::vec_dot_q5_k_q8_k,
        vec_dot_q6_k_q8_k: kquant::vnni::vec_dot_q6_k_q8_k,
        matvec_q4_k_q8_k: kquant::vnni::matvec_q4_k_q8_k,
        matvec_q5_k_q8_k: kquant::vnni::matvec_q5_k_q8_k,
        matvec_q6_k_q8_k: kquant::vnni::matvec_q6_k_q8_k,
        matmul_q4_k_q8_k: kquant::vnni::matmul_q4_k_q8_k,
        matmul_q5_k_q8_k: kquant::vnni::matmul_q5_k_q8_k,
        matmul_q6_k_q8_k: kquant::vnni::matmul_q6_k_q8_k,
        ..AVX2.more
    },
    ..AVX2
};
