//! The entry points of a path's products over packed weights, written once for every path.

/// Defines, in the invoking module, the eight safe entry points of [`crate::PackedKernels`] over
/// that module's `unsafe fn run::<P>(w, a, nb, n_tok, out)`, and `const PACKED` holding them.
/// `$what` names the path in the docs; `$features` says what `run` needs, for the `SAFETY`
/// comment: the table is reachable only through the path's `Kernels`, which
/// `Kernels::for_path` hands out after runtime detection of those features.
macro_rules! packed_table {
    ($what:literal, $features:literal) => {
        packed_table!(@fns $what, BlockQ4_0x8, BlockQ8_0, matvec_q4_0x8_q8_0, matmul_q4_0x8_q8_0);
        packed_table!(@fns $what, BlockQ4_1x8, BlockQ8_1, matvec_q4_1x8_q8_1, matmul_q4_1x8_q8_1);
        packed_table!(@fns $what, BlockQ8_0x8, BlockQ8_0, matvec_q8_0x8_q8_0, matmul_q8_0x8_q8_0);
        packed_table!(@fns $what, BlockQ5_0x8, BlockQ8_0, matvec_q5_0x8_q8_0, matmul_q5_0x8_q8_0);

        #[doc = concat!("The packed products of ", $what, " (run with ", $features, ").")]
        pub(crate) const PACKED: crate::dispatch::PackedKernels = crate::dispatch::PackedKernels {
            matvec_q4_0x8_q8_0,
            matvec_q4_1x8_q8_1,
            matvec_q8_0x8_q8_0,
            matvec_q5_0x8_q8_0,
            matmul_q4_0x8_q8_0,
            matmul_q4_1x8_q8_1,
            matmul_q8_0x8_q8_0,
            matmul_q5_0x8_q8_0,
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

/// Defines, in the invoking module, the six safe entry points of [`crate::PackedKQuants`] over
/// an `unsafe fn $run::<P>(w, a, nb, n_tok, out)` of that module, and `const PACKED_K` holding
/// them; `$what` and `$features` as for [`packed_table!`].
macro_rules! packed_k_table {
    // A path of safe code: `$run` is a safe function.
    (safe $what:literal, $run:ident) => {
        packed_k_table!(@table $what, "no particular CPU feature", $run, safe);
    };
    ($what:literal, $features:literal, $run:ident) => {
        packed_k_table!(@table $what, $features, $run, unsafe);
    };
    (@table $what:literal, $features:literal, $run:ident, $safety:ident) => {
        packed_k_table!(@fns $what, $safety, $run, BlockQ4Kx8, matvec_q4_kx8_q8_k, matmul_q4_kx8_q8_k);
        packed_k_table!(@fns $what, $safety, $run, BlockQ5Kx8, matvec_q5_kx8_q8_k, matmul_q5_kx8_q8_k);
        packed_k_table!(@fns $what, $safety, $run, BlockQ6Kx8, matvec_q6_kx8_q8_k, matmul_q6_kx8_q8_k);

        #[doc = concat!("The packed K-quant products of ", $what, " (run with ", $features, ").")]
        pub(crate) const PACKED_K: crate::dispatch::PackedKQuants = crate::dispatch::PackedKQuants {
            matvec_q4_kx8_q8_k,
            matvec_q5_kx8_q8_k,
            matvec_q6_kx8_q8_k,
            matmul_q4_kx8_q8_k,
            matmul_q5_kx8_q8_k,
            matmul_q6_kx8_q8_k,
        };
    };
    (@fns $what:literal, $safety:ident, $run:ident, $p:ty, $mv:ident, $mm:ident) => {
        #[doc = concat!("Matrix-vector product over `", stringify!($p), "` (", $what, ").")]
        fn $mv(w: &[$p], a: &[crate::block::BlockQ8K], out: &mut [f32]) {
            $mm(w, a, 1, out)
        }

        #[doc = concat!("Matrix-matrix product over `", stringify!($p), "` (", $what, ").")]
        fn $mm(w: &[$p], a: &[crate::block::BlockQ8K], n_tok: usize, out: &mut [f32]) {
            let nb = crate::reference::check_packed(w, a, n_tok, out);
            if nb == 0 || out.is_empty() {
                out.fill(0.0);
                return;
            }
            packed_k_table!(@call $safety, $run::<$p>(w, a, nb, n_tok, out));
        }
    };
    (@call safe, $call:expr) => {
        $call
    };
    (@call unsafe, $call:expr) => {
        // SAFETY: only reachable through `PACKED_K`, in the tables of paths whose features
        // (see the invocation) `Kernels::for_path` detected at runtime; `check_packed` checked
        // the shapes.
        unsafe { $call }
    };
}
