//! The entry points of a path's products over packed weights, written once for every path.

/// Defines, in the invoking module, the six safe entry points of [`crate::PackedKernels`] over
/// that module's `unsafe fn run::<P>(w, a, nb, n_tok, out)`, and `const PACKED` holding them.
/// `$what` names the path in the docs; `$features` says what `run` needs, for the `SAFETY`
/// comment: the table is reachable only through the path's `Kernels`, which
/// `Kernels::for_path` hands out after runtime detection of those features.
macro_rules! packed_table {
    ($what:literal, $features:literal) => {
        packed_table!(@fns $what, BlockQ4_0x8, BlockQ8_0, matvec_q4_0x8_q8_0, matmul_q4_0x8_q8_0);
        packed_table!(@fns $what, BlockQ4_1x8, BlockQ8_1, matvec_q4_1x8_q8_1, matmul_q4_1x8_q8_1);
        packed_table!(@fns $what, BlockQ8_0x8, BlockQ8_0, matvec_q8_0x8_q8_0, matmul_q8_0x8_q8_0);

        #[doc = concat!("The packed products of ", $what, " (run with ", $features, ").")]
        pub(crate) const PACKED: crate::dispatch::PackedKernels = crate::dispatch::PackedKernels {
            matvec_q4_0x8_q8_0,
            matvec_q4_1x8_q8_1,
            matvec_q8_0x8_q8_0,
            matmul_q4_0x8_q8_0,
            matmul_q4_1x8_q8_1,
            matmul_q8_0x8_q8_0,
        };
    };
    (@fns $what:literal, $p:ty, $a:ty, $mv:ident, $mm:ident) => {
        #[doc = concat!("Matrix-vector product over `", stringify!($p), "` (", $what, ").")]
        fn $mv(w: &[$p], a: &[$a], out: &mut [f32]) {
            $mm(w, a, 1, out)
        }

        #[doc = concat!("Matrix-matrix product over `", stringify!($p), "` (", $what, ").")]
        fn $mm(w: &[$p], a: &[$a], n_tok: usize, out: &mut [f32]) {
            let nb = crate::reference::check_packed(w, a, n_tok, out);
            if nb == 0 || out.is_empty() {
                out.fill(0.0);
                return;
            }
            // SAFETY: only reachable through `PACKED`, in the tables of paths whose features
            // (see the invocation) `Kernels::for_path` detected at runtime; `check_packed`
            // checked the shapes.
            unsafe { run::<$p>(w, a, nb, n_tok, out) }
        }
    };
}
