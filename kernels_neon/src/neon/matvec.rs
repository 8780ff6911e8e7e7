//! Matrix-vector products (token generation): four weight rows per pass share each loaded
//! activation block and its scale; the remaining rows go one by one. Both use
//! [`rows_vec`], whose per-row sequence of operations does not depend on the number of rows
//! it is given, so `out[r]` has the same bits whatever range of rows a caller passes.

use super::dot::{Dotprod, IDot, Neon, WeightBlock, rows_vec};
use crate::reference::check_matvec;

/// Rows per pass of the matrix-vector products.
const ROWS: usize = 4;

/// # Safety
/// The CPU supports `I`.
#[inline(always)]
unsafe fn matvec_impl<W: WeightBlock, I: IDot>(w: &[W], a: &[W::Act], out: &mut [f32]) {
    let nb = a.len();
    let (groups, tail) = out.as_chunks_mut::<ROWS>();
    let (wg, wt) = w.split_at(groups.len() * ROWS * nb);
    for (i, o) in groups.iter_mut().enumerate() {
        let rows = &wg[i * ROWS * nb..(i + 1) * ROWS * nb];
        // SAFETY: the CPU supports `I` (this function's contract).
        unsafe { rows_vec::<W, I, ROWS>(rows, a, o) };
    }
    for (r, o) in tail.iter_mut().enumerate() {
        let row = &wt[r * nb..(r + 1) * nb];
        // SAFETY: as above.
        unsafe { rows_vec::<W, I, 1>(row, a, core::slice::from_mut(o)) };
    }
}

/// Matrix-vector product on base NEON.
pub(crate) fn matvec_neon<W: WeightBlock>(w: &[W], a: &[W::Act], out: &mut [f32]) {
    check_matvec(w, a, out);
    // SAFETY: `Neon` needs nothing beyond the aarch64 baseline.
    unsafe { matvec_impl::<W, Neon>(w, a, out) }
}

#[target_feature(enable = "dotprod")]
fn matvec_dotprod_body<W: WeightBlock>(w: &[W], a: &[W::Act], out: &mut [f32]) {
    // SAFETY: this function is only entered on a CPU with dotprod (its `target_feature`).
    unsafe { matvec_impl::<W, Dotprod>(w, a, out) }
}

/// Matrix-vector product with `sdot`. Only reachable through the DOTPROD/I8MM tables.
pub(crate) fn matvec_dotprod<W: WeightBlock>(w: &[W], a: &[W::Act], out: &mut [f32]) {
    check_matvec(w, a, out);
    // SAFETY: this function is only referenced by the DOTPROD and I8MM tables, which
    // `Kernels::for_path` hands out only after runtime detection of dotprod.
    unsafe { matvec_dotprod_body(w, a, out) }
}
