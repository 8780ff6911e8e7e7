//! Attention over the f16 KV cache (AVX2 + FMA + F16C): the scores of a group of query heads
//! over a KV head's key rows, and their weighted sums of its value rows. The loops around the
//! register tiles are [`crate::attn`]'s, shared with the other paths.

use super::simd::{load_ph, load_ps, store_ps};
use crate::attn;
use crate::block::f16;
use std::arch::x86_64::*;

avx2_entry!(
    /// The attention scores of a group of query heads over strided f16 key rows.
    scores_f16(k: &[f16], stride: usize, q: &[f32], heads: usize, scale: f32, out: &mut [f32]) => scores_f16_body
);
avx2_entry!(
    /// A group of query heads' weighted sums of strided f16 value rows.
    mix_f16(v: &[f16], stride: usize, p: &[f32], heads: usize, out: &mut [f32]) => mix_f16_body
);

/// Query heads whose scores share the registers over one pass of the rows (the heads of a
/// group share each row's f16 → f32 conversion and its trip from memory); more heads take
/// further passes.
const HEAD_TILE: usize = 2;

/// Per head and row: one 8-lane chain of fused multiply-adds over the 8-element chunks, the
/// lanes summed `((0 + 4) + (1 + 5)) + ((2 + 6) + (3 + 7))`, the tail fused in order, then the
/// scale: the NEON path's sequence, so the scores are the same bits on x86 and ARM. The same
/// bits for a row, too, whatever the group's size or the row's place in the tiles.
///
/// Each row is its own chain, so a tile takes several rows at once: 2 heads × 4 rows, or 1
/// head × 8 rows, is 8 independent chains, what keeps both FMA ports busy (3 × 4 spilled an
/// accumulator; criterion's `scores_f16/3x64x256`: 1.7 µs against 2.4 µs, and 2.1 µs for
/// the horizontal sum per row and head this replaces); their sums come out of one transposing
/// reduction per four rows.
#[target_feature(enable = "avx2,fma,f16c")]
fn scores_f16_body(k: &[f16], stride: usize, q: &[f32], heads: usize, scale: f32, out: &mut [f32]) {
    attn::scores_groups((k, stride), q, heads, out, HEAD_TILE, |g, q, out| match g {
        2 => scores_tile::<2, 4>(k, stride, q, scale, out),
        _ => scores_tile::<1, 8>(k, stride, q, scale, out),
    });
}

/// [`scores_f16_body`] for `G` heads: each row's chunk is converted once for all of them.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn scores_tile<const G: usize, const R: usize>(
    k: &[f16],
    stride: usize,
    q: &[f32],
    scale: f32,
    out: &mut [f32],
) {
    let (hd, n) = (q.len() / G, out.len() / G);
    let qh: [(&[[f32; 8]], &[f32]); G] =
        std::array::from_fn(|h| q[h * hd..(h + 1) * hd].as_chunks::<8>());
    let mut j = 0;
    while j + R <= n {
        score_rows::<G, R>(k, stride, &qh, j, scale, n, out);
        j += R;
    }
    while R > 4 && j + 4 <= n {
        score_rows::<G, 4>(k, stride, &qh, j, scale, n, out);
        j += 4;
    }
    while j < n {
        score_rows::<G, 1>(k, stride, &qh, j, scale, n, out);
        j += 1;
    }
}

/// Rows `j0..j0 + R` of a tile of `G` heads (`qh`: each head's query as chunks and tail).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn score_rows<const G: usize, const R: usize>(
    k: &[f16],
    stride: usize,
    qh: &[(&[[f32; 8]], &[f32]); G],
    j0: usize,
    scale: f32,
    n: usize,
    out: &mut [f32],
) {
    let hd = qh[0].0.len() * 8 + qh[0].1.len();
    let rows: [(&[[f16; 8]], &[f16]); R] = std::array::from_fn(|r| {
        let at = (j0 + r) * stride;
        k[at..at + hd].as_chunks::<8>()
    });
    let mut acc = [[_mm256_setzero_ps(); R]; G];
    for c in 0..qh[0].0.len() {
        for (r, row) in rows.iter().enumerate() {
            let kv = load_ph(&row.0[c]);
            for (a, q) in acc.iter_mut().zip(qh) {
                a[r] = _mm256_fmadd_ps(kv, load_ps(&q.0[c]), a[r]);
            }
        }
    }
    let sv = _mm_set1_ps(scale);
    for (h, (a, q)) in acc.iter().zip(qh).enumerate() {
        // Up to four rows' sums at a time.
        for r0 in (0..R).step_by(4) {
            let m = (R - r0).min(4);
            let v = lane_sums(&a[r0..r0 + m]);
            let o = &mut out[h * n + j0 + r0..h * n + j0 + r0 + m];
            if q.1.is_empty() {
                store_lanes(o, _mm_mul_ps(v, sv));
            } else {
                let mut l = [0.0f32; 4];
                store_lanes(&mut l[..m], v);
                for ((o, row), sum) in o.iter_mut().zip(&rows[r0..]).zip(l) {
                    let mut sum = sum;
                    for (&x, &y) in row.1.iter().zip(q.1) {
                        sum = x.to_f32().mul_add(y, sum);
                    }
                    *o = sum * scale;
                }
            }
        }
    }
}

