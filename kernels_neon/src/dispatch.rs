//! The dispatch table: one set of function pointers per code path, chosen once at start-up
//! from runtime CPU-feature detection (never from the build host: a Yocto image is built on
//! an x86 server for a Cortex-A53 it has never seen).
//!
//! `EDGELLM_KERNELS=reference|portable|neon|dotprod|i8mm|avx2|avx512vnni` forces a path for A/B runs on a
//! device; asking for one this CPU cannot run is an error, not a silent fallback.

use crate::block::{
    BlockFormat, BlockQ4_0, BlockQ4_0x8, BlockQ4_1, BlockQ4_1x8, BlockQ4K, BlockQ4Kx8, BlockQ5_0,
    BlockQ5_0x8, BlockQ5_1, BlockQ5K, BlockQ5Kx8, BlockQ6K, BlockQ6Kx8, BlockQ8_0, BlockQ8_0x8,
    BlockQ8_1, BlockQ8K, PackedFormat, f16,
};
use crate::reference as r;
use std::fmt;

/// `quantize_row_*`: `x.len() == y.len() * B::BLOCK_LEN` (32, or 256 for Q8_K).
pub type QuantizeFn<B> = fn(&[f32], &mut [B]);
/// `vec_dot_*`: `x.len() == y.len()` blocks.
pub type VecDotFn<W, A> = fn(&[W], &[A]) -> f32;
/// Matrix-vector product: `out[r] = dot(w[r], a)`; `w` is `out.len()` rows of `a.len()` blocks.
pub type MatVecFn<W, A> = fn(&[W], &[A], &mut [f32]);
/// Matrix-matrix product over a batch of `n_tok` tokens: `a` is token-major
/// (`n_tok` rows of activation blocks), `out[r * n_tok + t] = dot(w[r], a[t])`, i.e. `[row][tok]`,
/// so that a thread given a range of rows writes one contiguous piece of `out`.
pub type MatMulFn<W, A> = fn(&[W], &[A], usize, &mut [f32]);

/// A code path: a set of kernels that needs certain CPU features.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Path {
    /// The scalar references (slow; the truth for tests).
    Reference,
    /// Portable SIMD through the `wide` crate: any target.
    Portable,
    /// aarch64 base NEON (ARMv8.0: Cortex-A53/A72, Raspberry Pi 3/4).
    Neon,
    /// aarch64 NEON + `sdot` (ARMv8.2 dotprod: Cortex-A55/A76, RK3588, Pi 5).
    Dotprod,
    /// aarch64 NEON + `sdot` + `smmla` (ARMv8.6 i8mm).
    I8mm,
    /// x86_64 AVX2 + FMA + F16C.
    Avx2,
    /// x86_64 AVX2 + FMA + F16C, with the quantized matrix-matrix products' integer sums
    /// through AVX512-VNNI `vpdpbusd` on 256-bit registers (AVX512VL): Zen 4, Ice Lake and
    /// later.
    Avx512Vnni,
}

impl Path {
    /// Every path, slowest first.
    pub const ALL: [Path; 7] = [
        Path::Reference,
        Path::Portable,
        Path::Neon,
        Path::Dotprod,
        Path::I8mm,
        Path::Avx2,
        Path::Avx512Vnni,
    ];

