//! Dot products, matrix-vector and matrix-matrix products on `wide` vectors.
//!
//! As in the AVX2 path, everything goes through one register tile of `RM` rows × `RN` tokens
//! where each (row, token) pair has its own f32x4 accumulator receiving, block by block,
//! `mul_add(f32(isum), d_w * d_a, acc)` (then `mul_add(m, [s, 0, 0, 0], acc)` for Q4_1) and
//! reduced with `reduce_add` at the end: the same sequence for every pair whatever the tile
//! shape, so a row's result does not depend on the tiling, the caller's row range, or on which
//! of `vec_dot` / `matvec` / `matmul` computed it.

use super::dot::{Fmt, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0};
use super::simd::f16_to_f32;
use crate::block::{BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0, BlockQ8_1};
use crate::reference::{check_matmul, check_matvec};
use wide::f32x4;

/// Weight rows per pass of a matrix-vector product (they share each activation block).
const MV_ROWS: usize = 4;
/// Register tile of a matrix-matrix product: 4x2 measured ~10% faster than 2x2 even with the
/// spills of SSE2's 16 registers (aarch64 has 32).
const MM_ROWS: usize = 4;
const MM_TOKS: usize = 2;

struct Problem<'a, F: Fmt> {
    w: &'a [F::W],
    a: &'a [F::A],
    nb: usize,
    n_tok: usize,
}

/// Rows `r..r+RM` × tokens `t..t+RN`, written into `out` (`[row][tok]`).
#[inline]
fn tile<F: Fmt, const RM: usize, const RN: usize>(
    p: &Problem<'_, F>,
    r: usize,
    t: usize,
    out: &mut [f32],
) {
    let nb = p.nb;
    let mut rows: [&[F::W]; RM] = [&[]; RM];
    for (i, row) in rows.iter_mut().enumerate() {
        *row = &p.w[(r + i) * nb..][..nb];
    }
    let mut toks: [&[F::A]; RN] = [&[]; RN];
    for (j, tok) in toks.iter_mut().enumerate() {
        *tok = &p.a[(t + j) * nb..][..nb];
    }
    let mut acc = [[f32x4::ZERO; RN]; RM];
    for b in 0..nb {
        let mut wp = [F::prep_w(&rows[0][b]); RM];
        let mut wd = [0.0f32; RM];
        let mut wm = [f32x4::ZERO; RM];
        for i in 0..RM {
            let blk = &rows[i][b];
            if i > 0 {
                wp[i] = F::prep_w(blk);
            }
            wd[i] = f16_to_f32(F::w_d(blk));
            if F::HAS_MIN {
                wm[i] = f32x4::splat(f16_to_f32(F::w_m(blk)));
            }
        }
        for j in 0..RN {
            let ap = F::prep_a(&toks[j][b]);
            // Converted here rather than once per call: kernels allocate nothing.
            let da = f16_to_f32(F::a_d(&toks[j][b]));
            let sv = if F::HAS_MIN {
                f32x4::from([f16_to_f32(F::a_s(&toks[j][b])), 0.0, 0.0, 0.0])
            } else {
                f32x4::ZERO
            };
            for i in 0..RM {
                let s = f32x4::from_i32x4(F::isum(&wp[i], &ap));
                acc[i][j] = s.mul_add(f32x4::splat(wd[i] * da), acc[i][j]);
                if F::HAS_MIN {
                    acc[i][j] = wm[i].mul_add(sv, acc[i][j]);
                }
            }
        }
    }
    for i in 0..RM {
        for j in 0..RN {
            out[(r + i) * p.n_tok + t + j] = acc[i][j].reduce_add();
        }
    }
}

