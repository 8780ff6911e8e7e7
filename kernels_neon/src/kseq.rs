//! The scalar part of a K-quant block product that the fast paths share (`x86/kquant.rs`,
//! `neon/kquant.rs`, `portable/kquant.rs`), written once so that they cannot drift apart: each
//! path computes the block's exact integer sum `sumi` with its own instructions and hands it
//! here. `tests/kquant_sequence.rs` checks every path against this sequence, bit for bit.

use crate::block::{BlockQ8K, K_SCALE_SIZE};
use crate::reference::get_scale_min_k4;

/// Q4_K/Q5_K sub-block scales and mins per 16 values (both halves of a 32-value sub-block
/// share theirs), as the kernels multiply them.
#[inline(always)]
pub(crate) fn scales_mins(scales: &[u8; K_SCALE_SIZE]) -> ([i32; 16], [i32; 16]) {
    let (mut sc, mut mins) = ([0i32; 16], [0i32; 16]);
    for j in 0..8 {
        let (s, m) = get_scale_min_k4(j, scales);
        (sc[2 * j], sc[2 * j + 1]) = (s as i32, s as i32);
        (mins[2 * j], mins[2 * j + 1]) = (m as i32, m as i32);
    }
    (sc, mins)
}

/// One block for one token, given its exact integer sum: `m = Σ bsum_mul[i] · bsums[i]`; with
/// a `dmin` (Q4_K, Q5_K: the mins) `mins = fma(dmin · d_a, f32(m), mins)`, without (Q6_K's
/// -32 offset) `sumi -= m`, exact; then `acc = fma(d · d_a, f32(sumi), acc)`. The result of a
/// row is `acc - mins` after its last block.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
// one block's scalars and the two running sums
// NEON's: the x86 and portable paths compute the offset in vector lanes (`finish_block_off`).
#[cfg_attr(not(target_arch = "aarch64"), allow(dead_code))]
pub(crate) fn finish_block(
    sumi: i32,
    d: f32,
    dmin: Option<f32>,
    bsum_mul: &[i32; 16],
    a: &BlockQ8K,
    acc: &mut f32,
    mins: &mut f32,
) {
    let mut off = 0i32;
    for (m, &b) in bsum_mul.iter().zip(&a.bsums) {
        off = off.wrapping_add(m.wrapping_mul(b as i32));
    }
    finish_block_off(sumi, off, d, dmin, a.d, acc, mins);
}

/// [`finish_block`] given `off = Σ bsum_mul[i] · bsums[i]` (wrapping), for a path that computes
/// that integer with its own instructions (`portable/kquant.rs`); `a_d` is the activation's `d`.
#[inline(always)]
#[allow(clippy::too_many_arguments)] // as `finish_block`
pub(crate) fn finish_block_off(
    sumi: i32,
    off: i32,
    d: f32,
    dmin: Option<f32>,
    a_d: f32,
    acc: &mut f32,
    mins: &mut f32,
) {
    let mut sumi = sumi;
    match dmin {
        Some(dmin) => *mins = (dmin * a_d).mul_add(off as f32, *mins),
        None => sumi = sumi.wrapping_sub(off),
    }
    *acc = (d * a_d).mul_add(sumi as f32, *acc);
}
