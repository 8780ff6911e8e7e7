//! aarch64 NEON: base (ARMv8.0), dotprod (`sdot`), i8mm (`smmla`).
//!
//! - [`NEON`] needs nothing beyond the aarch64 baseline (Cortex-A53): integer block products
//!   with `smull`/`smlal` and pairwise widening adds, f16 conversions with `fcvtl`/`fcvtn`.
//! - [`DOTPROD`] replaces the integer block products with `sdot` (vec_dot, matvec, matmul),
//!   and has products over weights packed 8 rows at a time (`packed.rs`, `sdot` by element),
//!   which the engine then uses.
//! - The K-quants (`kquant.rs`) on base NEON and with `sdot`, in the x86 path's sequence, and
//!   over K-quant weights packed 8 rows at a time (`kpacked.rs`), which every ARM path has.
//! - [`I8MM`] adds `smmla` for the prompt-batch products (matmul), 2 rows × 2 tokens per
//!   instruction; token generation (matvec) stays on `sdot`.
//!
//! No function here is compiled with build-time CPU flags: the dotprod and i8mm bodies are
//! `#[target_feature]` functions, reachable only through the DOTPROD/I8MM tables, which
//! [`Kernels::for_path`](crate::dispatch::Kernels::for_path) hands out only after runtime
//! detection. `sdot`/`smmla` and the f16 conversions are written with `asm!` because their
//! intrinsics (or types) are unstable on stable Rust.
//!
//! Determinism: the engine splits the rows of a product across threads and needs the same bits
//! whatever the split. Every row (matvec) or (row, token) pair (matmul) is computed by one
//! fixed sequence of operations, the same in multi-row tiles and in the tails, and the same on
//! the three paths (exact integer block sums, then fused multiply-adds in block order; see
//! `dot.rs`); `tests/row_split.rs` checks both.

mod dot;
mod fp16;
mod kpacked;
mod kquant;
mod matmul;
mod matvec;
mod ops;
mod packed;
mod quant;

use crate::block::{BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0};
use crate::dispatch::{Kernels, MORE_REFERENCE, MoreFormats, Path};

