//! Block access, the integer block dot products of the base-NEON and dotprod paths, and the
//! register tiles that `vec_dot`, `matvec` and the NEON/dotprod `matmul` are made of.
//!
//! The pair form: the value of a (row `r`, token `t`) pair is, for the blocks `b` in order,
//! `acc = fma(isum_b, d_r d_t, acc)` from `acc = 0`, where `isum_b` is the block's exact integer
//! dot product (as f32, exact: |isum| <= 32 * 128 * 128 < 2^24), and for Q4_1 plus
//! `msum = fma(m_r, s_t, msum)` over the blocks, added at the end. That is the reference's
//! `sumf += sumi * (d_x d_y) (+ m_x s_y)` with fused multiply-adds. [`tile4`] computes it for 4
//! rows at once in the lanes of one vector (reducing each row's `idot` lanes with `addp`),
//! [`tile1`] for one row with scalars, and the i8mm tiles of `matmul.rs` the same from `smmla`
//! sums: IEEE operations are exact-rounded, so a pair's bits are the same in every tile and
//! tail, whatever range of rows a caller passes, and on every ARM path.

use super::fp16::h2f;
use crate::block::{BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0, BlockQ8_1};
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

/// The fifth bits of a Q5 block (`qh`: bit `j` for value `j`, little-endian) as bytes of 16
/// or 0, in the order of [`unpack_nibbles`].
#[inline(always)]
fn fifth_bits(qh: [u8; 4]) -> [uint8x16_t; 2] {
    const BIT: [u8; 16] = [1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128];
    // SAFETY: `BIT` is valid for 16 readable bytes; the rest are NEON register intrinsics
    // (NEON is part of the aarch64 baseline).
    unsafe {
        let bit = vld1q_u8(BIT.as_ptr());
        let sixteen = vdupq_n_u8(16);
        let lo = vcombine_u8(vdup_n_u8(qh[0]), vdup_n_u8(qh[1]));
        let hi = vcombine_u8(vdup_n_u8(qh[2]), vdup_n_u8(qh[3]));
        [
            vandq_u8(vtstq_u8(lo, bit), sixteen),
            vandq_u8(vtstq_u8(hi, bit), sixteen),
        ]
    }
}

