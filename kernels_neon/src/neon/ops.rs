//! f32 operations of the forward pass and the f16 KV-cache helpers, on base NEON.
//!
//! Where the reference's arithmetic is elementwise (`add`, `scale`, `axpy_f32`, the rotations,
//! the final products of `rms_norm`/`softmax`), the same operations are done in the same order
//! (no fusing), so the results are bit-identical. `axpy_f16`, the step of attention's mix, is
//! fused (as on x86: one instruction, a shorter chain). Sums use several accumulators; `exp` is
//! a vectorised Cephes-style polynomial (about 1 ulp), well inside the stated tolerance.

use super::fp16::{f2h, f2h_x8, h2f, h2f_hi, h2f_lo, load_h8, store_h8};
use crate::attn;
use crate::block::f16;
use crate::reference::{GELU_2C0, GELU_2C1, check_rope};
use core::arch::aarch64::*;

#[inline(always)]
fn ld(x: &[f32; 4]) -> float32x4_t {
    // SAFETY: the reference is valid for 4 readable f32; `ld1` needs element alignment only.
    unsafe { vld1q_f32(x.as_ptr()) }
}

#[inline(always)]
fn st(x: &mut [f32; 4], v: float32x4_t) {
    // SAFETY: the reference is valid for 4 writable f32.
    unsafe { vst1q_f32(x.as_mut_ptr(), v) }
}

/// `e^x` on four lanes: `2^n e^r` with `n = round(x log2 e)`, `|r| <= ln2 / 2`, Cephes'
/// `expf` polynomial. Overflows to +inf, underflows gradually to 0; NaN stays NaN.
#[inline(always)]
fn exp_x4(x: float32x4_t) -> float32x4_t {
    // SAFETY: NEON register intrinsics (NEON is part of the aarch64 baseline).
    unsafe {
        // Clamp (NaN propagates through fmax/fmin): keeps n in [-150, 129].
        let x = vminq_f32(vmaxq_f32(x, vdupq_n_f32(-104.0)), vdupq_n_f32(89.0));
        let n = vrndnq_f32(vmulq_n_f32(x, core::f32::consts::LOG2_E));
        let r = vfmaq_n_f32(x, n, -0.693_359_4);
        let r = vfmaq_n_f32(r, n, 2.121_944_4e-4);
        let mut p = vdupq_n_f32(1.987_569_1e-4);
        for c in [
            1.398_199_9e-3,
            8.333_452e-3,
            4.166_579_6e-2,
            0.166_666_65,
            0.500_000_01,
        ] {
            p = vfmaq_f32(vdupq_n_f32(c), p, r);
        }
        let y = vaddq_f32(vfmaq_f32(r, p, vmulq_f32(r, r)), vdupq_n_f32(1.0));
        // 2^n as two normal powers of two, 2^n1 2^n2 with n1, n2 in [-75, 65].
        let ni = vcvtq_s32_f32(n);
        let n1 = vshrq_n_s32::<1>(ni);
        let n2 = vsubq_s32(ni, n1);
        let pow2 =
            |k: int32x4_t| vreinterpretq_f32_s32(vshlq_n_s32::<23>(vaddq_s32(k, vdupq_n_s32(127))));
        vmulq_f32(vmulq_f32(y, pow2(n1)), pow2(n2))
    }
}

/// `out = x / sqrt(mean(x²) + eps) * w`; the sum of squares in f64 as the reference.
pub(crate) fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    assert!(
        x.len() == w.len() && x.len() == out.len(),
        "rms_norm: length mismatch"
    );
    if x.is_empty() {
        return;
    }
    let (xc, xt) = x.as_chunks::<4>();
    let (wc, wt) = w.as_chunks::<4>();
    let (oc, ot) = out.as_chunks_mut::<4>();
    // SAFETY: NEON register intrinsics (NEON is part of the aarch64 baseline); memory is
    // accessed through `ld`/`st` on references only.
    unsafe {
        let mut acc = [vdupq_n_f64(0.0); 2];
        for c in xc {
            let v = ld(c);
            let sq = vmulq_f32(v, v);
            acc[0] = vaddq_f64(acc[0], vcvt_f64_f32(vget_low_f32(sq)));
            acc[1] = vaddq_f64(acc[1], vcvt_high_f64_f32(sq));
        }
        let mut sum = vaddvq_f64(vaddq_f64(acc[0], acc[1]));
        for &v in xt {
            sum += (v * v) as f64;
        }
        let mean = (sum / x.len() as f64) as f32;
        let scale = 1.0 / (mean + eps).sqrt();
        for ((o, xv), wv) in oc.iter_mut().zip(xc).zip(wc) {
            st(o, vmulq_f32(vmulq_n_f32(ld(xv), scale), ld(wv)));
        }
        for ((o, &v), &g) in ot.iter_mut().zip(xt).zip(wt) {
            *o = (v * scale) * g;
        }
    }
}