    /// The name used by `EDGELLM_KERNELS` and in logs.
    pub fn name(self) -> &'static str {
        match self {
            Path::Reference => "reference",
            Path::Portable => "portable",
            Path::Neon => "neon",
            Path::Dotprod => "dotprod",
            Path::I8mm => "i8mm",
            Path::Avx2 => "avx2",
            Path::Avx512Vnni => "avx512vnni",
        }
    }

    /// Parses a path name (case-insensitive).
    pub fn parse(s: &str) -> Result<Path, KernelError> {
        let s = s.trim();
        Path::ALL
            .into_iter()
            .find(|p| p.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| KernelError::UnknownPath(s.to_string()))
    }

    /// Whether this CPU can run the path (runtime detection).
    pub fn is_available(self) -> bool {
        self.missing_feature().is_none()
    }

    /// The first CPU feature (or architecture) the path needs that this machine lacks.
    pub fn missing_feature(self) -> Option<&'static str> {
        match self {
            Path::Reference | Path::Portable => None,
            Path::Neon => arm_missing(&[]),
            Path::Dotprod => arm_missing(&["dotprod"]),
            Path::I8mm => arm_missing(&["dotprod", "i8mm"]),
            Path::Avx2 => x86_missing(&[]),
            Path::Avx512Vnni => x86_missing(&["avx512vnni", "avx512vl"]),
        }
    }

    /// Whether a CPU that runs this path runs `other` too: `other` is the reference or the
    /// portable path (they run anywhere), or of the same family (aarch64's paths build on one
    /// another, as x86's do) and no faster.
    pub fn includes(self, other: Path) -> bool {
        let family = |p: Path| match p {
            Path::Reference | Path::Portable => 0,
            Path::Neon | Path::Dotprod | Path::I8mm => 1,
            Path::Avx2 | Path::Avx512Vnni => 2,
        };
        let rank = |p: Path| Path::ALL.iter().position(|&q| q == p);
        family(other) == 0 || (family(self) == family(other) && rank(other) <= rank(self))
    }

    /// The paths this CPU can run, slowest first.
    pub fn available() -> Vec<Path> {
        Path::ALL.into_iter().filter(|p| p.is_available()).collect()
    }

    /// The fastest path this CPU can run.
    pub fn best() -> Path {
        *Path::available().last().unwrap_or(&Path::Reference)
    }
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(target_arch = "aarch64")]
fn arm_missing(features: &[&'static str]) -> Option<&'static str> {
    for &f in features {
        let ok = match f {
            "dotprod" => std::arch::is_aarch64_feature_detected!("dotprod"),
            "i8mm" => std::arch::is_aarch64_feature_detected!("i8mm"),
            _ => false,
        };
        if !ok {
            return Some(f);
        }
    }
    None
}

#[cfg(not(target_arch = "aarch64"))]
fn arm_missing(_features: &[&'static str]) -> Option<&'static str> {
    Some("aarch64")
}

/// The first of avx2, fma, f16c and then `extra` this CPU lacks.
#[cfg(target_arch = "x86_64")]
fn x86_missing(extra: &[&'static str]) -> Option<&'static str> {
    for &f in ["avx2", "fma", "f16c"].iter().chain(extra) {
        let ok = match f {
            "avx2" => std::arch::is_x86_feature_detected!("avx2"),
            "fma" => std::arch::is_x86_feature_detected!("fma"),
            "f16c" => std::arch::is_x86_feature_detected!("f16c"),
            "avx512vnni" => std::arch::is_x86_feature_detected!("avx512vnni"),
            "avx512vl" => std::arch::is_x86_feature_detected!("avx512vl"),
            _ => false,
        };
        if !ok {
            return Some(f);
        }
    }
    None
}

#[cfg(not(target_arch = "x86_64"))]
fn x86_missing(_extra: &[&'static str]) -> Option<&'static str> {
    Some("x86_64")
}

/// CPU features relevant to the kernels, as detected at runtime (for logs and test output).
pub fn cpu_features() -> Vec<&'static str> {
    #[allow(unused_mut)]
    let mut v = Vec::new();
    #[cfg(target_arch = "aarch64")]
    {
        v.push("neon");
        if std::arch::is_aarch64_feature_detected!("dotprod") {
            v.push("dotprod");
        }
        if std::arch::is_aarch64_feature_detected!("i8mm") {
            v.push("i8mm");
        }
        if std::arch::is_aarch64_feature_detected!("fp16") {
            v.push("fp16");
        }
    }
    #[cfg(target_arch = "x86_64")]
    {
        for (name, on) in [
            ("sse4.1", std::arch::is_x86_feature_detected!("sse4.1")),
            ("avx", std::arch::is_x86_feature_detected!("avx")),
            ("avx2", std::arch::is_x86_feature_detected!("avx2")),
            ("fma", std::arch::is_x86_feature_detected!("fma")),
            ("f16c", std::arch::is_x86_feature_detected!("f16c")),
            ("avx512f", std::arch::is_x86_feature_detected!("avx512f")),
            ("avx512vl", std::arch::is_x86_feature_detected!("avx512vl")),
            (
                "avx512vnni",
                std::arch::is_x86_feature_detected!("avx512vnni"),
            ),
        ] {
            if on {
                v.push(name);
            }
        }
    }
    v
}

/// Errors of kernel selection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KernelError {
    /// `EDGELLM_KERNELS` (or a flag) named no known path.
    UnknownPath(String),
    /// The path exists but this CPU lacks a feature it needs.
    Unavailable { path: Path, missing: &'static str },
}

impl fmt::Display for KernelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KernelError::UnknownPath(s) => write!(
                f,
                "unknown kernel path '{s}' (expected one of: {})",
                Path::ALL.map(|p| p.name()).join(", ")
            ),
            KernelError::Unavailable { path, missing } => write!(
                f,
                "kernel path '{path}' needs CPU feature '{missing}', which this CPU lacks (available: {})",
                Path::available()
                    .iter()
                    .map(|p| p.name())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }
}

impl std::error::Error for KernelError {}

/// `(k, stride, q, heads, scale, out)`: see [`Kernels::scores_f16`].
pub type ScoresFn = fn(&[f16], usize, &[f32], usize, f32, &mut [f32]);
/// `(v, stride, p, heads, out)`: see [`Kernels::mix_f16`].
pub type MixFn = fn(&[f16], usize, &[f32], usize, &mut [f32]);

/// The environment variable that forces a path.
pub const KERNELS_ENV: &str = "EDGELLM_KERNELS";

/// One code path's kernels. Every field has a scalar reference in [`crate::reference`] and is
/// checked against it by the test that walks this table (`tests/dispatch_walk.rs`), which
/// destructures the struct without `..`, so a field added here cannot go untested.
#[derive(Clone, Copy)]
pub struct Kernels {
    pub path: Path,

    pub quantize_row_q8_0: QuantizeFn<BlockQ8_0>,
    pub quantize_row_q8_1: QuantizeFn<BlockQ8_1>,

    pub vec_dot_q4_0_q8_0: VecDotFn<BlockQ4_0, BlockQ8_0>,
    pub vec_dot_q4_1_q8_1: VecDotFn<BlockQ4_1, BlockQ8_1>,
    pub vec_dot_q8_0_q8_0: VecDotFn<BlockQ8_0, BlockQ8_0>,

    pub matvec_q4_0_q8_0: MatVecFn<BlockQ4_0, BlockQ8_0>,
    pub matvec_q4_1_q8_1: MatVecFn<BlockQ4_1, BlockQ8_1>,
    pub matvec_q8_0_q8_0: MatVecFn<BlockQ8_0, BlockQ8_0>,

    pub matmul_q4_0_q8_0: MatMulFn<BlockQ4_0, BlockQ8_0>,
    pub matmul_q4_1_q8_1: MatMulFn<BlockQ4_1, BlockQ8_1>,
    pub matmul_q8_0_q8_0: MatMulFn<BlockQ8_0, BlockQ8_0>,

    /// Products over weights interleaved 8 rows at a time, when this path has them: the
    /// engine then packs its weight matrices at load (see [`PackedKernels`]).
    pub packed: Option<PackedKernels>,
    /// Products over K-quant weights interleaved 8 rows at a time ([`PackedKQuants`]), when
    /// this path has them: the engine then packs its K-quant matrices at load.
    pub packed_k: Option<PackedKQuants>,

    /// The formats of the files people download (Q4_K_M, Q5_K_M: Gemma 3's mixes Q5_0, Q4_K,
    /// Q6_K and Q8_0), in [`MoreFormats`].
    pub more: MoreFormats,

    /// `(x, w, eps, out)`: RMSNorm times the norm weight.
    pub rms_norm: fn(&[f32], &[f32], f32, &mut [f32]),
    pub softmax: fn(&mut [f32]),
    /// `(gate, up, out)`: SwiGLU.
    pub silu_mul: fn(&[f32], &[f32], &mut [f32]),
    /// `(gate, up, out)`: GeGLU, GELU's tanh approximation (Gemma).
    pub gelu_mul: fn(&[f32], &[f32], &mut [f32]),
    /// `(x, head_dim, cos_sin)`.
    pub rope_norm: fn(&mut [f32], usize, &[f32]),
    pub rope_neox: fn(&mut [f32], usize, &[f32]),
    pub add: fn(&mut [f32], &[f32]),
    pub scale: fn(&mut [f32], f32),
    pub dot_f32: fn(&[f32], &[f32]) -> f32,
    pub axpy_f32: fn(&mut [f32], f32, &[f32]),
    pub dot_f16: fn(&[f16], &[f32]) -> f32,
    pub axpy_f16: fn(&mut [f32], f32, &[f16]),
    /// `(k, stride, q, heads, scale, out)`: the attention scores of `heads` query heads that
    /// share one KV head, `out[h·n + j] = (k[j·stride..][..hd] · q[h·hd..][..hd]) · scale`
    /// (`hd = q.len() / heads`, `n = out.len() / heads`): one call per group. The same bits
    /// for a head and row however many heads and rows the call has; the x86 and ARM paths
    /// share one order (eight lanes of FMA chains, summed `((0+4)+(1+5))+((2+6)+(3+7))`, the
    /// tail fused, then the scale), so the scores agree across architectures.
    pub scores_f16: ScoresFn,
    /// `(v, stride, p, heads, out)`: `out[h·hd..][..hd] += p[h·n + j] · v[j·stride..][..hd]`
    /// for `j` in order, each step rounded as the path's `axpy_f16` (fused on x86 and ARM), so
    /// each head's bits equal one `axpy_f16` per row.
    pub mix_f16: MixFn,
    pub f16_to_f32_row: fn(&[f16], &mut [f32]),
    pub f32_to_f16_row: fn(&[f32], &mut [f16]),
}

/// The products of Q5_0, Q5_1 and the K-quants (Q4_K, Q5_K, Q6_K against Q8_K activations,
/// 256 values a block), and the Q8_K activation quantizer. A table of its own, so that a path
/// that has no fast version of them yet says so in one line ([`MORE_REFERENCE`]).
#[derive(Clone, Copy)]
pub struct MoreFormats {
    pub quantize_row_q8_k: QuantizeFn<BlockQ8K>,

    pub vec_dot_q5_0_q8_0: VecDotFn<BlockQ5_0, BlockQ8_0>,
    pub vec_dot_q5_1_q8_1: VecDotFn<BlockQ5_1, BlockQ8_1>,
    pub vec_dot_q4_k_q8_k: VecDotFn<BlockQ4K, BlockQ8K>,
    pub vec_dot_q5_k_q8_k: VecDotFn<BlockQ5K, BlockQ8K>,
    pub vec_dot_q6_k_q8_k: VecDotFn<BlockQ6K, BlockQ8K>,

    pub matvec_q5_0_q8_0: MatVecFn<BlockQ5_0, BlockQ8_0>,
    pub matvec_q5_1_q8_1: MatVecFn<BlockQ5_1, BlockQ8_1>,
    pub matvec_q4_k_q8_k: MatVecFn<BlockQ4K, BlockQ8K>,
    pub matvec_q5_k_q8_k: MatVecFn<BlockQ5K, BlockQ8K>,
    pub matvec_q6_k_q8_k: MatVecFn<BlockQ6K, BlockQ8K>,

    pub matmul_q5_0_q8_0: MatMulFn<BlockQ5_0, BlockQ8_0>,
    pub matmul_q5_1_q8_1: MatMulFn<BlockQ5_1, BlockQ8_1>,
    pub matmul_q4_k_q8_k: MatMulFn<BlockQ4K, BlockQ8K>,
    pub matmul_q5_k_q8_k: MatMulFn<BlockQ5K, BlockQ8K>,
    pub matmul_q6_k_q8_k: MatMulFn<BlockQ6K, BlockQ8K>,
}

/// The scalar references of [`MoreFormats`], and the entries of each path that has no fast
/// version of them yet (the Q8_K quantizer on every path).
pub const MORE_REFERENCE: MoreFormats = MoreFormats {
    quantize_row_q8_k: r::quantize_row_q8_k_ref,
    vec_dot_q5_0_q8_0: r::vec_dot_q5_0_q8_0_ref,
    vec_dot_q5_1_q8_1: r::vec_dot_q5_1_q8_1_ref,
    vec_dot_q4_k_q8_k: r::vec_dot_q4_k_q8_k_ref,
    vec_dot_q5_k_q8_k: r::vec_dot_q5_k_q8_k_ref,
    vec_dot_q6_k_q8_k: r::vec_dot_q6_k_q8_k_ref,
    matvec_q5_0_q8_0: r::matvec_ref::<BlockQ5_0>,
    matvec_q5_1_q8_1: r::matvec_ref::<BlockQ5_1>,
    matvec_q4_k_q8_k: r::matvec_ref::<BlockQ4K>,
    matvec_q5_k_q8_k: r::matvec_ref::<BlockQ5K>,
    matvec_q6_k_q8_k: r::matvec_ref::<BlockQ6K>,
    matmul_q5_0_q8_0: r::matmul_ref::<BlockQ5_0>,
    matmul_q5_1_q8_1: r::matmul_ref::<BlockQ5_1>,
    matmul_q4_k_q8_k: r::matmul_ref::<BlockQ4K>,
    matmul_q5_k_q8_k: r::matmul_ref::<BlockQ5K>,
    matmul_q6_k_q8_k: r::matmul_ref::<BlockQ6K>,
};

/// Products over packed weights ([`PackedFormat`]): `w` holds `out.len() / n_tok / 8` groups
/// of `nb` blocks, `out` is `[row][tok]` as for the unpacked products, and every result is the
/// same path's unpacked product's, bit for bit (so packing changes no answer).
#[derive(Clone, Copy)]
pub struct PackedKernels {
    pub matvec_q4_0x8_q8_0: MatVecFn<BlockQ4_0x8, BlockQ8_0>,
    pub matvec_q4_1x8_q8_1: MatVecFn<BlockQ4_1x8, BlockQ8_1>,
    pub matvec_q8_0x8_q8_0: MatVecFn<BlockQ8_0x8, BlockQ8_0>,
    pub matvec_q5_0x8_q8_0: MatVecFn<BlockQ5_0x8, BlockQ8_0>,
    pub matmul_q4_0x8_q8_0: MatMulFn<BlockQ4_0x8, BlockQ8_0>,
    pub matmul_q4_1x8_q8_1: MatMulFn<BlockQ4_1x8, BlockQ8_1>,
    pub matmul_q8_0x8_q8_0: MatMulFn<BlockQ8_0x8, BlockQ8_0>,
    pub matmul_q5_0x8_q8_0: MatMulFn<BlockQ5_0x8, BlockQ8_0>,
}

/// The scalar references of the packed products (for tests; no path runs them for speed).
pub const PACKED_REFERENCE: PackedKernels = PackedKernels {
    matvec_q4_0x8_q8_0: r::matvec_packed_ref::<BlockQ4_0x8>,
    matvec_q4_1x8_q8_1: r::matvec_packed_ref::<BlockQ4_1x8>,
    matvec_q8_0x8_q8_0: r::matvec_packed_ref::<BlockQ8_0x8>,
    matvec_q5_0x8_q8_0: r::matvec_packed_ref::<BlockQ5_0x8>,
    matmul_q4_0x8_q8_0: r::matmul_packed_ref::<BlockQ4_0x8>,
    matmul_q4_1x8_q8_1: r::matmul_packed_ref::<BlockQ4_1x8>,
    matmul_q8_0x8_q8_0: r::matmul_packed_ref::<BlockQ8_0x8>,
    matmul_q5_0x8_q8_0: r::matmul_packed_ref::<BlockQ5_0x8>,
};

/// Products over packed K-quant weights ([`BlockQ4Kx8`], …) against Q8_K activations, shaped
/// as [`PackedKernels`]': every result is the same path's unpacked K-quant product's, bit for
/// bit, which is the one `kseq` sequence on every fast path.
#[derive(Clone, Copy)]
pub struct PackedKQuants {
    pub matvec_q4_kx8_q8_k: MatVecFn<BlockQ4Kx8, BlockQ8K>,
    pub matvec_q5_kx8_q8_k: MatVecFn<BlockQ5Kx8, BlockQ8K>,
    pub matvec_q6_kx8_q8_k: MatVecFn<BlockQ6Kx8, BlockQ8K>,
    pub matmul_q4_kx8_q8_k: MatMulFn<BlockQ4Kx8, BlockQ8K>,
    pub matmul_q5_kx8_q8_k: MatMulFn<BlockQ5Kx8, BlockQ8K>,
    pub matmul_q6_kx8_q8_k: MatMulFn<BlockQ6Kx8, BlockQ8K>,
}

/// The scalar references of the packed K-quant products (for tests).
pub const PACKED_K_REFERENCE: PackedKQuants = PackedKQuants {
    matvec_q4_kx8_q8_k: r::matvec_packed_ref::<BlockQ4Kx8>,
    matvec_q5_kx8_q8_k: r::matvec_packed_ref::<BlockQ5Kx8>,
    matvec_q6_kx8_q8_k: r::matvec_packed_ref::<BlockQ6Kx8>,
    matmul_q4_kx8_q8_k: r::matmul_packed_ref::<BlockQ4Kx8>,
    matmul_q5_kx8_q8_k: r::matmul_packed_ref::<BlockQ5Kx8>,
    matmul_q6_kx8_q8_k: r::matmul_packed_ref::<BlockQ6Kx8>,
};

/// A weight format with a packed layout: its products in a table of packed products
/// ([`PackedKernels`] or [`PackedKQuants`]).
pub trait PackedWeightFormat: PackedFormat
where
    Self::Row: BlockFormat,
{
    /// The table its products are in.
    type Table: 'static;
    /// That table's scalar references.
    const REFERENCE: &'static Self::Table;
    /// `k`'s table of them, if the path has one.
    fn table(k: &Kernels) -> Option<&Self::Table>;
    fn matvec(k: &Self::Table) -> MatVecFn<Self, <Self::Row as BlockFormat>::Activation>;
    fn matmul(k: &Self::Table) -> MatMulFn<Self, <Self::Row as BlockFormat>::Activation>;
}

macro_rules! packed_weight_format {
    ($p:ty, $table:ty, $field:ident, $reference:ident, $mv:ident, $mm:ident) => {
        impl PackedWeightFormat for $p {
            type Table = $table;
            const REFERENCE: &'static $table = &$reference;
            fn table(k: &Kernels) -> Option<&$table> {
                k.$field.as_ref()
            }
            fn matvec(k: &$table) -> MatVecFn<Self, <Self::Row as BlockFormat>::Activation> {
                k.$mv
            }
            fn matmul(k: &$table) -> MatMulFn<Self, <Self::Row as BlockFormat>::Activation> {
                k.$mm
            }
        }
    };
}
packed_weight_format!(
    BlockQ4_0x8,
    PackedKernels,
    packed,
    PACKED_REFERENCE,
    matvec_q4_0x8_q8_0,
    matmul_q4_0x8_q8_0
);
packed_weight_format!(
    BlockQ4_1x8,
    PackedKernels,
    packed,
    PACKED_REFERENCE,
    matvec_q4_1x8_q8_1,
    matmul_q4_1x8_q8_1
);
packed_weight_format!(
    BlockQ8_0x8,
    PackedKernels,
    packed,
    PACKED_REFERENCE,
    matvec_q8_0x8_q8_0,
    matmul_q8_0x8_q8_0
);
packed_weight_format!(
    BlockQ5_0x8,
    PackedKernels,
    packed,
    PACKED_REFERENCE,
    matvec_q5_0x8_q8_0,
    matmul_q5_0x8_q8_0
);
packed_weight_format!(
    BlockQ4Kx8,
    PackedKQuants,
    packed_k,
    PACKED_K_REFERENCE,
    matvec_q4_kx8_q8_k,
    matmul_q4_kx8_q8_k
);
packed_weight_format!(
    BlockQ5Kx8,
    PackedKQuants,
    packed_k,
    PACKED_K_REFERENCE,
    matvec_q5_kx8_q8_k,
    matmul_q5_kx8_q8_k
);
packed_weight_format!(
    BlockQ6Kx8,
    PackedKQuants,
    packed_k,
    PACKED_K_REFERENCE,
    matvec_q6_kx8_q8_k,
    matmul_q6_kx8_q8_k
);

impl fmt::Debug for Kernels {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Kernels")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

/// The scalar references as a table.
pub const REFERENCE: Kernels = Kernels {
    path: Path::Reference,
    quantize_row_q8_0: r::quantize_row_q8_0_ref,
    quantize_row_q8_1: r::quantize_row_q8_1_ref,
    vec_dot_q4_0_q8_0: r::vec_dot_q4_0_q8_0_ref,
    vec_dot_q4_1_q8_1: r::vec_dot_q4_1_q8_1_ref,
    vec_dot_q8_0_q8_0: r::vec_dot_q8_0_q8_0_ref,
    matvec_q4_0_q8_0: r::matvec_ref::<BlockQ4_0>,
    matvec_q4_1_q8_1: r::matvec_ref::<BlockQ4_1>,
    matvec_q8_0_q8_0: r::matvec_ref::<BlockQ8_0>,
    matmul_q4_0_q8_0: r::matmul_ref::<BlockQ4_0>,
    matmul_q4_1_q8_1: r::matmul_ref::<BlockQ4_1>,
    matmul_q8_0_q8_0: r::matmul_ref::<BlockQ8_0>,
    packed: None,
    packed_k: None,
    more: MORE_REFERENCE,
    rms_norm: r::rms_norm_ref,
    softmax: r::softmax_ref,
    silu_mul: r::silu_mul_ref,
    gelu_mul: r::gelu_mul_ref,
    rope_norm: r::rope_norm_ref,
    rope_neox: r::rope_neox_ref,
    add: r::add_ref,
    scale: r::scale_ref,
    dot_f32: r::dot_f32_ref,
    axpy_f32: r::axpy_f32_ref,
    dot_f16: r::dot_f16_ref,
    axpy_f16: r::axpy_f16_ref,
    scores_f16: r::scores_f16_ref,
    mix_f16: r::mix_f16_ref,
    f16_to_f32_row: crate::block::f16_to_f32_row,
    f32_to_f16_row: crate::block::f32_to_f16_row,
};

impl Kernels {
    /// The table of `path`, or why this CPU cannot run it.
    pub fn for_path(path: Path) -> Result<&'static Kernels, KernelError> {
        if let Some(missing) = path.missing_feature() {
            return Err(KernelError::Unavailable { path, missing });
        }
        Ok(match path {
            Path::Reference => &REFERENCE,
            Path::Portable => &crate::portable::TABLE,
            #[cfg(target_arch = "aarch64")]
            Path::Neon => &crate::neon::NEON,
            #[cfg(target_arch = "aarch64")]
            Path::Dotprod => &crate::neon::DOTPROD,
            #[cfg(target_arch = "aarch64")]
            Path::I8mm => &crate::neon::I8MM,
            #[cfg(target_arch = "x86_64")]
            Path::Avx2 => &crate::x86::AVX2,
            #[cfg(target_arch = "x86_64")]
            Path::Avx512Vnni => &crate::x86::AVX512VNNI,
            #[allow(unreachable_patterns)]
            _ => unreachable!("missing_feature() rejects paths of other architectures"),
        })
    }

    /// The table to use: `EDGELLM_KERNELS` if set (an error if unknown or unavailable),
    /// else the best path this CPU runs.
    pub fn detect() -> Result<&'static Kernels, KernelError> {
        match std::env::var(KERNELS_ENV) {
            Ok(v) if !v.trim().is_empty() => Kernels::for_path(Path::parse(&v)?),
            _ => Kernels::for_path(Path::best()),
        }
    }

    /// The path's name, for logs and status.
    pub fn name(&self) -> &'static str {
        self.path.name()
    }
}

/// A weight format the engine can multiply by: picks its kernels out of a table.
pub trait WeightFormat: BlockFormat {
    fn quantize_activation(k: &Kernels) -> QuantizeFn<Self::Activation>;
    fn vec_dot(k: &Kernels) -> VecDotFn<Self, Self::Activation>;
    fn matvec(k: &Kernels) -> MatVecFn<Self, Self::Activation>;
    fn matmul(k: &Kernels) -> MatMulFn<Self, Self::Activation>;
}

/// The fields are paths into [`Kernels`] (`more.vec_dot_q5_0_q8_0` for [`MoreFormats`]).
macro_rules! weight_format {
    ($w:ty, $($q:ident).+, $($dot:ident).+, $($mv:ident).+, $($mm:ident).+) => {
        impl WeightFormat for $w {
            fn quantize_activation(k: &Kernels) -> QuantizeFn<Self::Activation> {
                k.$($q).+
            }
            fn vec_dot(k: &Kernels) -> VecDotFn<Self, Self::Activation> {
                k.$($dot).+
            }
            fn matvec(k: &Kernels) -> MatVecFn<Self, Self::Activation> {
                k.$($mv).+
            }
            fn matmul(k: &Kernels) -> MatMulFn<Self, Self::Activation> {
                k.$($mm).+
            }
        }
    };
}
weight_format!(
    BlockQ4_0,
    quantize_row_q8_0,
    vec_dot_q4_0_q8_0,
    matvec_q4_0_q8_0,
    matmul_q4_0_q8_0
);
weight_format!(
    BlockQ4_1,
    quantize_row_q8_1,
    vec_dot_q4_1_q8_1,
    matvec_q4_1_q8_1,
    matmul_q4_1_q8_1
);
weight_format!(
    BlockQ8_0,
    quantize_row_q8_0,
    vec_dot_q8_0_q8_0,
    matvec_q8_0_q8_0,
    matmul_q8_0_q8_0
);

weight_format!(
    BlockQ5_0,
    quantize_row_q8_0,
    more.vec_dot_q5_0_q8_0,
    more.matvec_q5_0_q8_0,
    more.matmul_q5_0_q8_0
);
weight_format!(
    BlockQ5_1,
    quantize_row_q8_1,
    more.vec_dot_q5_1_q8_1,
    more.matvec_q5_1_q8_1,
    more.matmul_q5_1_q8_1
);
weight_format!(
    BlockQ4K,
    more.quantize_row_q8_k,
    more.vec_dot_q4_k_q8_k,
    more.matvec_q4_k_q8_k,
    more.matmul_q4_k_q8_k
);
weight_format!(
    BlockQ5K,
    more.quantize_row_q8_k,
    more.vec_dot_q5_k_q8_k,
    more.matvec_q5_k_q8_k,
    more.matmul_q5_k_q8_k
);
weight_format!(
    BlockQ6K,
    more.quantize_row_q8_k,
    more.vec_dot_q6_k_q8_k,
    more.matvec_q6_k_q8_k,
    more.matmul_q6_k_q8_k
);
