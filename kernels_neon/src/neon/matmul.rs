//! Matrix-matrix products over a prompt batch: `out[r * n_tok + t] = dot(w[r], a[t])`.
//!
//! Base NEON and dotprod: register tiles of 4 rows × [`TOKS`] tokens ([`tile4`]); the last
//! tokens of a row group go one by one, the last rows (fewer than 4) through [`tile1`].
//!
//! i8mm: `smmla` multiplies a 2×8 block of two weight rows by a 2×8 block of two tokens into a
//! 2×2 tile of exact i32 sums; four of them cover a block. Odd rows or tokens are padded by
//! repeating the last one (the duplicate lanes compute the very same values).
//!
//! Every tile computes each (row, token) pair in the pair form described in `dot.rs`, so a
//! pair's bits never depend on the tile it fell in, hence not on the range of rows a caller
//! passes.

use super::dot::{ActBlock, Dotprod, IDot, Neon, WeightBlock, tile1, tile4};
use crate::reference::check_matmul;
use core::arch::aarch64::*;
use core::arch::asm;

/// Tokens per tile of the NEON/dotprod matrix products.
const TOKS: usize = 4;

/// Rows `r..r + 4`, tokens `t..t + T`.
///
/// # Safety
/// The CPU supports `I`.
#[inline(always)]
unsafe fn run_tile4<W: WeightBlock, I: IDot, const T: usize>(
    w: &[W],
    a: &[W::Act],
    nb: usize,
    n_tok: usize,
    out: &mut [f32],
    r: usize,
    t: usize,
) {
    // SAFETY: the CPU supports `I` (this function's contract).
    let v = unsafe { tile4::<W, I, T>(&w[r * nb..(r + 4) * nb], &a[t * nb..(t + T) * nb], nb) };
    for (j, v) in v.into_iter().enumerate() {
        let mut lanes = [0.0f32; 4];
        // SAFETY: `lanes` is valid for 4 writable f32.
        unsafe { vst1q_f32(lanes.as_mut_ptr(), v) };
        for (i, x) in lanes.into_iter().enumerate() {
            out[(r + i) * n_tok + t + j] = x;
        }
    }
}

/// Row `r`, tokens `t..t + T`.
///
/// # Safety
/// The CPU supports `I`.
#[inline(always)]
unsafe fn run_tile1<W: WeightBlock, I: IDot, const T: usize>(
    w: &[W],
    a: &[W::Act],
    nb: usize,
    n_tok: usize,
    out: &mut [f32],
    r: usize,
    t: usize,
) {
    // SAFETY: the CPU supports `I` (this function's contract).
    let v = unsafe { tile1::<W, I, T>(&w[r * nb..(r + 1) * nb], &a[t * nb..(t + T) * nb], nb) };
    out[r * n_tok + t..][..T].copy_from_slice(&v);
}

/// # Safety
/// The CPU supports `I`; the shapes passed [`check_matmul`], giving `nb` and `rows`.
#[inline(always)]
unsafe fn matmul_impl<W: WeightBlock, I: IDot>(
    w: &[W],
    a: &[W::Act],
    nb: usize,
    rows: usize,
    n_tok: usize,
    out: &mut [f32],
) {
    let mut r = 0;
    // SAFETY (all calls): the CPU supports `I` (this function's contract).
    while r + 4 <= rows {
        let mut t = 0;
        while t + TOKS <= n_tok {
            unsafe { run_tile4::<W, I, TOKS>(w, a, nb, n_tok, out, r, t) };
            t += TOKS;
        }
        while t < n_tok {
            unsafe { run_tile4::<W, I, 1>(w, a, nb, n_tok, out, r, t) };
            t += 1;
        }
        r += 4;
    }
    while r < rows {
        let mut t = 0;
        while t + TOKS <= n_tok {
            unsafe { run_tile1::<W, I, TOKS>(w, a, nb, n_tok, out, r, t) };
            t += TOKS;
        }
        while t < n_tok {
            unsafe { run_tile1::<W, I, 1>(w, a, nb, n_tok, out, r, t) };
            t += 1;
        }
        r += 1;
    }
}

/// Matrix-matrix product on base NEON.
pub(crate) fn matmul_neon<W: WeightBlock>(w: &[W], a: &[W::Act], n_tok: usize, out: &mut [f32]) {
    let (nb, rows) = check_matmul(w, a, n_tok, out);
    // SAFETY: `Neon` needs nothing beyond the aarch64 baseline; shapes checked above.
    unsafe { matmul_impl::<W, Neon>(w, a, nb, rows, n_tok, out) }
}