/// In-place softmax; the sum in f64 as the reference.
pub(crate) fn softmax(x: &mut [f32]) {
    if x.is_empty() {
        return;
    }
    let (xc, xt) = x.as_chunks_mut::<4>();
    // SAFETY: NEON register intrinsics (NEON is part of the aarch64 baseline); memory is
    // accessed through `ld`/`st` on references only.
    unsafe {
        let mut mv = vdupq_n_f32(f32::NEG_INFINITY);
        for c in xc.iter() {
            mv = vmaxnmq_f32(mv, ld(c));
        }
        let max = xt.iter().fold(vmaxnmvq_f32(mv), |m, &v| m.max(v));
        let mut acc = [vdupq_n_f64(0.0); 2];
        for c in xc.iter_mut() {
            let e = exp_x4(vsubq_f32(ld(c), vdupq_n_f32(max)));
            st(c, e);
            acc[0] = vaddq_f64(acc[0], vcvt_f64_f32(vget_low_f32(e)));
            acc[1] = vaddq_f64(acc[1], vcvt_high_f64_f32(e));
        }
        let mut sum = vaddvq_f64(vaddq_f64(acc[0], acc[1]));
        if !xt.is_empty() {
            let mut t = [f32::NEG_INFINITY; 4];
            t[..xt.len()].copy_from_slice(xt);
            let e = exp_x4(vsubq_f32(ld(&t), vdupq_n_f32(max)));
            st(&mut t, e);
            for (v, &e) in xt.iter_mut().zip(&t) {
                *v = e;
                sum += e as f64;
            }
        }
        let inv = (1.0 / sum) as f32;
        for c in xc.iter_mut() {
            st(c, vmulq_n_f32(ld(c), inv));
        }
        for v in xt.iter_mut() {
            *v *= inv;
        }
    }
}

/// `silu(g) * u` on four lanes, in the reference's order: `g / (1 + exp(-g)) * u`.
#[inline(always)]
fn silu_x4(g: float32x4_t, u: float32x4_t) -> float32x4_t {
    // SAFETY: NEON register intrinsics (NEON is part of the aarch64 baseline).
    unsafe {
        let den = vaddq_f32(vdupq_n_f32(1.0), exp_x4(vnegq_f32(g)));
        vmulq_f32(vdivq_f32(g, den), u)
    }
}

/// SwiGLU: `out = gate / (1 + exp(-gate)) * up`.
pub(crate) fn silu_mul(gate: &[f32], up: &[f32], out: &mut [f32]) {
    glu(gate, up, out, silu_x4);
}

/// `gelu_tanh(g) * u` on four lanes in the reference's order, unfused (see
/// `reference::gelu_mul_ref`).
#[inline(always)]
fn gelu_x4(g: float32x4_t, u: float32x4_t) -> float32x4_t {
    // SAFETY: NEON register intrinsics (NEON is part of the aarch64 baseline).
    unsafe {
        let c = vaddq_f32(
            vdupq_n_f32(GELU_2C0),
            vmulq_f32(vdupq_n_f32(GELU_2C1), vmulq_f32(g, g)),
        );
        let neg_t = vnegq_f32(vmulq_f32(g, c));
        let den = vaddq_f32(vdupq_n_f32(1.0), exp_x4(neg_t));
        vmulq_f32(vdivq_f32(g, den), u)
    }
}

/// GeGLU: `out = gelu_tanh(gate) * up`.
pub(crate) fn gelu_mul(gate: &[f32], up: &[f32], out: &mut [f32]) {
    glu(gate, up, out, gelu_x4);
}

