//! ggml block formats, byte for byte (`ggml-common.h`), so that GGUF tensor data can be
//! viewed in place as `&[BlockQ4_0]` etc. and kernels can be held next to upstream.
//!
//! Every block is `#[repr(C)]`, contains only `u8`/`i8`/`f16` fields (alignment 2, no padding)
//! and is `bytemuck::Pod`, so a byte slice from an mmapped file can be cast without a copy once
//! its length and 2-byte alignment have been checked.

use bytemuck::{Pod, Zeroable};
pub use half::f16;
use std::mem::size_of;

/// Weights per Q4_0 block.
pub const QK4_0: usize = 32;
/// Weights per Q4_1 block.
pub const QK4_1: usize = 32;
/// Values per Q8_0 block.
pub const QK8_0: usize = 32;
/// Values per Q8_1 block.
pub const QK8_1: usize = 32;

/// 4-bit symmetric: `x = (q - 8) * d`, `q` in 0..16. Low nibbles hold values 0..16 of the
/// block, high nibbles values 16..32 (ggml's order, not interleaved).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Pod, Zeroable)]
pub struct BlockQ4_0 {
    pub d: f16,
    pub qs: [u8; QK4_0 / 2],
}

/// 4-bit asymmetric: `x = q * d + m`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Pod, Zeroable)]
pub struct BlockQ4_1 {
    pub d: f16,
    pub m: f16,
    pub qs: [u8; QK4_1 / 2],
}

/// 8-bit symmetric: `x = q * d`. Used for weights and for activations paired with Q4_0/Q8_0.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ8_0 {
    pub d: f16,
    pub qs: [i8; QK8_0],
}

/// 8-bit activations paired with Q4_1: `s = d * sum(qs)` carries the term that the weights'
/// offset `m` multiplies, so the dot product needs no second pass.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ8_1 {
    pub d: f16,
    pub s: f16,
    pub qs: [i8; QK8_1],
}

impl Default for BlockQ8_0 {
    fn default() -> Self {
        Self::zeroed()
    }
}

impl Default for BlockQ8_1 {
    fn default() -> Self {
        Self::zeroed()
    }
}

const _: () = assert!(size_of::<BlockQ4_0>() == 18);
const _: () = assert!(size_of::<BlockQ4_1>() == 20);
const _: () = assert!(size_of::<BlockQ8_0>() == 34);
const _: () = assert!(size_of::<BlockQ8_1>() == 36);
const _: () = assert!(std::mem::align_of::<BlockQ4_0>() == 2);
const _: () = assert!(std::mem::align_of::<BlockQ8_1>() == 2);

/// A ggml block format: its geometry and the scalar reference that defines it.
///
/// The reference functions are the truth that every SIMD path is tested against; they are
/// written for clarity, and [`crate::dispatch::Kernels`] holds the fast versions.
pub trait BlockFormat: Pod + Default + Send + Sync + 'static {
    /// ggml's name of the type (`"q4_0"`).
    const NAME: &'static str;
    /// Values per block.
    const BLOCK_LEN: usize;
    /// ggml's type id (`GGML_TYPE_*`), as stored in GGUF tensor infos.
    const GGML_TYPE: u32;
    /// The activation format whose blocks this format's dot product pairs with.
    type Activation: BlockFormat;
    /// `quantize_row_*_ref`: `x.len() == y.len() * BLOCK_LEN`.
    fn quantize_row_ref(x: &[f32], y: &mut [Self]);
    /// `dequantize_row_*`: `y.len() == x.len() * BLOCK_LEN`.
    fn dequantize_row(x: &[Self], y: &mut [f32]);
    /// `vec_dot_*_ref`: the scalar dot product against activations, `x.len() == y.len()`.
    fn vec_dot_ref(x: &[Self], y: &[Self::Activation]) -> f32;
}

/// Number of blocks for `n` values, or `None` when `n` is not a whole number of blocks.
pub fn blocks_for<B: BlockFormat>(n: usize) -> Option<usize> {
    (n % B::BLOCK_LEN == 0).then_some(n / B::BLOCK_LEN)
}

/// f16 → f32, exact.
#[inline]
pub fn f16_to_f32(h: f16) -> f32 {
    h.to_f32()
}

/// f32 → f16 with round-to-nearest-even, as ggml's `GGML_FP32_TO_FP16` (F16C / `fcvt`).
#[inline]
pub fn f32_to_f16(x: f32) -> f16 {
    f16::from_f32(x)
}

/// Converts a row of f16 to f32 (scalar; the dispatch table has the fast one).
pub fn f16_to_f32_row(x: &[f16], y: &mut [f32]) {
    assert_eq!(x.len(), y.len(), "f16_to_f32_row: length mismatch");
    for (o, i) in y.iter_mut().zip(x) {
        *o = i.to_f32();
    }
}

/// Converts a row of f32 to f16, round-to-nearest-even.
pub fn f32_to_f16_row(x: &[f32], y: &mut [f16]) {
    assert_eq!(x.len(), y.len(), "f32_to_f16_row: length mismatch");
    for (o, i) in y.iter_mut().zip(x) {
        *o = f16::from_f32(*i);
    }
}