/// Picks the tile instance for `rm` rows (1..=4) × `rn` tokens (1..=2).
fn tile_dyn<F: Fmt>(p: &Problem<'_, F>, r: usize, t: usize, rm: usize, rn: usize, out: &mut [f32]) {
    match (rm, rn) {
        (1, 1) => tile::<F, 1, 1>(p, r, t, out),
        (2, 1) => tile::<F, 2, 1>(p, r, t, out),
        (3, 1) => tile::<F, 3, 1>(p, r, t, out),
        (4, 1) => tile::<F, 4, 1>(p, r, t, out),
        (1, 2) => tile::<F, 1, 2>(p, r, t, out),
        (2, 2) => tile::<F, 2, 2>(p, r, t, out),
        (3, 2) => tile::<F, 3, 2>(p, r, t, out),
        (4, 2) => tile::<F, 4, 2>(p, r, t, out),
        _ => unreachable!("tile {rm}x{rn}"),
    }
}

/// Walks `rows × n_tok` in tiles of `RM × RN` (smaller ones at the edges).
fn run<F: Fmt, const RM: usize, const RN: usize>(
    w: &[F::W],
    a: &[F::A],
    nb: usize,
    n_tok: usize,
    out: &mut [f32],
) {
    const { assert!(RM >= 1 && RM <= 4 && RN >= 1 && RN <= 2) };
    let rows = out.len() / n_tok;
    let p = Problem::<F> { w, a, nb, n_tok };
    super::for_each_tile(rows, n_tok, RM, RN, |r, t, rm, rn| {
        if rm == RM && rn == RN {
            tile::<F, RM, RN>(&p, r, t, out);
        } else {
            tile_dyn::<F>(&p, r, t, rm, rn, out);
        }
    });
}

macro_rules! kernels {
    ($fmt:ty, $w:ty, $a:ty, $dot:ident, $mv:ident, $mm:ident) => {
        /// `vec_dot` (portable): the same per-block sequence as one pair of a tile.
        pub(crate) fn $dot(x: &[$w], y: &[$a]) -> f32 {
            assert_eq!(
                x.len(),
                y.len(),
                concat!(stringify!($dot), ": length mismatch")
            );
            let mut out = [0.0f32];
            run::<$fmt, 1, 1>(x, y, x.len(), 1, &mut out);
            out[0]
        }

        /// Matrix-vector product (portable), `MV_ROWS` rows per pass.
        pub(crate) fn $mv(w: &[$w], a: &[$a], out: &mut [f32]) {
            let nb = check_matvec(w, a, out);
            if nb == 0 || out.is_empty() {
                out.fill(0.0);
                return;
            }
            run::<$fmt, MV_ROWS, 1>(w, a, nb, 1, out)
        }

        /// Matrix-matrix product (portable), tiles of `MM_ROWS × MM_TOKS`.
        pub(crate) fn $mm(w: &[$w], a: &[$a], n_tok: usize, out: &mut [f32]) {
            let (nb, rows) = check_matmul(w, a, n_tok, out);
            if nb == 0 || rows == 0 {
                out.fill(0.0);
                return;
            }
            run::<$fmt, MM_ROWS, MM_TOKS>(w, a, nb, n_tok, out)
        }
    };
}

kernels!(
    Q4_0,
    BlockQ4_0,
    BlockQ8_0,
    vec_dot_q4_0_q8_0,
    matvec_q4_0_q8_0,
    matmul_q4_0_q8_0
);
kernels!(
    Q4_1,
    BlockQ4_1,
    BlockQ8_1,
    vec_dot_q4_1_q8_1,
    matvec_q4_1_q8_1,
    matmul_q4_1_q8_1
);
kernels!(
    Q8_0,
    BlockQ8_0,
    BlockQ8_0,
    vec_dot_q8_0_q8_0,
    matvec_q8_0_q8_0,
    matmul_q8_0_q8_0
);
kernels!(
    Q5_0,
    BlockQ5_0,
    BlockQ8_0,
    vec_dot_q5_0_q8_0,
    matvec_q5_0_q8_0,
    matmul_q5_0_q8_0
);
kernels!(
    Q5_1,
    BlockQ5_1,
    BlockQ8_1,
    vec_dot_q5_1_q8_1,
    matvec_q5_1_q8_1,
    matmul_q5_1_q8_1
);
