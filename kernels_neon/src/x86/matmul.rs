//! Dot products, matrix-vector and matrix-matrix products (AVX2).
//!
//! Everything goes through one register tile, [`tile`]: `RM` weight rows × `RN` tokens, each
//! (row, token) pair with its own 8-lane f32 accumulator that receives, block by block,
//! `fma(cvt(isum), d_w * d_a, acc)` (the product rounded to f32) (then `fma(m, [s, 0, ..], acc)` for Q4_1), and is reduced
//! by [`hsum_ps`] at the end. That sequence is the same for every pair whatever the tile
//! shape, so a row's result does not depend on how many rows a caller passes, where the row
//! falls in a tile, or whether it came through `vec_dot`, `matvec` or `matmul`: tails use
//! smaller instances of the same tile.

use super::dot::{Fmt, Q4_0, Q4_1, Q8_0, scales_to_f32};
use super::simd::{hsum_ps, store_ps4};
use crate::block::{BlockQ4_0, BlockQ4_1, BlockQ8_0, BlockQ8_1};
use crate::reference::{check_matmul, check_matvec};
use std::arch::x86_64::*;

/// Weight rows per pass of a matrix-vector product (they share each activation block).
const MV_ROWS: usize = 4;
/// Register tile of a matrix-matrix product.
const MM_ROWS: usize = 4;
const MM_TOKS: usize = 2;

/// `RM` rows of `w` (`nb` blocks each) against `RN` tokens of `a`; `ad`/`asum` are the
/// tokens' scales `d` and `s` as f32 (`RN * nb` each; `asum` unused without `HAS_MIN`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn tile<F: Fmt, const RM: usize, const RN: usize>(
    w: &[F::W],
    a: &[F::A],
    ad: &[f32],
    asum: &[f32],
    nb: usize,
) -> [[f32; RN]; RM] {
    const { assert!(RM >= 1 && RM <= 4 && RN >= 1) };
    // Plain loops rather than `array::from_fn`: its closures are not always inlined here.
    let mut rows: [&[F::W]; RM] = [&[]; RM];
    for (i, r) in rows.iter_mut().enumerate() {
        *r = &w[i * nb..][..nb];
    }
    let mut toks: [&[F::A]; RN] = [&[]; RN];
    let mut tok_d: [&[f32]; RN] = [&[]; RN];
    let mut tok_s: [&[f32]; RN] = [&[]; RN];
    for j in 0..RN {
        toks[j] = &a[j * nb..][..nb];
        tok_d[j] = &ad[j * nb..][..nb];
        if F::HAS_MIN {
            tok_s[j] = &asum[j * nb..][..nb];
        }
    }
    let mut acc = [[_mm256_setzero_ps(); RN]; RM];
    for b in 0..nb {
        // SAFETY (all `unsafe` calls below): `Fmt`'s functions need avx2, fma and f16c, which
        // this function runs with.
        let mut wp = [unsafe { F::wp_zero() }; RM];
        // The rows' f16 `d` (and `m`) gathered in general registers and widened in one go:
        // `d` in lanes 0..RM, `m` in lanes 4..4+RM.
        let mut dbits = 0u64;
        let mut mbits = 0u64;
        for i in 0..RM {
            let blk = &rows[i][b];
            wp[i] = unsafe { F::prep_w(blk) };
            dbits |= u64::from(F::w_d(blk).to_bits()) << (16 * i);
            if F::HAS_MIN {
                mbits |= u64::from(F::w_m(blk).to_bits()) << (16 * i);
            }
        }
        let wdm = _mm256_cvtph_ps(_mm_set_epi64x(mbits as i64, dbits as i64));
        let mut wm = [0.0f32; 4];
        if F::HAS_MIN {
            store_ps4(&mut wm, _mm256_extractf128_ps::<1>(wdm));
        }
        for j in 0..RN {
            let ap = unsafe { F::prep_a(&toks[j][b]) };
            // d_w * d_a of the RM pairs of this token.
            let mut sc = [0.0f32; 4];
            store_ps4(
                &mut sc,
                _mm_mul_ps(_mm256_castps256_ps128(wdm), _mm_set1_ps(tok_d[j][b])),
            );
            let sv = if F::HAS_MIN {
                _mm256_zextps128_ps256(_mm_set_ss(tok_s[j][b]))
            } else {
                _mm256_setzero_ps()
            };
            for i in 0..RM {
                let p = _mm256_cvtepi32_ps(unsafe { F::isum(wp[i], ap) });
                acc[i][j] = _mm256_fmadd_ps(p, _mm256_set1_ps(sc[i]), acc[i][j]);
                if F::HAS_MIN {
                    acc[i][j] = _mm256_fmadd_ps(_mm256_set1_ps(wm[i]), sv, acc[i][j]);
                }
            }
        }
    }
    let mut res = [[0.0; RN]; RM];
    for i in 0..RM {
        for j in 0..RN {
            res[i][j] = hsum_ps(acc[i][j]);
        }
    }
    res
}

