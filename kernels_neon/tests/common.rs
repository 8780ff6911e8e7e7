//! Test data: deterministic, with the awkward cases ggml's tests do not have.
#![allow(dead_code)]

use kernels_neon::{BlockFormat, f16};

/// xorshift64*: deterministic and dependency-free.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in [-1, 1).
    pub fn uniform(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    /// Roughly normal (sum of 4 uniforms), scaled.
    pub fn normal(&mut self, sigma: f32) -> f32 {
        (self.uniform() + self.uniform() + self.uniform() + self.uniform()) * 0.866 * sigma
    }
}

/// ggml's `test-quantize-fns` signal: `0.1 + 2 cos(i + offset)`.
pub fn ggml_signal(n: usize, offset: f32) -> Vec<f32> {
    (0..n)
        .map(|i| 0.1 + 2.0 * (i as f32 + offset).cos())
        .collect()
}

/// Weight-like data with awkward blocks mixed in: all zeros, one outlier, a negative extreme,
/// constants, tiny values (subnormal f16 scales) and ties at the rounding boundaries.
pub fn awkward(n: usize, seed: u64) -> Vec<f32> {
    let mut r = Rng::new(seed);
    let mut v: Vec<f32> = (0..n).map(|_| r.normal(0.05)).collect();
    for (b, chunk) in v.chunks_mut(32).enumerate() {
        match b % 11 {
            1 => chunk.fill(0.0),
            3 => chunk[(b * 7) % chunk.len()] = 3.5,
            5 => chunk[(b * 5) % chunk.len()] = -4.25,
            7 => chunk.fill(0.125),
            8 => chunk.iter_mut().for_each(|x| *x *= 1e-6),
            9 => chunk
                .iter_mut()
                .enumerate()
                .for_each(|(i, x)| *x = (i as f32 - 16.0) * 0.5),
            _ => {}
        }
    }
    v
}

pub fn f16_vec(n: usize, seed: u64) -> Vec<f16> {
    let mut r = Rng::new(seed);
    (0..n).map(|_| f16::from_f32(r.normal(1.0))).collect()
}

pub fn f32_vec(n: usize, seed: u64, sigma: f32) -> Vec<f32> {
    let mut r = Rng::new(seed);
    (0..n).map(|_| r.normal(sigma)).collect()
}

/// ggml's RMSE as used by its tests: `sqrt(sum (a-b)²) / n`.
pub fn ggml_rmse(a: &[f32], b: &[f32]) -> f32 {
    let s: f64 = a
        .iter()
        .zip(b)
        .map(|(&x, &y)| ((x - y) as f64).powi(2))
        .sum();
    (s.sqrt() / a.len() as f64) as f32
}

/// Asserts `|got - want| <= tol`, naming the kernel and case.
#[track_caller]
pub fn assert_close(what: &str, got: f32, want: f32, tol: f32) {
    assert!(
        (got - want).abs() <= tol || (got.is_nan() && want.is_nan()),
        "{what}: got {got}, want {want} (|diff| {} > tol {tol})",
        (got - want).abs()
    );
}

/// Elementwise: `|got - want| <= rel * max(1, |want|)`.
#[track_caller]
pub fn assert_all_close(what: &str, got: &[f32], want: &[f32], rel: f32) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert_close(&format!("{what}[{i}]"), g, w, rel * w.abs().max(1.0));
    }
}

/// Blocks of `x`, quantized with the reference quantizer.
pub fn quant<B: BlockFormat>(x: &[f32]) -> Vec<B> {
    let mut y = vec![B::default(); x.len() / B::BLOCK_LEN];
    B::quantize_row_ref(x, &mut y);
    y
}

/// The walks' tolerances (see `dispatch_walk.rs`): a few ulps per accumulated block for dot
/// and matrix products in another f32 order, and a relative bound for the f32 operations.
pub const DOT_REL: f32 = 4.0 * f32::EPSILON;
pub const OPS_REL: f32 = 2e-6;
/// Block counts of the product cases: one, a few, odd, past the kernels' tiles, and long.
pub const BLOCK_COUNTS: [usize; 8] = [1, 2, 3, 7, 18, 33, 48, 1536];
/// Lengths of the f32 operations' cases: around every SIMD width, and odd long ones.
pub const LENS: [usize; 12] = [1, 2, 3, 4, 7, 8, 15, 16, 17, 64, 576, 1539];

pub fn dequant<B: BlockFormat>(x: &[B]) -> Vec<f32> {
    let mut y = vec![0.0; x.len() * B::BLOCK_LEN];
    B::dequantize_row(x, &mut y);
    y
}

/// Blocks of `W` for a case written in blocks of 32: as many values, rounded up, for the
/// superblocks of 256 (the K-quants' quantizers are slow enough to make the walk minutes).
pub fn blocks_of<W: BlockFormat>(nb32: usize) -> usize {
    (nb32 * 32).div_ceil(W::BLOCK_LEN)
}
