//! K-quant products (Q4_K, Q5_K, Q6_K against Q8_K activations) on base NEON and dotprod.
//!
//! As on x86 (`x86/kquant.rs`, which documents the sequence): a super-block is unpacked once
//! into sixteen vectors of levels (0..16, 0..32 or 0..64) with a scale per 16 values, and
//! shared by up to four tokens; each 16 values' exact integer dot product (`smull`/`smlal`
//! and a pairwise add, or `sdot`) is multiplied by its scale into i32 lanes and reduced to one
//! i32 per block; mins and Q6_K's -32 offset go through the activations' `bsums`. The f32 work
//! is the x86 path's, operation for operation (`acc = fma(d_w · d_a, f32(sumi), acc)`, mins
//! apart), so a row's result has the same bits on both architectures and through `vec_dot`,
//! `matvec` and `matmul`.
//!
//! No level times activation pair overflows an i16 lane: 2 · 63 · 127 < 2^15.

use super::dot::sdot;
use super::fp16::h2f;
use crate::block::{BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K, QK_K, f16};
use crate::kseq::{finish_block, scales_mins};
use crate::reference::{check_matmul, check_matvec};
use core::arch::aarch64::*;

/// Tokens of a matrix-matrix product that share one unpacking of a super-block.
const MM_TOKS: usize = 4;

/// A super-block unpacked: the levels of values `16i..16i + 16` in `q[i]` with their scale
/// `scale[i]`, and the multipliers of the activations' 16-value sums (`bsum_mul`): the mins
/// with `dmin` (Q4_K, Q5_K), or Q6_K's offset (`dmin = None`: taken from the integer sum).
struct Unpacked {
    q: [int8x16_t; 16],
    scale: [i32; 16],
    d: f32,
    bsum_mul: [i32; 16],
    dmin: Option<f32>,
}

trait KFormat {
    type W;
    fn unpack(w: &Self::W) -> Unpacked;
}

/// The exact dot product of 16 levels and 16 activations, in four i32 lanes.
trait Dot16 {
    /// # Safety
    /// The CPU supports the instructions of `Self` (dotprod for [`Dotprod`]).
    unsafe fn dot16(q: int8x16_t, y: int8x16_t) -> int32x4_t;
}

struct Neon;
struct Dotprod;

impl Dot16 for Neon {
    #[inline(always)]
    unsafe fn dot16(q: int8x16_t, y: int8x16_t) -> int32x4_t {
        // SAFETY: NEON register intrinsics only; NEON is part of the aarch64 baseline.
        unsafe {
            let p = vmull_s8(vget_low_s8(q), vget_low_s8(y));
            vpaddlq_s16(vmlal_high_s8(p, q, y))
        }
    }
}

impl Dot16 for Dotprod {
    #[inline(always)]
    unsafe fn dot16(q: int8x16_t, y: int8x16_t) -> int32x4_t {
        // SAFETY: the caller guarantees dotprod (this trait method's contract).
        unsafe { sdot(vdupq_n_s32(0), q, y) }
    }
}

#[inline(always)]
fn load_u8x16(x: &[u8]) -> uint8x16_t {
    let x: &[u8; 16] = x[..16].try_into().expect("16 bytes");
    // SAFETY: the reference covers 16 readable bytes; `ld1` has no alignment requirement.
    unsafe { vld1q_u8(x.as_ptr()) }
}

#[inline(always)]
fn s8(v: uint8x16_t) -> int8x16_t {
    // SAFETY: a register reinterpretation (levels < 64 are the same as i8).
    unsafe { vreinterpretq_s8_u8(v) }
}