/// A gated linear unit, four lanes at a time.
#[inline(always)]
fn glu(gate: &[f32], up: &[f32], out: &mut [f32], f: fn(float32x4_t, float32x4_t) -> float32x4_t) {
    assert!(
        gate.len() == up.len() && gate.len() == out.len(),
        "glu: length mismatch"
    );
    let (gc, gt) = gate.as_chunks::<4>();
    let (uc, ut) = up.as_chunks::<4>();
    let (oc, ot) = out.as_chunks_mut::<4>();
    for ((o, g), u) in oc.iter_mut().zip(gc).zip(uc) {
        st(o, f(ld(g), ld(u)));
    }
    if !gt.is_empty() {
        let (mut g, mut u, mut o) = ([0.0f32; 4], [0.0f32; 4], [0.0f32; 4]);
        g[..gt.len()].copy_from_slice(gt);
        u[..ut.len()].copy_from_slice(ut);
        st(&mut o, f(ld(&g), ld(&u)));
        ot.copy_from_slice(&o[..ot.len()]);
    }
}

/// `(x0, x1) <- (x0 c - x1 s, x0 s + x1 c)` on four pairs, unfused as the reference.
#[inline(always)]
fn rotate(
    x0: float32x4_t,
    x1: float32x4_t,
    c: float32x4_t,
    s: float32x4_t,
) -> (float32x4_t, float32x4_t) {
    // SAFETY: NEON register intrinsics (NEON is part of the aarch64 baseline).
    unsafe {
        (
            vsubq_f32(vmulq_f32(x0, c), vmulq_f32(x1, s)),
            vaddq_f32(vmulq_f32(x0, s), vmulq_f32(x1, c)),
        )
    }
}

/// Loads 4 pairs `(a, b)` de-interleaved: `([a0 a1 a2 a3], [b0 b1 b2 b3])`.
#[inline(always)]
fn ld2(x: &[f32; 8]) -> (float32x4_t, float32x4_t) {
    // SAFETY: the reference is valid for 8 readable f32; `ld2` needs element alignment only.
    let v = unsafe { vld2q_f32(x.as_ptr()) };
    (v.0, v.1)
}

/// Stores 4 pairs, interleaving `a` and `b`.
#[inline(always)]
fn st2(x: &mut [f32; 8], a: float32x4_t, b: float32x4_t) {
    // SAFETY: the reference is valid for 8 writable f32; `st2` needs element alignment only.
    unsafe { vst2q_f32(x.as_mut_ptr(), float32x4x2_t(a, b)) }
}

/// RoPE, normal mode: rotates adjacent pairs of each head.
pub(crate) fn rope_norm(x: &mut [f32], head_dim: usize, cs: &[f32]) {
    check_rope(x, head_dim, cs);
    let pairs = (head_dim / 2).min(cs.len() / 2);
    let cs = &cs[..2 * pairs];
    for head in x.chunks_exact_mut(head_dim) {
        let head = &mut head[..2 * pairs];
        let (hc, ht) = head.as_chunks_mut::<8>();
        let (cc, ct) = cs.as_chunks::<8>();
        for (h, c) in hc.iter_mut().zip(cc) {
            let (x0, x1) = ld2(h);
            let (c, s) = ld2(c);
            let (a, b) = rotate(x0, x1, c, s);
            st2(h, a, b);
        }
        for (pair, c) in ht.chunks_exact_mut(2).zip(ct.chunks_exact(2)) {
            let (x0, x1) = (pair[0], pair[1]);
            pair[0] = x0 * c[0] - x1 * c[1];
            pair[1] = x0 * c[1] + x1 * c[0];
        }
    }
}

/// Rotates `(lo[i], hi[i])` by `(cs[2i], cs[2i + 1])` for every `i < lo.len()`.
fn rotate_halves(lo: &mut [f32], hi: &mut [f32], cs: &[f32]) {
    assert!(
        hi.len() == lo.len() && cs.len() == 2 * lo.len(),
        "rope: halves"
    );
    let (lc, lt) = lo.as_chunks_mut::<4>();
    let (hc, ht) = hi.as_chunks_mut::<4>();
    let (cc, ct) = cs.as_chunks::<8>();
    for ((l, h), c) in lc.iter_mut().zip(hc.iter_mut()).zip(cc) {
        let (c, s) = ld2(c);
        let (a, b) = rotate(ld(l), ld(h), c, s);
        st(l, a);
        st(h, b);
    }
    for ((l, h), c) in lt.iter_mut().zip(ht.iter_mut()).zip(ct.chunks_exact(2)) {
        let (x0, x1) = (*l, *h);
        *l = x0 * c[0] - x1 * c[1];
        *h = x0 * c[1] + x1 * c[0];
    }
}

