//! Block access, the integer block dot products of the base-NEON and dotprod paths, and the
//! "vector form" used by `vec_dot` and `matvec`.
//!
//! The vector form of one row: per block, the exact integer products land in 4 i32 lanes
//! (`idot`), are converted to f32 and fused-multiply-added with `d_w * d_a` into one of two
//! f32x4 accumulators (even and odd blocks); the row's value is the horizontal sum of the two
//! accumulators' sum, plus (Q4_1) the sequential fused sum of `m_w * s_a`. [`rows_vec`]
//! applies exactly that sequence to each of its `R` rows, so a row's bits do not depend on
//! how many rows are computed together.

use super::fp16::h2f;
use crate::block::{BlockQ4_0, BlockQ4_1, BlockQ8_0, BlockQ8_1};
use core::arch::aarch64::*;
use core::arch::asm;

/// Loads 32 signed bytes as two vectors.
#[inline(always)]
fn load_s8x32(q: &[i8; 32]) -> [int8x16_t; 2] {
    // SAFETY: `q` is valid for 32 readable bytes; `ld1` has no alignment requirement.
    unsafe { [vld1q_s8(q.as_ptr()), vld1q_s8(q.as_ptr().add(16))] }
}

/// Unpacks 16 bytes of nibbles into the block's values 0..16 (low) and 16..32 (high), 0..15.
#[inline(always)]
fn unpack_nibbles(qs: &[u8; 16]) -> [uint8x16_t; 2] {
    // SAFETY: `qs` is valid for 16 readable bytes and `ld1` has no alignment requirement; the
    // rest are NEON register intrinsics (NEON is part of the aarch64 baseline).
    unsafe {
        let v = vld1q_u8(qs.as_ptr());
        [vandq_u8(v, vdupq_n_u8(0x0f)), vshrq_n_u8::<4>(v)]
    }
}

/// An activation block (Q8_0 or Q8_1).
pub(super) trait ActBlock: Copy + 'static {
    /// The 32 quantized values.
    fn qs(&self) -> [int8x16_t; 2];
    /// The scale `d`.
    fn d(&self) -> f32;
    /// `s = d * sum(q)` (Q8_1 only; 0 otherwise).
    fn s(&self) -> f32;
}

/// A weight block and the activation block its dot product pairs with.
pub(super) trait WeightBlock: Copy + 'static {
    type Act: ActBlock;
    /// Values fit in 4 bits (signed or not): four products of them with i8 fit in an i16.
    const NIBBLES: bool;
    /// Has an offset `m` (Q4_1): the dot product adds `m_w * s_a` per block.
    const HAS_MIN: bool;
    /// The 32 values as signed bytes (Q4_0: `q - 8`; Q4_1: `q`; Q8_0: `q`).
    fn qs(&self) -> [int8x16_t; 2];
    /// The scale `d`.
    fn d(&self) -> f32;
    /// The offset `m` (Q4_1 only; 0 otherwise).
    fn m(&self) -> f32;
}

impl ActBlock for BlockQ8_0 {
    #[inline(always)]
    fn qs(&self) -> [int8x16_t; 2] {
        load_s8x32(&self.qs)
    }
    #[inline(always)]
    fn d(&self) -> f32 {
        h2f(self.d)
    }
    #[inline(always)]
    fn s(&self) -> f32 {
        0.0
    }
}

impl ActBlock for BlockQ8_1 {
    #[inline(always)]
    fn qs(&self) -> [int8x16_t; 2] {
        load_s8x32(&self.qs)
    }
    #[inline(always)]
    fn d(&self) -> f32 {
        h2f(self.d)
    }
    #[inline(always)]
    fn s(&self) -> f32 {
        h2f(self.s)
    }
}

impl WeightBlock for BlockQ4_0 {
    type Act = BlockQ8_0;
    const NIBBLES: bool = true;
    const HAS_MIN: bool = false;
    #[inline(always)]
    fn qs(&self) -> [int8x16_t; 2] {
        // SAFETY: NEON register intrinsics only; NEON is part of the aarch64 baseline.
        unpack_nibbles(&self.qs).map(|v| unsafe { vsubq_s8(vreinterpretq_s8_u8(v), vdupq_n_s8(8)) })
    }
    #[inline(always)]
    fn d(&self) -> f32 {
        h2f(self.d)
    }
    #[inline(always)]
    fn m(&self) -> f32 {
        0.0
    }
}