/// The levels of sub-blocks `2p` (low nibbles) and `2p + 1` (high) of a Q4_K/Q5_K block, with
/// the fifth bits `(bit 2p, bit 2p + 1)` of `qh` when there is one.
#[inline(always)]
fn nibble_pairs(qs: &[u8; 128], qh: Option<&[u8; 32]>) -> [int8x16_t; 16] {
    // SAFETY: NEON register intrinsics only; NEON is part of the aarch64 baseline.
    unsafe {
        let m4 = vdupq_n_u8(0x0f);
        let sixteen = vdupq_n_u8(16);
        let mut q = [vdupq_n_s8(0); 16];
        for p in 0..4 {
            for h in 0..2 {
                let b = load_u8x16(&qs[32 * p + 16 * h..]);
                let (mut lo, mut hi) = (vandq_u8(b, m4), vshrq_n_u8::<4>(b));
                if let Some(qh) = qh {
                    let bits = load_u8x16(&qh[16 * h..]);
                    let b1 = vdupq_n_u8(1 << (2 * p));
                    let b2 = vdupq_n_u8(2 << (2 * p));
                    lo = vorrq_u8(lo, vandq_u8(vtstq_u8(bits, b1), sixteen));
                    hi = vorrq_u8(hi, vandq_u8(vtstq_u8(bits, b2), sixteen));
                }
                q[4 * p + h] = s8(lo);
                q[4 * p + 2 + h] = s8(hi);
            }
        }
        q
    }
}

/// A Q4_K (`qh = None`) or Q5_K block unpacked.
#[inline(always)]
fn q4_q5(qs: &[u8; 128], qh: Option<&[u8; 32]>, scales: &[u8; 12], d: f16, dmin: f16) -> Unpacked {
    let (scale, bsum_mul) = scales_mins(scales);
    Unpacked {
        q: nibble_pairs(qs, qh),
        scale,
        d: h2f(d),
        bsum_mul,
        dmin: Some(h2f(dmin)),
    }
}

struct Q4K;
impl KFormat for Q4K {
    type W = BlockQ4K;
    #[inline(always)]
    fn unpack(w: &BlockQ4K) -> Unpacked {
        q4_q5(&w.qs, None, &w.scales, w.d, w.dmin)
    }
}

struct Q5K;
impl KFormat for Q5K {
    type W = BlockQ5K;
    #[inline(always)]
    fn unpack(w: &BlockQ5K) -> Unpacked {
        q4_q5(&w.qs, Some(&w.qh), &w.scales, w.d, w.dmin)
    }
}

struct Q6K;
impl KFormat for Q6K {
    type W = BlockQ6K;
    #[inline(always)]
    fn unpack(w: &BlockQ6K) -> Unpacked {
        let mut q = [zero_s8(); 16];
        let mut scale = [0i32; 16];
        let mut bsum_mul = [0i32; 16];
        // SAFETY: NEON register intrinsics only; NEON is part of the aarch64 baseline.
        unsafe {
            let (m4, m2) = (vdupq_n_u8(0x0f), vdupq_n_u8(0x03));
            for n in 0..2 {
                for h in 0..2 {
                    // Values l = 16h..16h + 16 of the four 32-value runs of this half.
                    let ql0 = load_u8x16(&w.ql[64 * n + 16 * h..]);
                    let ql1 = load_u8x16(&w.ql[64 * n + 32 + 16 * h..]);
                    let qh = load_u8x16(&w.qh[32 * n + 16 * h..]);
                    let hi = |bits: uint8x16_t| vshlq_n_u8::<4>(vandq_u8(bits, m2));
                    let v = [
                        vorrq_u8(vandq_u8(ql0, m4), hi(qh)),
                        vorrq_u8(vandq_u8(ql1, m4), hi(vshrq_n_u8::<2>(qh))),
                        vorrq_u8(vshrq_n_u8::<4>(ql0), hi(vshrq_n_u8::<4>(qh))),
                        vorrq_u8(vshrq_n_u8::<4>(ql1), hi(vshrq_n_u8::<6>(qh))),
                    ];
                    for (k, vk) in v.into_iter().enumerate() {
                        // Run k of half n is values 128n + 32k..; its 16-value halves have
                        // scales 8n + 2k and 8n + 2k + 1.
                        let i = 8 * n + 2 * k + h;
                        q[i] = s8(vk);
                        scale[i] = w.scales[i] as i32;
                        bsum_mul[i] = 32 * w.scales[i] as i32;
                    }
                }
            }
        }
        Unpacked {
            q,
            scale,
            d: h2f(w.d),
            bsum_mul,
            dmin: None,
        }
    }
}

