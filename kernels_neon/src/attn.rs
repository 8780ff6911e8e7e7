//! The loops that every path's attention kernels (`scores_f16`, `mix_f16`) share: how a group
//! of query heads is cut into register tiles, and how a mix walks rows and columns. Each path
//! supplies its tiles; the paths without tiles (reference, portable) go row by row through
//! their own `dot`/`axpy` here.

use crate::block::f16;
use crate::reference::check_group;
use std::ops::Range;

/// Rows in a block of a mix: every column tile goes through a block before the next block
/// starts, so the rows come from memory once however many tiles the heads' accumulators need.
const MIX_ROWS: usize = 32;

/// `scores_f16` of any path: the shapes checked, then `tile(g, q, out)` for consecutive tiles
/// of at most `most` heads (their queries, `g × hd`, and their scores, `g × n`).
#[inline(always)]
pub(crate) fn scores_groups(
    (k, stride): (&[f16], usize),
    q: &[f32],
    heads: usize,
    out: &mut [f32],
    most: usize,
    tile: impl FnMut(usize, &[f32], &mut [f32]),
) {
    let (hd, n) = check_group("scores_f16", k.len(), stride, heads, q.len(), out.len());
    if hd == 0 || n == 0 {
        out.fill(0.0);
        return;
    }
    head_tiles(heads, most, (q, hd), (out, n), tile);
}

/// `mix_f16` of any path: the shapes checked, then `tile(g, p, out)` for consecutive tiles of
/// at most `most` heads (their weights, `g × n`, and their outputs, `g × hd`).
#[inline(always)]
pub(crate) fn mix_groups(
    (v, stride): (&[f16], usize),
    p: &[f32],
    heads: usize,
    out: &mut [f32],
    most: usize,
    tile: impl FnMut(usize, &[f32], &mut [f32]),
) {
    let (hd, n) = check_group("mix_f16", v.len(), stride, heads, out.len(), p.len());
    if hd == 0 || n == 0 {
        return;
    }
    head_tiles(heads, most, (p, n), (out, hd), tile);
}

/// `tile(g, input, output)` for consecutive tiles of at most `most` of `heads` heads, each
/// head owning `a_w` values of `a` and `b_w` of `b`.
#[inline(always)]
fn head_tiles(
    heads: usize,
    most: usize,
    (a, a_w): (&[f32], usize),
    (b, b_w): (&mut [f32], usize),
    mut tile: impl FnMut(usize, &[f32], &mut [f32]),
) {
    let mut h0 = 0;
    while h0 < heads {
        let g = most.min(heads - h0);
        tile(
            g,
            &a[h0 * a_w..(h0 + g) * a_w],
            &mut b[h0 * b_w..(h0 + g) * b_w],
        );
        h0 += g;
    }
}

/// `scores_f16` one head and row at a time through a path's own `dot` (`row · q_h`): the
/// paths without register tiles (reference, portable).
#[inline(always)]
pub(crate) fn scores_by_rows(
    (k, stride): (&[f16], usize),
    q: &[f32],
    heads: usize,
    scale: f32,
    out: &mut [f32],
    dot: impl Fn(&[f16], &[f32]) -> f32,
) {
    scores_groups((k, stride), q, heads, out, 1, |_, qh, oh| {
        for (j, o) in oh.iter_mut().enumerate() {
            *o = dot(&k[j * stride..j * stride + qh.len()], qh) * scale;
        }
    });
}

/// `mix_f16` one head and row at a time through a path's own `axpy` (`out_h += p · row`), in
/// row order: the paths without register tiles (reference, portable).
#[inline(always)]
pub(crate) fn mix_by_rows(
    (v, stride): (&[f16], usize),
    p: &[f32],
    heads: usize,
    out: &mut [f32],
    axpy: impl Fn(&mut [f32], f32, &[f16]),
) {
    mix_groups((v, stride), p, heads, out, 1, |_, ph, oh| {
        let hd = oh.len();
        for (j, &pj) in ph.iter().enumerate() {
            axpy(oh, pj, &v[j * stride..j * stride + hd]);
        }
    });
}

/// A mix of `g` heads' outputs (`out`: `g × hd`) over the `n = p.len() / g` rows of `v`:
/// blocks of [`MIX_ROWS`] rows, each through `tile(rows, c0, cols, out)` on tiles of `wide`
/// columns, then of 8, then the columns left over here in scalar code (`out + p·v` fused, as
/// the SIMD paths' `axpy_f16`). Every output element sums its rows in order.
#[inline(always)]
pub(crate) fn mix_blocks(
    v: &[f16],
    stride: usize,
    p: &[f32],
    g: usize,
    out: &mut [f32],
    wide: usize,
    mut tile: impl FnMut(Range<usize>, usize, usize, &mut [f32]),
) {
    let (hd, n) = (out.len() / g, p.len() / g);
    let tiled = hd / wide * wide;
    let mut j0 = 0;
    while j0 < n {
        let rows = j0..(j0 + MIX_ROWS).min(n);
        let mut c0 = 0;
        while c0 < tiled {
            tile(rows.clone(), c0, wide, out);
            c0 += wide;
        }
        while c0 + 8 <= hd {
            tile(rows.clone(), c0, 8, out);
            c0 += 8;
        }
        for h in 0..g {
            for j in rows.clone() {
                let pj = p[h * n + j];
                for c in c0..hd {
                    let o = &mut out[h * hd + c];
                    *o = pj.mul_add(v[j * stride + c].to_f32(), *o);
                }
            }
        }
        j0 = rows.end;
    }
}