/// ARMv8.0 base NEON.
pub(crate) const NEON: Kernels = Kernels {
    path: Path::Neon,
    quantize_row_q8_0: quant::quantize_row_q8_0,
    quantize_row_q8_1: quant::quantize_row_q8_1,
    vec_dot_q4_0_q8_0: dot::vec_dot_neon::<BlockQ4_0>,
    vec_dot_q4_1_q8_1: dot::vec_dot_neon::<BlockQ4_1>,
    vec_dot_q8_0_q8_0: dot::vec_dot_neon::<BlockQ8_0>,
    matvec_q4_0_q8_0: matvec::matvec_neon::<BlockQ4_0>,
    matvec_q4_1_q8_1: matvec::matvec_neon::<BlockQ4_1>,
    matvec_q8_0_q8_0: matvec::matvec_neon::<BlockQ8_0>,
    matmul_q4_0_q8_0: matmul::matmul_neon::<BlockQ4_0>,
    matmul_q4_1_q8_1: matmul::matmul_neon::<BlockQ4_1>,
    matmul_q8_0_q8_0: matmul::matmul_neon::<BlockQ8_0>,
    packed: None,
    packed_k: Some(kpacked::PACKED_K),
    // Q5_0 and Q5_1 through the Q4 block products (their values unpacked with the fifth
    // bit); the K-quants in `kquant.rs`; the Q8_K quantizer in `quant.rs`.
    more: MoreFormats {
        quantize_row_q8_k: quant::quantize_row_q8_k,
        vec_dot_q4_k_q8_k: kquant::neon::vec_dot_q4_k_q8_k,
        vec_dot_q5_k_q8_k: kquant::neon::vec_dot_q5_k_q8_k,
        vec_dot_q6_k_q8_k: kquant::neon::vec_dot_q6_k_q8_k,
        matvec_q4_k_q8_k: kquant::neon::matvec_q4_k_q8_k,
        matvec_q5_k_q8_k: kquant::neon::matvec_q5_k_q8_k,
        matvec_q6_k_q8_k: kquant::neon::matvec_q6_k_q8_k,
        matmul_q4_k_q8_k: kquant::neon::matmul_q4_k_q8_k,
        matmul_q5_k_q8_k: kquant::neon::matmul_q5_k_q8_k,
        matmul_q6_k_q8_k: kquant::neon::matmul_q6_k_q8_k,
        vec_dot_q5_0_q8_0: dot::vec_dot_neon::<BlockQ5_0>,
        vec_dot_q5_1_q8_1: dot::vec_dot_neon::<BlockQ5_1>,
        matvec_q5_0_q8_0: matvec::matvec_neon::<BlockQ5_0>,
        matvec_q5_1_q8_1: matvec::matvec_neon::<BlockQ5_1>,
        matmul_q5_0_q8_0: matmul::matmul_neon::<BlockQ5_0>,
        matmul_q5_1_q8_1: matmul::matmul_neon::<BlockQ5_1>,
        ..MORE_REFERENCE
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
    scores_f16: ops::scores_f16,
    mix_f16: ops::mix_f16,
    f16_to_f32_row: ops::f16_to_f32_row,
    f32_to_f16_row: ops::f32_to_f16_row,
};

/// ARMv8.2 dotprod: the integer products with `sdot`; everything else as [`NEON`].
pub(crate) const DOTPROD: Kernels = Kernels {
    path: Path::Dotprod,
    vec_dot_q4_0_q8_0: dot::vec_dot_dotprod::<BlockQ4_0>,
    vec_dot_q4_1_q8_1: dot::vec_dot_dotprod::<BlockQ4_1>,
    vec_dot_q8_0_q8_0: dot::vec_dot_dotprod::<BlockQ8_0>,
    matvec_q4_0_q8_0: matvec::matvec_dotprod::<BlockQ4_0>,
    matvec_q4_1_q8_1: matvec::matvec_dotprod::<BlockQ4_1>,
    matvec_q8_0_q8_0: matvec::matvec_dotprod::<BlockQ8_0>,
    matmul_q4_0_q8_0: matmul::matmul_dotprod::<BlockQ4_0>,
    matmul_q4_1_q8_1: matmul::matmul_dotprod::<BlockQ4_1>,
    matmul_q8_0_q8_0: matmul::matmul_dotprod::<BlockQ8_0>,
    packed: Some(packed::PACKED),
    packed_k: Some(kpacked::dotprod::PACKED_K),
    more: MoreFormats {
        vec_dot_q4_k_q8_k: kquant::dotprod::vec_dot_q4_k_q8_k,
        vec_dot_q5_k_q8_k: kquant::dotprod::vec_dot_q5_k_q8_k,
        vec_dot_q6_k_q8_k: kquant::dotprod::vec_dot_q6_k_q8_k,
        matvec_q4_k_q8_k: kquant::dotprod::matvec_q4_k_q8_k,
        matvec_q5_k_q8_k: kquant::dotprod::matvec_q5_k_q8_k,
        matvec_q6_k_q8_k: kquant::dotprod::matvec_q6_k_q8_k,
        matmul_q4_k_q8_k: kquant::dotprod::matmul_q4_k_q8_k,
        matmul_q5_k_q8_k: kquant::dotprod::matmul_q5_k_q8_k,
        matmul_q6_k_q8_k: kquant::dotprod::matmul_q6_k_q8_k,
        vec_dot_q5_0_q8_0: dot::vec_dot_dotprod::<BlockQ5_0>,
        vec_dot_q5_1_q8_1: dot::vec_dot_dotprod::<BlockQ5_1>,
        matvec_q5_0_q8_0: matvec::matvec_dotprod::<BlockQ5_0>,
        matvec_q5_1_q8_1: matvec::matvec_dotprod::<BlockQ5_1>,
        matmul_q5_0_q8_0: matmul::matmul_dotprod::<BlockQ5_0>,
        matmul_q5_1_q8_1: matmul::matmul_dotprod::<BlockQ5_1>,
        ..NEON.more
    },
    ..NEON
};

/// ARMv8.6 i8mm: matmul with `smmla`; everything else as [`DOTPROD`].
pub(crate) const I8MM: Kernels = Kernels {
    path: Path::I8mm,
    matmul_q4_0_q8_0: matmul::matmul_i8mm::<BlockQ4_0>,
    matmul_q4_1_q8_1: matmul::matmul_i8mm::<BlockQ4_1>,
    matmul_q8_0_q8_0: matmul::matmul_i8mm::<BlockQ8_0>,
    more: MoreFormats {
        matmul_q5_0_q8_0: matmul::matmul_i8mm::<BlockQ5_0>,
        matmul_q5_1_q8_1: matmul::matmul_i8mm::<BlockQ5_1>,
        ..DOTPROD.more
    },
    ..DOTPROD
};