/// RoPE, neox mode: rotates `(x[i], x[i + half])` for `i < half = cs.len() / 2`; the pairs are
/// independent, so one vector pass over the two halves does it.
pub(crate) fn rope_neox(x: &mut [f32], head_dim: usize, cs: &[f32]) {
    check_rope(x, head_dim, cs);
    let half = cs.len() / 2;
    if half == 0 {
        return;
    }
    for head in x.chunks_exact_mut(head_dim) {
        let (lo, rest) = head.split_at_mut(half);
        rotate_halves(lo, &mut rest[..half], cs);
    }
}

/// `x += y`.
pub(crate) fn add(x: &mut [f32], y: &[f32]) {
    assert_eq!(x.len(), y.len(), "add: length mismatch");
    let (xc, xt) = x.as_chunks_mut::<4>();
    let (yc, yt) = y.as_chunks::<4>();
    for (a, b) in xc.iter_mut().zip(yc) {
        // SAFETY: NEON register intrinsic (NEON is part of the aarch64 baseline).
        st(a, unsafe { vaddq_f32(ld(a), ld(b)) });
    }
    for (a, &b) in xt.iter_mut().zip(yt) {
        *a += b;
    }
}

/// `x *= s`.
pub(crate) fn scale(x: &mut [f32], s: f32) {
    let (xc, xt) = x.as_chunks_mut::<4>();
    for a in xc.iter_mut() {
        // SAFETY: NEON register intrinsic (NEON is part of the aarch64 baseline).
        st(a, unsafe { vmulq_n_f32(ld(a), s) });
    }
    for a in xt.iter_mut() {
        *a *= s;
    }
}

/// `sum(a * b)`, four accumulators.
pub(crate) fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "dot_f32: length mismatch");
    let (ac, at) = a.as_chunks::<16>();
    let (bc, bt) = b.as_chunks::<16>();
    // SAFETY: NEON register intrinsics (NEON is part of the aarch64 baseline); memory is
    // accessed through `ld` on references only.
    let mut sum = unsafe {
        let mut acc = [vdupq_n_f32(0.0); 4];
        for (x, y) in ac.iter().zip(bc) {
            let (x, _) = x.as_chunks::<4>();
            let (y, _) = y.as_chunks::<4>();
            for k in 0..4 {
                acc[k] = vfmaq_f32(acc[k], ld(&x[k]), ld(&y[k]));
            }
        }
        vaddvq_f32(vaddq_f32(
            vaddq_f32(acc[0], acc[1]),
            vaddq_f32(acc[2], acc[3]),
        ))
    };
    for (&x, &y) in at.iter().zip(bt) {
        sum = x.mul_add(y, sum);
    }
    sum
}

/// `y += s * x`.
pub(crate) fn axpy_f32(y: &mut [f32], s: f32, x: &[f32]) {
    assert_eq!(x.len(), y.len(), "axpy_f32: length mismatch");
    let (yc, yt) = y.as_chunks_mut::<4>();
    let (xc, xt) = x.as_chunks::<4>();
    for (o, v) in yc.iter_mut().zip(xc) {
        // SAFETY: NEON register intrinsics (NEON is part of the aarch64 baseline).
        st(o, unsafe { vaddq_f32(ld(o), vmulq_n_f32(ld(v), s)) });
    }
    for (o, &v) in yt.iter_mut().zip(xt) {
        *o += s * v;
    }
}

/// `sum(a * b)` with `a` in f16, two accumulators.
#[inline]
pub(crate) fn dot_f16(a: &[f16], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "dot_f16: length mismatch");
    let (ac, at) = a.as_chunks::<8>();
    let (bc, bt) = b.as_chunks::<8>();
    // SAFETY: NEON register intrinsics (NEON is part of the aarch64 baseline); memory is
    // accessed through `ld`/`load_h8` on references only.
    let mut sum = unsafe {
        let mut acc = [vdupq_n_f32(0.0); 2];
        for (h, y) in ac.iter().zip(bc) {
            let h = load_h8(h);
            let (y, _) = y.as_chunks::<4>();
            acc[0] = vfmaq_f32(acc[0], h2f_lo(h), ld(&y[0]));
            acc[1] = vfmaq_f32(acc[1], h2f_hi(h), ld(&y[1]));
        }
        vaddvq_f32(vaddq_f32(acc[0], acc[1]))
    };
    for (&h, &y) in at.iter().zip(bt) {
        sum = h2f(h).mul_add(y, sum);
    }
    sum
}

