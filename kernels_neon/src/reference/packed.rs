//! Products over interleaved weights ([`PackedFormat`]): each row computed as the row format's
//! reference computes it, so a packed product equals [`super::matvec_ref`] on the unpacked
//! rows, bit for bit.

use crate::block::{BlockFormat, PACK_ROWS, PackedFormat};

/// Checks the shapes of a product over packed weights; returns the blocks per row.
///
/// `w` holds `out.len() / 8` groups of `a.len() / n_tok` packed blocks; `out` is `[row][tok]`
/// with a multiple of eight rows.
#[inline]
pub fn check_packed<P, A>(w: &[P], a: &[A], n_tok: usize, out: &[f32]) -> usize {
    assert!(n_tok > 0, "packed product: no tokens");
    assert!(
        a.len().is_multiple_of(n_tok) && out.len().is_multiple_of(n_tok * PACK_ROWS),
        "packed product: {} activation blocks / {} outputs for {n_tok} tokens in groups of 8 rows",
        a.len(),
        out.len()
    );
    let nb = a.len() / n_tok;
    let groups = out.len() / n_tok / PACK_ROWS;
    assert!(
        w.len() == groups * nb,
        "packed product: {} packed blocks for {groups} groups of {nb} blocks",
        w.len()
    );
    nb
}

/// Reference matrix-vector product over packed weights: `out[r] = dot(row r, a)`.
pub fn matvec_packed_ref<P: PackedFormat>(
    w: &[P],
    a: &[<P::Row as BlockFormat>::Activation],
    out: &mut [f32],
) {
    matmul_packed_ref(w, a, 1, out)
}

/// Reference matrix-matrix product over packed weights: `out[r * n_tok + t] = dot(row r, a[t])`.
pub fn matmul_packed_ref<P: PackedFormat>(
    w: &[P],
    a: &[<P::Row as BlockFormat>::Activation],
    n_tok: usize,
    out: &mut [f32],
) {
    let nb = check_packed(w, a, n_tok, out);
    if nb == 0 {
        out.fill(0.0);
        return;
    }
    let mut row = vec![P::Row::default(); nb];
    for (r, o) in out.chunks_exact_mut(n_tok).enumerate() {
        let (g, k) = (r / PACK_ROWS, r % PACK_ROWS);
        for (dst, p) in row.iter_mut().zip(&w[g * nb..][..nb]) {
            *dst = p.unpack(k);
        }
        // The whole row at once, as `matvec_ref` takes it: the K-quant references sum a row's
        // blocks in eight lanes, not one after the other.
        for (t, o) in o.iter_mut().enumerate() {
            *o = P::Row::vec_dot_ref(&row, &a[t * nb..][..nb]);
        }
    }
}