impl WeightBlock for BlockQ4_1 {
    type Act = BlockQ8_1;
    const NIBBLES: bool = true;
    const HAS_MIN: bool = true;
    #[inline(always)]
    fn qs(&self) -> [int8x16_t; 2] {
        // SAFETY: NEON register intrinsics only; NEON is part of the aarch64 baseline.
        unpack_nibbles(&self.qs).map(|v| unsafe { vreinterpretq_s8_u8(v) })
    }
    #[inline(always)]
    fn d(&self) -> f32 {
        h2f(self.d)
    }
    #[inline(always)]
    fn m(&self) -> f32 {
        h2f(self.m)
    }
}

impl WeightBlock for BlockQ8_0 {
    type Act = BlockQ8_0;
    const NIBBLES: bool = false;
    const HAS_MIN: bool = false;
    #[inline(always)]
    fn qs(&self) -> [int8x16_t; 2] {
        load_s8x32(&self.qs)
    }
    #[inline(always)]
    fn d(&self) -> f32 {
        h2f(self.d)
    }
    #[inline(always)]
    fn m(&self) -> f32 {
        0.0
    }
}

/// An instruction set for the exact integer dot product of a block.
pub(super) trait IDot {
    /// Four i32 lanes whose sum is the exact dot product of `x` and `y` (32 values each). The
    /// split into lanes is fixed per instruction set and weight format.
    ///
    /// # Safety
    /// The CPU must support the instructions of `Self` (nothing beyond NEON for [`Neon`],
    /// dotprod for [`Dotprod`]).
    unsafe fn idot<W: WeightBlock>(x: [int8x16_t; 2], y: [int8x16_t; 2]) -> int32x4_t;
}

/// Base NEON (ARMv8.0): widening multiplies and pairwise adds.
pub(super) struct Neon;

/// ARMv8.2 dotprod: `sdot`.
pub(super) struct Dotprod;

impl IDot for Neon {
    #[inline(always)]
    unsafe fn idot<W: WeightBlock>(x: [int8x16_t; 2], y: [int8x16_t; 2]) -> int32x4_t {
        idot_neon::<W>(x, y)
    }
}

/// [`Neon::idot`], safe: it needs nothing beyond the aarch64 baseline.
#[inline(always)]
fn idot_neon<W: WeightBlock>(x: [int8x16_t; 2], y: [int8x16_t; 2]) -> int32x4_t {
    // SAFETY: NEON register intrinsics only; NEON is part of the aarch64 baseline.
    unsafe {
        if W::NIBBLES {
            // |4-bit × i8| <= 15 * 128: four of them fit in an i16 lane.
            let p = vmull_s8(vget_low_s8(x[0]), vget_low_s8(y[0]));
            let p = vmlal_high_s8(p, x[0], y[0]);
            let p = vmlal_s8(p, vget_low_s8(x[1]), vget_low_s8(y[1]));
            let p = vmlal_high_s8(p, x[1], y[1]);
            vpaddlq_s16(p)
        } else {
            // i8 × i8 reaches 16384: widen every product pair to i32.
            let s = vpaddlq_s16(vmull_s8(vget_low_s8(x[0]), vget_low_s8(y[0])));
            let s = vpadalq_s16(s, vmull_high_s8(x[0], y[0]));
            let s = vpadalq_s16(s, vmull_s8(vget_low_s8(x[1]), vget_low_s8(y[1])));
            vpadalq_s16(s, vmull_high_s8(x[1], y[1]))
        }
    }
}

/// `acc += sdot(a, b)` (four i32 lanes, each the sum of four byte products).
#[target_feature(enable = "dotprod")]
#[inline]
pub(super) fn sdot(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    let mut acc = acc;
    // SAFETY: registers only; this function is compiled for dotprod, and calling it requires
    // the caller to vouch for the CPU feature (it is a `#[target_feature]` function).
    unsafe {
        asm!("sdot {acc:v}.4s, {a:v}.16b, {b:v}.16b", acc = inout(vreg) acc, a = in(vreg) a,
             b = in(vreg) b, options(pure, nomem, nostack, preserves_flags));
    }
    acc
}

impl IDot for Dotprod {
    #[inline(always)]
    unsafe fn idot<W: WeightBlock>(x: [int8x16_t; 2], y: [int8x16_t; 2]) -> int32x4_t {
        // SAFETY: the caller guarantees dotprod (this trait method's contract); `vdupq_n_s32`
        // is a baseline NEON intrinsic.
        unsafe { sdot(sdot(vdupq_n_s32(0), x[0], y[0]), x[1], y[1]) }
    }
}

