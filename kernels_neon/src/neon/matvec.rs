//! Matrix-vector products (token generation): four weight rows per pass share each loaded
//! activation block and its scale ([`tile4`]), the remaining rows go one by one ([`tile1`]);
//! both compute a row in the same pair form, so `out[r]` has the same bits whatever range of
//! rows a caller passes.

use super::dot::{Dotprod, IDot, Neon, WeightBlock, tile1, tile4};
use crate::reference::check_matvec;
use core::arch::aarch64::*;

/// # Safety
/// The CPU supports `I`; the shapes passed [`check_matvec`].
#[inline(always)]
unsafe fn matvec_impl<W: WeightBlock, I: IDot>(w: &[W], a: &[W::Act], out: &mut [f32]) {
    let nb = a.len();
    let (groups, tail) = out.as_chunks_mut::<4>();
    let (wg, wt) = w.split_at(groups.len() * 4 * nb);
    for (i, o) in groups.iter_mut().enumerate() {
        let rows = &wg[i * 4 * nb..(i + 1) * 4 * nb];
        // SAFETY: the CPU supports `I` (this function's contract); `o` is valid for 4
        // writable f32.
        unsafe { vst1q_f32(o.as_mut_ptr(), tile4::<W, I, 1>(rows, a, nb)[0]) };
    }
    for (r, o) in tail.iter_mut().enumerate() {
        // SAFETY: as above.
        *o = unsafe { tile1::<W, I, 1>(&wt[r * nb..(r + 1) * nb], a, nb)[0] };
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