/// `y += s * x` with `x` in f16, fused (one rounding per element, as the x86 paths).
pub(crate) fn axpy_f16(y: &mut [f32], s: f32, x: &[f16]) {
    assert_eq!(x.len(), y.len(), "axpy_f16: length mismatch");
    let (yc, yt) = y.as_chunks_mut::<8>();
    let (xc, xt) = x.as_chunks::<8>();
    for (o, h) in yc.iter_mut().zip(xc) {
        let h = load_h8(h);
        let (o, _) = o.as_chunks_mut::<4>();
        // SAFETY: NEON register intrinsics (NEON is part of the aarch64 baseline).
        unsafe {
            let (y0, y1) = (ld(&o[0]), ld(&o[1]));
            st(&mut o[0], vfmaq_n_f32(y0, h2f_lo(h), s));
            st(&mut o[1], vfmaq_n_f32(y1, h2f_hi(h), s));
        }
    }
    for (o, &h) in yt.iter_mut().zip(xt) {
        *o = s.mul_add(h2f(h), *o);
    }
}

/// Query heads whose accumulators share the registers over one pass of the rows (the heads of
/// a group share each row's f16 → f32 conversion and its trip from memory).
const HEAD_TILE: usize = 4;

/// A group's attention scores: per head and row, `dot_f16`'s sequence (two accumulators over
/// the 8-element chunks, then the tail fused in order).
pub(crate) fn scores_f16(
    k: &[f16],
    stride: usize,
    q: &[f32],
    heads: usize,
    scale: f32,
    out: &mut [f32],
) {
    attn::scores_groups((k, stride), q, heads, out, HEAD_TILE, |g, q, out| match g {
        4 => scores_tile::<4>(k, stride, q, scale, out),
        3 => scores_tile::<3>(k, stride, q, scale, out),
        2 => scores_tile::<2>(k, stride, q, scale, out),
        _ => scores_tile::<1>(k, stride, q, scale, out),
    });
}

/// [`scores_f16`] for `G` heads at once: each row's chunk is converted once for all.
#[inline(always)]
fn scores_tile<const G: usize>(k: &[f16], stride: usize, q: &[f32], scale: f32, out: &mut [f32]) {
    let (hd, n) = (q.len() / G, out.len() / G);
    let qh: [(&[[f32; 8]], &[f32]); G] =
        core::array::from_fn(|h| q[h * hd..(h + 1) * hd].as_chunks::<8>());
    for j in 0..n {
        let row = &k[j * stride..j * stride + hd];
        let (rc, rt) = row.as_chunks::<8>();
        // SAFETY: NEON register intrinsics (NEON is part of the aarch64 baseline); memory is
        // accessed through `ld`/`load_h8` on references only.
        unsafe {
            let mut acc = [[vdupq_n_f32(0.0); 2]; G];
            for (c, x) in rc.iter().enumerate() {
                let x = load_h8(x);
                let (lo, hi) = (h2f_lo(x), h2f_hi(x));
                for (a, (qc, _)) in acc.iter_mut().zip(&qh) {
                    let (y, _) = qc[c].as_chunks::<4>();
                    a[0] = vfmaq_f32(a[0], lo, ld(&y[0]));
                    a[1] = vfmaq_f32(a[1], hi, ld(&y[1]));
                }
            }
            for (h, (a, (_, qt))) in acc.iter().zip(&qh).enumerate() {
                let mut sum = vaddvq_f32(vaddq_f32(a[0], a[1]));
                for (&x, &y) in rt.iter().zip(*qt) {
                    sum = h2f(x).mul_add(y, sum);
                }
                out[h * n + j] = sum * scale;
            }
        }
    }
}

/// Per head, the output held in registers across all rows, `8·C` columns a pass: per row and
/// column `fma(p, v, out)` as `axpy_f16` (a store and reload of f32 is exact), so each head's
/// bits are those of one `axpy_f16` per row.
pub(crate) fn mix_f16(v: &[f16], stride: usize, p: &[f32], heads: usize, out: &mut [f32]) {
    attn::mix_groups((v, stride), p, heads, out, HEAD_TILE, |g, p, out| match g {
        4 => mix_heads::<4, 2>(v, stride, p, out),
        3 => mix_heads::<3, 2>(v, stride, p, out),
        2 => mix_heads::<2, 4>(v, stride, p, out),
        _ => mix_heads::<1, 8>(v, stride, p, out),
    });
}