#[inline(always)]
fn zero_s8() -> int8x16_t {
    // SAFETY: a baseline NEON intrinsic.
    unsafe { vdupq_n_s8(0) }
}

/// One block for one token, the x86 path's sequence: `acc = fma(d · d_a, f32(sumi), acc)` and
/// `mins = fma(dmin · d_a, f32(Σ bsum_mul · bsums), mins)` (or that sum taken from `sumi`).
///
/// # Safety
/// The CPU supports `I`.
#[inline(always)]
unsafe fn block<I: Dot16>(u: &Unpacked, a: &BlockQ8K, acc: &mut f32, mins: &mut f32) {
    // SAFETY: NEON register intrinsics and `I::dot16`, which the caller vouches for; the
    // activations are 256 readable bytes, loaded 16 at a time.
    let sumi = unsafe {
        let mut v = vdupq_n_s32(0);
        for i in 0..16 {
            let y = vld1q_s8(a.qs[16 * i..16 * i + 16].as_ptr());
            v = vmlaq_n_s32(v, I::dot16(u.q[i], y), u.scale[i]);
        }
        vaddvq_s32(v)
    };
    finish_block(sumi, u.d, u.dmin, &u.bsum_mul, a, acc, mins);
}

/// `out[t] = dot(row, a[t])` for `T` tokens of `nb` blocks each.
///
/// # Safety
/// The CPU supports `I`.
#[inline(always)]
unsafe fn row_tokens<F: KFormat, I: Dot16, const T: usize>(
    row: &[F::W],
    a: &[BlockQ8K],
    out: &mut [f32],
) {
    let nb = row.len();
    let (mut acc, mut mins) = ([0.0f32; T], [0.0f32; T]);
    for (b, w) in row.iter().enumerate() {
        let u = F::unpack(w);
        for t in 0..T {
            // SAFETY: the caller vouches for `I`.
            unsafe { block::<I>(&u, &a[t * nb + b], &mut acc[t], &mut mins[t]) };
        }
    }
    for t in 0..T {
        out[t] = acc[t] - mins[t];
    }
}

/// `out[r · n_tok + t] = dot(w[r], a[t])`.
///
/// # Safety
/// The CPU supports `I`; `w` is whole rows of `nb` blocks, `a` `n_tok` tokens of `nb` blocks,
/// `out` a result per pair.
#[inline(always)]
unsafe fn product<F: KFormat, I: Dot16>(
    w: &[F::W],
    a: &[BlockQ8K],
    nb: usize,
    n_tok: usize,
    out: &mut [f32],
) {
    for (row, o) in w.chunks_exact(nb).zip(out.chunks_exact_mut(n_tok)) {
        let mut t = 0;
        // SAFETY (both calls): the caller vouches for `I`.
        while t + MM_TOKS <= n_tok {
            unsafe {
                row_tokens::<F, I, MM_TOKS>(row, &a[t * nb..(t + MM_TOKS) * nb], &mut o[t..])
            };
            t += MM_TOKS;
        }
        while t < n_tok {
            unsafe { row_tokens::<F, I, 1>(row, &a[t * nb..(t + 1) * nb], &mut o[t..]) };
            t += 1;
        }
    }
}

/// [`product`] compiled for dotprod.
#[target_feature(enable = "dotprod")]
fn product_dotprod<F: KFormat>(
    w: &[F::W],
    a: &[BlockQ8K],
    nb: usize,
    n_tok: usize,
    out: &mut [f32],
) {
    // SAFETY: this function is only entered on a CPU with dotprod (its `target_feature`); the
    // shapes are the entry points' to check.
    unsafe { product::<F, Dotprod>(w, a, nb, n_tok, out) }
}