#[target_feature(enable = "dotprod")]
fn matmul_dotprod_body<W: WeightBlock>(
    w: &[W],
    a: &[W::Act],
    nb: usize,
    rows: usize,
    n_tok: usize,
    out: &mut [f32],
) {
    // SAFETY: only entered on a CPU with dotprod (this function's `target_feature`); the
    // caller checked the shapes.
    unsafe { matmul_impl::<W, Dotprod>(w, a, nb, rows, n_tok, out) }
}

/// Matrix-matrix product with `sdot`. Only reachable through the DOTPROD table.
pub(crate) fn matmul_dotprod<W: WeightBlock>(w: &[W], a: &[W::Act], n_tok: usize, out: &mut [f32]) {
    let (nb, rows) = check_matmul(w, a, n_tok, out);
    // SAFETY: this function is only referenced by the DOTPROD table, which
    // `Kernels::for_path` hands out only after runtime detection of dotprod.
    unsafe { matmul_dotprod_body(w, a, nb, rows, n_tok, out) }
}

// ---------------------------------------------------------------------------------------
// i8mm

/// Row pairs per i8mm tile.
const ROW_PAIRS: usize = 2;
/// Token pairs per i8mm tile.
const TOK_PAIRS: usize = 2;

/// `acc += a · bᵀ` for a (2×8) and b (2×8) i8 matrices (row-major), acc a 2×2 i32 matrix.
#[target_feature(enable = "neon,i8mm")]
#[inline]
fn smmla(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    let mut acc = acc;
    // SAFETY: registers only; this function is compiled for i8mm, and calling it requires the
    // caller to vouch for the CPU feature (it is a `#[target_feature]` function).
    unsafe {
        asm!("smmla {acc:v}.4s, {a:v}.16b, {b:v}.16b", acc = inout(vreg) acc, a = in(vreg) a,
             b = in(vreg) b, options(pure, nomem, nostack, preserves_flags));
    }
    acc
}

/// Interleaves two blocks' 32 values by 8: `[p[0..8] q[0..8]] [p[8..16] q[8..16]] …`, the
/// operand layout of `smmla`.
#[inline(always)]
fn pair_by_8(p: [int8x16_t; 2], q: [int8x16_t; 2]) -> [int8x16_t; 4] {
    // SAFETY: baseline NEON register intrinsics.
    let z = |p: int8x16_t, q: int8x16_t| unsafe {
        let (p, q) = (vreinterpretq_s64_s8(p), vreinterpretq_s64_s8(q));
        [
            vreinterpretq_s8_s64(vzip1q_s64(p, q)),
            vreinterpretq_s8_s64(vzip2q_s64(p, q)),
        ]
    };
    let [a0, a1] = z(p[0], q[0]);
    let [a2, a3] = z(p[1], q[1]);
    [a0, a1, a2, a3]
}

/// `RP` row pairs × `TP` token pairs with `smmla`. `rows[i]`/`toks[j]` are row/token indices
/// (a pair may repeat an index); returns per tile the lanes `[r0t0, r0t1, r1t0, r1t1]`.
#[target_feature(enable = "neon,i8mm")]
#[inline]
fn tile_i8mm<W: WeightBlock, const RP: usize, const TP: usize>(
    w: &[W],
    a: &[W::Act],
    nb: usize,
    rows: [[usize; 2]; RP],
    toks: [[usize; 2]; TP],
) -> [[float32x4_t; TP]; RP] {
    assert!(
        rows.as_flattened().iter().all(|&r| (r + 1) * nb <= w.len()),
        "matmul tile: rows"
    );
    assert!(
        toks.as_flattened().iter().all(|&t| (t + 1) * nb <= a.len()),
        "matmul tile: tokens"
    );
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let mut acc = [[vdupq_n_f32(0.0); TP]; RP];
    let mut msum = [[vdupq_n_f32(0.0); TP]; RP];
    for b in 0..nb {
        // SAFETY: `r * nb + b < (r + 1) * nb <= w.len()` (asserted above).
        let wb = rows.map(|[r0, r1]| unsafe { [&*wp.add(r0 * nb + b), &*wp.add(r1 * nb + b)] });
        // SAFETY: `t * nb + b < (t + 1) * nb <= a.len()` (asserted above).
        let ab = toks.map(|[t0, t1]| unsafe { [&*ap.add(t0 * nb + b), &*ap.add(t1 * nb + b)] });
        let x = wb.map(|[p, q]| pair_by_8(p.qs(), q.qs()));
        let y = ab.map(|[p, q]| pair_by_8(p.qs(), q.qs()));
        // Row scales by lane: [d0 d0 d1 d1]; token scales: [d0 d1 d0 d1].
        let dw = wb.map(|[p, q]| vcombine_f32(vdup_n_f32(p.d()), vdup_n_f32(q.d())));
        let da = ab.map(|[p, q]| {
            let v = vset_lane_f32::<1>(q.d(), vdup_n_f32(p.d()));
            vcombine_f32(v, v)
        });
        let mw = wb.map(|[p, q]| {
            if W::HAS_MIN {
                vcombine_f32(vdup_n_f32(p.m()), vdup_n_f32(q.m()))
            } else {
                vdupq_n_f32(0.0)
            }
        });
        let sa = ab.map(|[p, q]| {
            if W::HAS_MIN {
                let v = vset_lane_f32::<1>(q.s(), vdup_n_f32(p.s()));
                vcombine_f32(v, v)
            } else {
                vdupq_n_f32(0.0)
            }
        });
        for i in 0..RP {
            for j in 0..TP {
                let mut s = vdupq_n_s32(0);
                for k in 0..4 {
                    s = smmla(s, x[i][k], y[j][k]);
                }
                acc[i][j] = vfmaq_f32(acc[i][j], vcvtq_f32_s32(s), vmulq_f32(dw[i], da[j]));
                if W::HAS_MIN {
                    msum[i][j] = vfmaq_f32(msum[i][j], mw[i], sa[j]);
                }
            }
        }
    }
    if W::HAS_MIN {
        core::array::from_fn(|i| core::array::from_fn(|j| vaddq_f32(acc[i][j], msum[i][j])))
    } else {
        acc
    }
}

