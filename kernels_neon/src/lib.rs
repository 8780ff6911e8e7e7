//! edgellm's compute kernels.
//!
//! Layers, bottom up:
//! - [`block`]: ggml's block formats (`BlockQ4_0`, …) with their exact byte layout.
//! - [`reference`]: scalar code, the definition of every kernel.
//! - `portable` (the `wide` crate, any target), `x86` (AVX2+FMA+F16C) and `neon`
//!   (aarch64: base, dotprod, i8mm): fast versions with the same names.
//! - `attn`: the loops the paths' attention kernels share around their own register tiles.
//! - [`dispatch`]: a table of function pointers per path, chosen at runtime.
//!
//! This crate depends on nothing else of edgellm's and does no I/O.

mod attn;
pub mod block;
pub mod dispatch;
pub mod hint;
#[cfg(any(target_arch = "aarch64", target_arch = "x86_64"))]
mod kseq;
pub mod reference;

#[macro_use]
mod packed_table;

#[cfg(target_arch = "aarch64")]
mod neon;
mod portable;
#[cfg(target_arch = "x86_64")]
mod x86;

pub use block::*;
pub use dispatch::{
    KernelError, Kernels, MoreFormats, PackedKQuants, PackedKernels, PackedWeightFormat, Path,
    WeightFormat, cpu_features,
};