/// One block of `R` rows in the vector form: `acc[r] += cvt(idot) * (d_w d_a)`,
/// `msum[r] += m_w s_a`.
///
/// # Safety
/// `w` points to `R` rows of `nb` blocks, `b < nb`; the CPU supports `I`.
#[inline(always)]
unsafe fn block_vec<W: WeightBlock, I: IDot, const R: usize>(
    w: *const W,
    nb: usize,
    b: usize,
    a: &W::Act,
    acc: &mut [float32x4_t; R],
    msum: &mut [f32; R],
) {
    let y = a.qs();
    let da = a.d();
    let sa = if W::HAS_MIN { a.s() } else { 0.0 };
    for r in 0..R {
        // SAFETY: `r * nb + b < R * nb`, inside the rows (this function's contract).
        let wb = unsafe { &*w.add(r * nb + b) };
        // SAFETY: the CPU supports `I` (this function's contract); the rest are baseline NEON
        // register intrinsics.
        acc[r] =
            unsafe { vfmaq_n_f32(acc[r], vcvtq_f32_s32(I::idot::<W>(wb.qs(), y)), wb.d() * da) };
        if W::HAS_MIN {
            msum[r] = wb.m().mul_add(sa, msum[r]);
        }
    }
}

/// `out[r] = dot(w[r], a)` for `R` rows of `a.len()` blocks, in the vector form.
///
/// # Safety
/// The CPU supports `I`.
#[inline(always)]
pub(super) unsafe fn rows_vec<W: WeightBlock, I: IDot, const R: usize>(
    w: &[W],
    a: &[W::Act],
    out: &mut [f32],
) {
    let nb = a.len();
    assert!(w.len() == R * nb && out.len() == R, "rows_vec: shape");
    let wp = w.as_ptr();
    // SAFETY: baseline NEON register intrinsic.
    let zero = unsafe { vdupq_n_f32(0.0) };
    let mut acc0 = [zero; R];
    let mut acc1 = [zero; R];
    let mut msum = [0.0f32; R];
    let (pairs, last) = a.as_chunks::<2>();
    for (i, ab) in pairs.iter().enumerate() {
        // SAFETY: `2 i + 1 < nb` and `w` holds `R` rows of `nb` blocks (asserted above); the
        // CPU supports `I` (this function's contract).
        unsafe {
            block_vec::<W, I, R>(wp, nb, 2 * i, &ab[0], &mut acc0, &mut msum);
            block_vec::<W, I, R>(wp, nb, 2 * i + 1, &ab[1], &mut acc1, &mut msum);
        }
    }
    if let [ab] = last {
        // SAFETY: as above, for the last block `nb - 1`.
        unsafe { block_vec::<W, I, R>(wp, nb, nb - 1, ab, &mut acc0, &mut msum) };
    }
    for r in 0..R {
        // SAFETY: baseline NEON register intrinsics.
        let v = unsafe { vaddvq_f32(vaddq_f32(acc0[r], acc1[r])) };
        out[r] = if W::HAS_MIN { v + msum[r] } else { v };
    }
}

/// `vec_dot` on base NEON.
pub(crate) fn vec_dot_neon<W: WeightBlock>(x: &[W], y: &[W::Act]) -> f32 {
    assert_eq!(x.len(), y.len(), "vec_dot: length mismatch");
    let mut out = [0.0f32];
    // SAFETY: `Neon` needs nothing beyond the aarch64 baseline.
    unsafe { rows_vec::<W, Neon, 1>(x, y, &mut out) };
    out[0]
}

/// The body of [`vec_dot_dotprod`], compiled for dotprod.
#[target_feature(enable = "dotprod")]
fn vec_dot_dotprod_body<W: WeightBlock>(x: &[W], y: &[W::Act]) -> f32 {
    let mut out = [0.0f32];
    // SAFETY: this function is only entered on a CPU with dotprod (its `target_feature`).
    unsafe { rows_vec::<W, Dotprod, 1>(x, y, &mut out) };
    out[0]
}

/// `vec_dot` with `sdot`. Only reachable through the DOTPROD/I8MM tables.
pub(crate) fn vec_dot_dotprod<W: WeightBlock>(x: &[W], y: &[W::Act]) -> f32 {
    assert_eq!(x.len(), y.len(), "vec_dot: length mismatch");
    // SAFETY: this function is only referenced by the DOTPROD and I8MM tables, which
    // `Kernels::for_path` hands out only after runtime detection of dotprod.
    unsafe { vec_dot_dotprod_body(x, y) }
}