/// Runs an i8mm tile and stores its lanes (duplicated rows/tokens store the same value twice).
#[target_feature(enable = "neon,i8mm")]
#[inline]
fn run_tile_i8mm<W: WeightBlock, const RP: usize, const TP: usize>(
    w: &[W],
    a: &[W::Act],
    nb: usize,
    n_tok: usize,
    out: &mut [f32],
    rows: [[usize; 2]; RP],
    toks: [[usize; 2]; TP],
) {
    let v = tile_i8mm::<W, RP, TP>(w, a, nb, rows, toks);
    for (i, [r0, r1]) in rows.into_iter().enumerate() {
        for (j, [t0, t1]) in toks.into_iter().enumerate() {
            let mut lanes = [0.0f32; 4];
            // SAFETY: `lanes` is valid for 4 writable f32.
            unsafe { vst1q_f32(lanes.as_mut_ptr(), v[i][j]) };
            out[r0 * n_tok + t0] = lanes[0];
            out[r0 * n_tok + t1] = lanes[1];
            out[r1 * n_tok + t0] = lanes[2];
            out[r1 * n_tok + t1] = lanes[3];
        }
    }
}

/// All tokens of the given row pairs.
#[target_feature(enable = "neon,i8mm")]
#[inline]
fn row_group_i8mm<W: WeightBlock, const RP: usize>(
    w: &[W],
    a: &[W::Act],
    nb: usize,
    n_tok: usize,
    out: &mut [f32],
    rows: [[usize; 2]; RP],
) {
    let mut t = 0;
    while t + 2 * TOK_PAIRS <= n_tok {
        let toks = core::array::from_fn(|j| [t + 2 * j, t + 2 * j + 1]);
        run_tile_i8mm::<W, RP, TOK_PAIRS>(w, a, nb, n_tok, out, rows, toks);
        t += 2 * TOK_PAIRS;
    }
    while t < n_tok {
        let t1 = (t + 1).min(n_tok - 1);
        run_tile_i8mm::<W, RP, 1>(w, a, nb, n_tok, out, rows, [[t, t1]]);
        t += 2;
    }
}

#[target_feature(enable = "neon,i8mm")]
fn matmul_i8mm_body<W: WeightBlock>(
    w: &[W],
    a: &[W::Act],
    nb: usize,
    rows: usize,
    n_tok: usize,
    out: &mut [f32],
) {
    let mut r = 0;
    while r + 2 * ROW_PAIRS <= rows {
        let rp = core::array::from_fn(|i| [r + 2 * i, r + 2 * i + 1]);
        row_group_i8mm::<W, ROW_PAIRS>(w, a, nb, n_tok, out, rp);
        r += 2 * ROW_PAIRS;
    }
    while r < rows {
        let r1 = (r + 1).min(rows - 1);
        row_group_i8mm::<W, 1>(w, a, nb, n_tok, out, [[r, r1]]);
        r += 2;
    }
}

/// Matrix-matrix product with `smmla`. Only reachable through the I8MM table.
pub(crate) fn matmul_i8mm<W: WeightBlock>(w: &[W], a: &[W::Act], n_tok: usize, out: &mut [f32]) {
    let (nb, rows) = check_matmul(w, a, n_tok, out);
    // SAFETY: this function is only referenced by the I8MM table, which `Kernels::for_path`
    // hands out only after runtime detection of i8mm (and dotprod).
    unsafe { matmul_i8mm_body(w, a, nb, rows, n_tok, out) }
}