/// One tile at rows `r..r+RM` × tokens `t..t+RN`, written into `out` (`[row][tok]`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn tile_out<F: Fmt, const RM: usize, const RN: usize>(
    p: &Problem<'_, F>,
    r: usize,
    t: usize,
    out: &mut [f32],
) {
    let nb = p.nb;
    let res = tile::<F, RM, RN>(
        &p.w[r * nb..],
        &p.a[t * nb..],
        &p.ad[t * nb..],
        if F::HAS_MIN { &p.asum[t * nb..] } else { &[] },
        nb,
    );
    for (i, row) in res.iter().enumerate() {
        out[(r + i) * p.n_tok + t..][..RN].copy_from_slice(row);
    }
}

struct Problem<'a, F: Fmt> {
    w: &'a [F::W],
    a: &'a [F::A],
    ad: &'a [f32],
    asum: &'a [f32],
    nb: usize,
    n_tok: usize,
}

/// Picks the tile instance for `rm` rows (1..=4) × `rn` tokens (1..=4).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn tile_dyn<F: Fmt>(p: &Problem<'_, F>, r: usize, t: usize, rm: usize, rn: usize, out: &mut [f32]) {
    macro_rules! by_rn {
        ($rm:literal) => {
            match rn {
                1 => tile_out::<F, $rm, 1>(p, r, t, out),
                2 => tile_out::<F, $rm, 2>(p, r, t, out),
                3 => tile_out::<F, $rm, 3>(p, r, t, out),
                _ => tile_out::<F, $rm, 4>(p, r, t, out),
            }
        };
    }
    match rm {
        1 => by_rn!(1),
        2 => by_rn!(2),
        3 => by_rn!(3),
        _ => by_rn!(4),
    }
}

/// Walks `rows × n_tok` in tiles of `RM × RN` (smaller ones at the edges).
#[target_feature(enable = "avx2,fma,f16c")]
fn run<F: Fmt, const RM: usize, const RN: usize>(
    w: &[F::W],
    a: &[F::A],
    nb: usize,
    n_tok: usize,
    out: &mut [f32],
) {
    const { assert!(RM >= 1 && RM <= 4 && RN >= 1 && RN <= 4) };
    let rows = out.len() / n_tok;
    let mut ad = Vec::with_capacity(a.len());
    scales_to_f32(a.iter().map(F::a_d), &mut ad);
    let mut asum = Vec::new();
    if F::HAS_MIN {
        scales_to_f32(a.iter().map(F::a_s), &mut asum);
    }
    let p = Problem::<F> {
        w,
        a,
        ad: &ad,
        asum: &asum,
        nb,
        n_tok,
    };
    let mut r = 0;
    while r < rows {
        let rm = RM.min(rows - r);
        let mut t = 0;
        while t < n_tok {
            let rn = RN.min(n_tok - t);
            if rm == RM && rn == RN {
                tile_out::<F, RM, RN>(&p, r, t, out);
            } else {
                tile_dyn::<F>(&p, r, t, rm, rn, out);
            }
            t += rn;
        }
        r += rm;
    }
}

macro_rules! kernels {
    ($fmt:ty, $w:ty, $a:ty, $dot:ident, $mv:ident, $mm:ident) => {
        /// `vec_dot` (AVX2): the same per-block sequence as one pair of a tile.
        pub(crate) fn $dot(x: &[$w], y: &[$a]) -> f32 {
            assert_eq!(
                x.len(),
                y.len(),
                concat!(stringify!($dot), ": length mismatch")
            );
            let mut out = [0.0f32];
            // SAFETY: only reachable through the AVX2 table, which `dispatch` hands out after
            // `is_x86_feature_detected!` confirmed avx2, fma and f16c; shapes checked above.
            unsafe { run::<$fmt, 1, 1>(x, y, x.len(), 1, &mut out) };
            out[0]
        }

        /// Matrix-vector product (AVX2), `MV_ROWS` rows per pass.
        pub(crate) fn $mv(w: &[$w], a: &[$a], out: &mut [f32]) {
            let nb = check_matvec(w, a, out);
            if nb == 0 || out.is_empty() {
                out.fill(0.0);
                return;
            }
            // SAFETY: only reachable through the AVX2 table (avx2, fma and f16c detected at
            // runtime); `check_matvec` guarantees `w.len() == out.len() * nb`.
            unsafe { run::<$fmt, MV_ROWS, 1>(w, a, nb, 1, out) }
        }

        /// Matrix-matrix product (AVX2), tiles of `MM_ROWS × MM_TOKS`.
        pub(crate) fn $mm(w: &[$w], a: &[$a], n_tok: usize, out: &mut [f32]) {
            let (nb, rows) = check_matmul(w, a, n_tok, out);
            if nb == 0 || rows == 0 {
                out.fill(0.0);
                return;
            }
            // SAFETY: only reachable through the AVX2 table (avx2, fma and f16c detected at
            // runtime); `check_matmul` guarantees the shapes.
            unsafe { run::<$fmt, MM_ROWS, MM_TOKS>(w, a, nb, n_tok, out) }
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
