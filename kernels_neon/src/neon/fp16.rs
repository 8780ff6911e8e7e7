//! f16 ↔ f32 conversions with the ARMv8.0 base instructions `fcvt`, `fcvtl`/`fcvtl2` and
//! `fcvtn`/`fcvtn2` (IEEE half precision; FEAT_FP16 is only needed for f16 *arithmetic*).
//!
//! The f16 NEON intrinsic types are unstable on stable Rust, so the instructions are written
//! with `asm!`, on `u16` lanes. All of them are exact (f16 → f32) or round to nearest even
//! with overflow to infinity and gradual underflow (f32 → f16), as long as FPCR has its Linux
//! defaults (round to nearest, no flush-to-zero, IEEE half format), exactly like
//! [`half::f16::from_f32`].
//!
//! None of the `asm!` blocks uses `preserves_flags`: conversions may raise FPSR exception flags.

use crate::block::f16;
use core::arch::aarch64::*;
use core::arch::asm;

/// f16 → f32 (scalar `fcvt s, h`), exact.
#[inline(always)]
pub(super) fn h2f(h: f16) -> f32 {
    let out: f32;
    // SAFETY: `fcvt` between half and single precision is a base ARMv8.0 FP instruction; it
    // reads and writes registers only.
    unsafe {
        asm!("fcvt {o:s}, {i:h}", i = in(vreg) h.to_bits(), o = lateout(vreg) out,
             options(pure, nomem, nostack));
    }
    out
}

/// f32 → f16 (scalar `fcvt h, s`), round to nearest even.
#[inline(always)]
pub(super) fn f2h(x: f32) -> f16 {
    let out: u16;
    // SAFETY: as in `h2f`; writing `h` zeroes the rest of the register, so the `u16` read back
    // is the converted value.
    unsafe {
        asm!("fcvt {o:h}, {i:s}", i = in(vreg) x, o = lateout(vreg) out,
             options(pure, nomem, nostack));
    }
    f16::from_bits(out)
}

/// Lanes 0..4 of eight f16 → f32 (`fcvtl`).
#[inline(always)]
pub(super) fn h2f_lo(h: uint16x8_t) -> float32x4_t {
    let out: float32x4_t;
    // SAFETY: base ARMv8.0 SIMD instruction, registers only.
    unsafe {
        asm!("fcvtl {o:v}.4s, {i:v}.4h", i = in(vreg) h, o = lateout(vreg) out,
             options(pure, nomem, nostack));
    }
    out
}

/// Lanes 4..8 of eight f16 → f32 (`fcvtl2`).
#[inline(always)]
pub(super) fn h2f_hi(h: uint16x8_t) -> float32x4_t {
    let out: float32x4_t;
    // SAFETY: base ARMv8.0 SIMD instruction, registers only.
    unsafe {
        asm!("fcvtl2 {o:v}.4s, {i:v}.8h", i = in(vreg) h, o = lateout(vreg) out,
             options(pure, nomem, nostack));
    }
    out
}

/// Eight f32 (two vectors) → eight f16 (`fcvtn` + `fcvtn2`), round to nearest even.
#[inline(always)]
pub(super) fn f2h_x8(lo: float32x4_t, hi: float32x4_t) -> uint16x8_t {
    let out: uint16x8_t;
    // SAFETY: base ARMv8.0 SIMD instructions, registers only. `out` is an early-clobber
    // output (not `lateout`): it is written before `hi` is read.
    unsafe {
        asm!("fcvtn {o:v}.4h, {lo:v}.4s", "fcvtn2 {o:v}.8h, {hi:v}.4s",
             lo = in(vreg) lo, hi = in(vreg) hi, o = out(vreg) out,
             options(pure, nomem, nostack));
    }
    out
}

/// Loads eight f16 as `u16` lanes.
#[inline(always)]
pub(super) fn load_h8(h: &[f16; 8]) -> uint16x8_t {
    // SAFETY: `f16` is a transparent `u16`; the reference is valid for 16 readable bytes and
    // `ld1` has no alignment requirement beyond the element's.
    unsafe { vld1q_u16(h.as_ptr().cast::<u16>()) }
}

/// Stores eight `u16` lanes as f16.
#[inline(always)]
pub(super) fn store_h8(h: &mut [f16; 8], v: uint16x8_t) {
    // SAFETY: as in `load_h8`, for 16 writable bytes.
    unsafe { vst1q_u16(h.as_mut_ptr().cast::<u16>(), v) }
}