/// Lanes `0..R` of `v` into `o` (`R = o.len()` is 1, 2 or 4).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn store_lanes(o: &mut [f32], v: __m128) {
    let mut l = [0.0f32; 4];
    // SAFETY: `l` is 16 writable bytes; `storeu` needs no alignment.
    unsafe { _mm_storeu_ps(l.as_mut_ptr(), v) };
    let n = o.len();
    o.copy_from_slice(&l[..n]);
}

/// Each vector's 8 lanes summed `((0 + 4) + (1 + 5)) + ((2 + 6) + (3 + 7))` into lane `r` of
/// the result: the two halves added, then `hadd`s that transpose as they add (`a` holds 1, 2
/// or 4 vectors; the same adds for each, so the same bits). It is the NEON path's order (its
/// two 4-lane halves added, then `faddp` twice), so that attention's scores have the same
/// bits on both architectures.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn lane_sums(a: &[__m256]) -> __m128 {
    let half = |v: __m256| _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    match *a {
        [a0, a1, a2, a3] => _mm_hadd_ps(
            _mm_hadd_ps(half(a0), half(a1)),
            _mm_hadd_ps(half(a2), half(a3)),
        ),
        [a0, a1] => {
            let t = _mm_hadd_ps(half(a0), half(a1));
            _mm_hadd_ps(t, t)
        }
        [a0] => {
            let t = _mm_hadd_ps(half(a0), half(a0));
            _mm_hadd_ps(t, t)
        }
        _ => unreachable!("lane_sums takes 1, 2 or 4 vectors"),
    }
}

/// Per head, the output held in registers across all rows, 64 columns a pass (8
/// accumulators: eight independent chains of fused multiply-adds, which keep the FMA ports
/// busy where three heads × 16 columns, sharing each row's conversion, waited on their chains:
/// 1.75x slower in criterion's `mix_f16/3x64x256`). Per row and column `fma(p, v, out)`, as
/// `axpy_f16_body` (a store and reload of f32 is exact), so each head's bits are those of one
/// `axpy_f16` per row.
#[target_feature(enable = "avx2,fma,f16c")]
fn mix_f16_body(v: &[f16], stride: usize, p: &[f32], heads: usize, out: &mut [f32]) {
    attn::mix_groups((v, stride), p, heads, out, 1, |_, p, out| {
        attn::mix_blocks(v, stride, p, 1, out, 64, |rows, c0, cols, out| {
            if cols == 64 {
                mix_tile::<8>(v, stride, p, rows, c0, out)
            } else {
                mix_tile::<1>(v, stride, p, rows, c0, out)
            }
        })
    });
}

/// Columns `c0..c0 + 8·C` of one head's output over `rows`, accumulated in `C` registers.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn mix_tile<const C: usize>(
    v: &[f16],
    stride: usize,
    p: &[f32],
    rows: std::ops::Range<usize>,
    c0: usize,
    out: &mut [f32],
) {
    let (o, _) = out[c0..c0 + 8 * C].as_chunks_mut::<8>();
    let mut acc: [__m256; C] = std::array::from_fn(|c| load_ps(&o[c]));
    for j in rows {
        let (rc, _) = v[j * stride + c0..j * stride + c0 + 8 * C].as_chunks::<8>();
        let s = _mm256_set1_ps(p[j]);
        for (a, x) in acc.iter_mut().zip(rc) {
            *a = _mm256_fmadd_ps(s, load_ph(x), *a);
        }
    }
    for (o, a) in o.iter_mut().zip(&acc) {
        store_ps(o, *a);
    }
}