/// The values of a Q5 block, 0..32: nibbles and fifth bits.
#[inline(always)]
fn unpack_q5(qs: &[u8; 16], qh: [u8; 4]) -> [uint8x16_t; 2] {
    let (n, h) = (unpack_nibbles(qs), fifth_bits(qh));
    // SAFETY: NEON register intrinsics only; NEON is part of the aarch64 baseline.
    unsafe { [vorrq_u8(n[0], h[0]), vorrq_u8(n[1], h[1])] }
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
    /// Values fit in 5 bits (signed or not, |q| <= 31): four products of them with i8 fit in
    /// an i16.
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

impl WeightBlock for BlockQ5_0 {
    type Act = BlockQ8_0;
    const NIBBLES: bool = true;
    const HAS_MIN: bool = false;
    #[inline(always)]
    fn qs(&self) -> [int8x16_t; 2] {
        // SAFETY: NEON register intrinsics only; NEON is part of the aarch64 baseline.
        unpack_q5(&self.qs, self.qh)
            .map(|v| unsafe { vsubq_s8(vreinterpretq_s8_u8(v), vdupq_n_s8(16)) })
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

impl WeightBlock for BlockQ5_1 {
    type Act = BlockQ8_1;
    const NIBBLES: bool = true;
    const HAS_MIN: bool = true;
    #[inline(always)]
    fn qs(&self) -> [int8x16_t; 2] {
        // SAFETY: NEON register intrinsics only; NEON is part of the aarch64 baseline.
        unpack_q5(&self.qs, self.qh).map(|v| unsafe { vreinterpretq_s8_u8(v) })
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
            // |5-bit × i8| <= 31 * 128: four of them fit in an i16 lane.
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

/// Four f32 lanes from four scalars.
#[inline(always)]
fn f32x4(v: [f32; 4]) -> float32x4_t {
    // SAFETY: `v` is valid for 4 readable f32.
    unsafe { vld1q_f32(v.as_ptr()) }
}

/// 4 rows × `T` tokens in the pair form: `w` holds the 4 rows of `nb` blocks, `a` the `T`
/// tokens of `nb` blocks; returns per token the 4 rows' values in the lanes of a vector.
///
/// # Safety
/// The CPU supports `I`.
#[inline(always)]
pub(super) unsafe fn tile4<W: WeightBlock, I: IDot, const T: usize>(
    w: &[W],
    a: &[W::Act],
    nb: usize,
) -> [float32x4_t; T] {
    assert!(w.len() == 4 * nb && a.len() == T * nb, "tile4: shape");
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    // SAFETY: the pointer reads stay inside `w` and `a` (`r * nb + b < 4 nb`,
    // `t * nb + b < T nb`, asserted above); `I` is supported (this function's contract); the
    // rest are baseline NEON register intrinsics.
    unsafe {
        let mut acc = [vdupq_n_f32(0.0); T];
        let mut msum = [vdupq_n_f32(0.0); T];
        for b in 0..nb {
            let wb: [&W; 4] = core::array::from_fn(|r| &*wp.add(r * nb + b));
            let x = wb.map(|w| w.qs());
            let dw = f32x4(wb.map(|w| w.d()));
            let mw = if W::HAS_MIN {
                f32x4(wb.map(|w| w.m()))
            } else {
                vdupq_n_f32(0.0)
            };
            for t in 0..T {
                let ab = &*ap.add(t * nb + b);
                let y = ab.qs();
                let s: [int32x4_t; 4] = core::array::from_fn(|r| I::idot::<W>(x[r], y));
                // Lane r: the exact integer dot product of row r.
                let isum = vpaddq_s32(vpaddq_s32(s[0], s[1]), vpaddq_s32(s[2], s[3]));
                acc[t] = vfmaq_f32(acc[t], vcvtq_f32_s32(isum), vmulq_n_f32(dw, ab.d()));
                if W::HAS_MIN {
                    msum[t] = vfmaq_n_f32(msum[t], mw, ab.s());
                }
            }
        }
        if W::HAS_MIN {
            core::array::from_fn(|t| vaddq_f32(acc[t], msum[t]))
        } else {
            acc
        }
    }
}

/// 1 row × `T` tokens in the pair form (scalar accumulation, same operations as a lane of
/// [`tile4`]): `w` holds the row's `nb` blocks, `a` the `T` tokens of `nb` blocks.
///
/// # Safety
/// The CPU supports `I`.
#[inline(always)]
pub(super) unsafe fn tile1<W: WeightBlock, I: IDot, const T: usize>(
    w: &[W],
    a: &[W::Act],
    nb: usize,
) -> [f32; T] {
    assert!(w.len() == nb && a.len() == T * nb, "tile1: shape");
    let ap = a.as_ptr();
    let mut acc = [0.0f32; T];
    let mut msum = [0.0f32; T];
    for (b, wb) in w.iter().enumerate() {
        let x = wb.qs();
        let dw = wb.d();
        let mw = if W::HAS_MIN { wb.m() } else { 0.0 };
        for t in 0..T {
            // SAFETY: `t * nb + b < T nb == a.len()` (asserted above).
            let ab = unsafe { &*ap.add(t * nb + b) };
            // SAFETY: `I` is supported (this function's contract); `vaddvq_s32` is a baseline
            // NEON register intrinsic.
            let isum = unsafe { vaddvq_s32(I::idot::<W>(x, ab.qs())) };
            acc[t] = (isum as f32).mul_add(dw * ab.d(), acc[t]);
            if W::HAS_MIN {
                msum[t] = mw.mul_add(ab.s(), msum[t]);
            }
        }
    }
    core::array::from_fn(|t| if W::HAS_MIN { acc[t] + msum[t] } else { acc[t] })
}

/// `vec_dot` on base NEON.
pub(crate) fn vec_dot_neon<W: WeightBlock>(x: &[W], y: &[W::Act]) -> f32 {
    assert_eq!(x.len(), y.len(), "vec_dot: length mismatch");
    // SAFETY: `Neon` needs nothing beyond the aarch64 baseline.
    unsafe { tile1::<W, Neon, 1>(x, y, y.len())[0] }
}

/// The body of [`vec_dot_dotprod`], compiled for dotprod.
#[target_feature(enable = "dotprod")]
fn vec_dot_dotprod_body<W: WeightBlock>(x: &[W], y: &[W::Act]) -> f32 {
    // SAFETY: this function is only entered on a CPU with dotprod (its `target_feature`).
    unsafe { tile1::<W, Dotprod, 1>(x, y, y.len())[0] }
}

/// `vec_dot` with `sdot`. Only reachable through the DOTPROD/I8MM tables.
pub(crate) fn vec_dot_dotprod<W: WeightBlock>(x: &[W], y: &[W::Act]) -> f32 {
    assert_eq!(x.len(), y.len(), "vec_dot: length mismatch");
    // SAFETY: this function is only referenced by the DOTPROD and I8MM tables, which
    // `Kernels::for_path` hands out only after runtime detection of dotprod.
    unsafe { vec_dot_dotprod_body(x, y) }
}