/// Runs a product on base NEON, or with `sdot` when `dotprod` (the DOTPROD/I8MM tables only,
/// which `Kernels::for_path` hands out after detecting dotprod).
#[inline(always)]
fn run<F: KFormat>(
    dotprod: bool,
    w: &[F::W],
    a: &[BlockQ8K],
    nb: usize,
    n_tok: usize,
    out: &mut [f32],
) {
    if dotprod {
        // SAFETY: `dotprod` is true only in the entries of the DOTPROD and I8MM tables.
        unsafe { product_dotprod::<F>(w, a, nb, n_tok, out) }
    } else {
        // SAFETY: `Neon` needs nothing beyond the aarch64 baseline.
        unsafe { product::<F, Neon>(w, a, nb, n_tok, out) }
    }
}

macro_rules! k_kernels {
    ($fmt:ty, $w:ty, $dotprod:literal, $dot:ident, $mv:ident, $mm:ident) => {
        #[doc = concat!("`vec_dot` of ", stringify!($w), " × Q8_K.")]
        pub(crate) fn $dot(x: &[$w], y: &[BlockQ8K]) -> f32 {
            assert_eq!(
                x.len(),
                y.len(),
                concat!(stringify!($dot), ": length mismatch")
            );
            if x.is_empty() {
                return 0.0;
            }
            let mut out = [0.0f32];
            run::<$fmt>($dotprod, x, y, x.len(), 1, &mut out);
            out[0]
        }

        #[doc = concat!("Matrix-vector product of ", stringify!($w), " × Q8_K.")]
        pub(crate) fn $mv(w: &[$w], a: &[BlockQ8K], out: &mut [f32]) {
            let nb = check_matvec(w, a, out);
            if nb == 0 || out.is_empty() {
                out.fill(0.0);
                return;
            }
            run::<$fmt>($dotprod, w, a, nb, 1, out);
        }

        #[doc = concat!("Matrix-matrix product of ", stringify!($w), " × Q8_K.")]
        pub(crate) fn $mm(w: &[$w], a: &[BlockQ8K], n_tok: usize, out: &mut [f32]) {
            let (nb, rows) = check_matmul(w, a, n_tok, out);
            if nb == 0 || rows == 0 {
                out.fill(0.0);
                return;
            }
            run::<$fmt>($dotprod, w, a, nb, n_tok, out);
        }
    };
}

/// Base NEON.
pub(crate) mod neon {
    use super::*;
    k_kernels!(
        Q4K,
        BlockQ4K,
        false,
        vec_dot_q4_k_q8_k,
        matvec_q4_k_q8_k,
        matmul_q4_k_q8_k
    );
    k_kernels!(
        Q5K,
        BlockQ5K,
        false,
        vec_dot_q5_k_q8_k,
        matvec_q5_k_q8_k,
        matmul_q5_k_q8_k
    );
    k_kernels!(
        Q6K,
        BlockQ6K,
        false,
        vec_dot_q6_k_q8_k,
        matvec_q6_k_q8_k,
        matmul_q6_k_q8_k
    );
}

/// With `sdot`: only in the DOTPROD and I8MM tables.
pub(crate) mod dotprod {
    use super::*;
    k_kernels!(
        Q4K,
        BlockQ4K,
        true,
        vec_dot_q4_k_q8_k,
        matvec_q4_k_q8_k,
        matmul_q4_k_q8_k
    );
    k_kernels!(
        Q5K,
        BlockQ5K,
        true,
        vec_dot_q5_k_q8_k,
        matvec_q5_k_q8_k,
        matmul_q5_k_q8_k
    );
    k_kernels!(
        Q6K,
        BlockQ6K,
        true,
        vec_dot_q6_k_q8_k,
        matvec_q6_k_q8_k,
        matmul_q6_k_q8_k
    );
}

const _: () = assert!(QK_K == 256);