/// [`mix_f16`] for `G` heads, on tiles of `8·C` columns then of 8 ([`attn::mix_blocks`]).
#[inline(always)]
fn mix_heads<const G: usize, const C: usize>(v: &[f16], stride: usize, p: &[f32], out: &mut [f32]) {
    let (hd, n) = (out.len() / G, p.len() / G);
    attn::mix_blocks(v, stride, p, G, out, 8 * C, |rows, c0, cols, out| {
        if cols == 8 * C {
            mix_tile::<G, C>(v, stride, p, n, rows, c0, hd, out)
        } else {
            mix_tile::<G, 1>(v, stride, p, n, rows, c0, hd, out)
        }
    });
}

/// Columns `c0..c0 + 8·C` of `G` heads' outputs over `rows`, accumulated in `2·G·C`
/// registers.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn mix_tile<const G: usize, const C: usize>(
    v: &[f16],
    stride: usize,
    p: &[f32],
    n: usize,
    rows: core::ops::Range<usize>,
    c0: usize,
    hd: usize,
    out: &mut [f32],
) {
    // SAFETY: NEON register intrinsics (NEON is part of the aarch64 baseline); memory is
    // accessed through `ld`/`st`/`load_h8` on references only.
    unsafe {
        let mut acc = [[[vdupq_n_f32(0.0); 2]; C]; G];
        for (h, a) in acc.iter_mut().enumerate() {
            let (o, _) = out[h * hd + c0..h * hd + c0 + 8 * C].as_chunks::<4>();
            for (c, a) in a.iter_mut().enumerate() {
                *a = [ld(&o[2 * c]), ld(&o[2 * c + 1])];
            }
        }
        let ps: [&[f32]; G] = core::array::from_fn(|h| &p[h * n + rows.start..h * n + rows.end]);
        for (i, j) in rows.enumerate() {
            let row = &v[j * stride + c0..j * stride + c0 + 8 * C];
            let (rc, _) = row.as_chunks::<8>();
            for (c, x) in rc.iter().enumerate() {
                let x = load_h8(x);
                let (lo, hi) = (h2f_lo(x), h2f_hi(x));
                for (a, ph) in acc.iter_mut().zip(&ps) {
                    a[c][0] = vfmaq_n_f32(a[c][0], lo, ph[i]);
                    a[c][1] = vfmaq_n_f32(a[c][1], hi, ph[i]);
                }
            }
        }
        for (h, a) in acc.iter().enumerate() {
            let (o, _) = out[h * hd + c0..h * hd + c0 + 8 * C].as_chunks_mut::<4>();
            for (c, a) in a.iter().enumerate() {
                st(&mut o[2 * c], a[0]);
                st(&mut o[2 * c + 1], a[1]);
            }
        }
    }
}

/// f16 → f32, exact.
pub(crate) fn f16_to_f32_row(x: &[f16], y: &mut [f32]) {
    assert_eq!(x.len(), y.len(), "f16_to_f32_row: length mismatch");
    let (xc, xt) = x.as_chunks::<8>();
    let (yc, yt) = y.as_chunks_mut::<8>();
    for (o, h) in yc.iter_mut().zip(xc) {
        let h = load_h8(h);
        let (o, _) = o.as_chunks_mut::<4>();
        st(&mut o[0], h2f_lo(h));
        st(&mut o[1], h2f_hi(h));
    }
    for (o, &h) in yt.iter_mut().zip(xt) {
        *o = h2f(h);
    }
}

/// f32 → f16, round to nearest even.
pub(crate) fn f32_to_f16_row(x: &[f32], y: &mut [f16]) {
    assert_eq!(x.len(), y.len(), "f32_to_f16_row: length mismatch");
    let (xc, xt) = x.as_chunks::<8>();
    let (yc, yt) = y.as_chunks_mut::<8>();
    for (o, v) in yc.iter_mut().zip(xc) {
        let (v, _) = v.as_chunks::<4>();
        store_h8(o, f2h_x8(ld(&v[0]), ld(&v[1])));
    }
    for (o, &v) in yt.iter_mut().zip(xt) {
        *o = f2h(v);
    }
}
