//! Scalar references: the definition of every kernel, written for clarity, not speed.
//!
//! Quantizers and dot products follow ggml's `*_ref` functions exactly (same rounding, same
//! clamping), so that `edgellm quantize` produces llama.cpp's bytes. Every fast path in
//! `portable`, `x86` and `neon` is tested against these.

mod k_quants;
mod ops;
mod packed;
mod q4_0;
mod q4_1;
mod q4_k;
mod q5_0;
mod q5_1;
mod q5_k;
mod q6_k;
mod q8_0;
mod q8_1;
mod q8_k;

pub use k_quants::*;
pub use ops::*;
pub use packed::*;
pub use q4_0::*;
pub use q4_1::*;
pub use q4_k::*;
pub use q5_0::*;
pub use q5_1::*;
pub use q5_k::*;
pub use q6_k::*;
pub use q8_0::*;
pub use q8_1::*;
pub use q8_k::*;

use crate::block::BlockFormat;

/// The value of largest magnitude in `x`, its sign kept (the first of equal magnitudes; 0 for
/// an empty or all-zero block): the scale of ggml's symmetric quantizers (Q4_0, Q5_0, Q8_K),
/// which map it to their most negative level.
pub(crate) fn signed_absmax(x: &[f32]) -> f32 {
    let mut amax = 0.0f32;
    let mut max = 0.0f32;
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    max
}

/// `(min, max)` of `x` as ggml's asymmetric quantizers (Q4_1, Q5_1) find them.
pub(crate) fn min_max(x: &[f32]) -> (f32, f32) {
    let mut min = f32::MAX;
    let mut max = -f32::MAX;
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

/// Checks the shapes shared by every matrix-vector product and returns the blocks per row.
///
/// `w` holds `out.len()` rows of `a.len()` blocks each.
#[inline]
pub fn check_matvec<W, A>(w: &[W], a: &[A], out: &[f32]) -> usize {
    let nb = a.len();
    assert!(
        w.len() == out.len() * nb,
        "matvec: {} weight blocks for {} rows of {} blocks",
        w.len(),
        out.len(),
        nb
    );
    nb
}

/// Checks the shapes of a matrix-matrix product; returns `(blocks per row, rows)`.
///
/// `a` holds `n_tok` activation rows (token-major), `out` is `[row][tok]`.
#[inline]
pub fn check_matmul<W, A>(w: &[W], a: &[A], n_tok: usize, out: &[f32]) -> (usize, usize) {
    assert!(n_tok > 0, "matmul: no tokens");
    assert!(
        a.len().is_multiple_of(n_tok) && out.len().is_multiple_of(n_tok),
        "matmul: {} activation blocks / {} outputs for {} tokens",
        a.len(),
        out.len(),
        n_tok
    );
    let nb = a.len() / n_tok;
    let rows = out.len() / n_tok;
    assert!(
        w.len() == rows * nb,
        "matmul: {} weight blocks for {} rows of {} blocks",
        w.len(),
        rows,
        nb
    );
    (nb, rows)
}

/// Reference matrix-vector product: `out[r] = dot(w[r], a)`.
pub fn matvec_ref<W: BlockFormat>(w: &[W], a: &[W::Activation], out: &mut [f32]) {
    let nb = check_matvec(w, a, out);
    if nb == 0 {
        out.fill(0.0);
        return;
    }
    for (o, row) in out.iter_mut().zip(w.chunks_exact(nb)) {
        *o = W::vec_dot_ref(row, a);
    }
}

/// Reference matrix-matrix product: `out[r * n_tok + t] = dot(w[r], a[t])`.
pub fn matmul_ref<W: BlockFormat>(w: &[W], a: &[W::Activation], n_tok: usize, out: &mut [f32]) {
    let (nb, _rows) = check_matmul(w, a, n_tok, out);
    if nb == 0 {
        out.fill(0.0);
        return;
    }
    for (orow, row) in out.chunks_exact_mut(n_tok).zip(w.chunks_exact(nb)) {
        for (o, act) in orow.iter_mut().zip(a.chunks_exact(nb)) {
            *o = W::vec_dot_ref(row, act);
        }
    }
}
