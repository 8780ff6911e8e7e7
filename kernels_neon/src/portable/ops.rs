//! f32 operations of the forward pass on `wide` vectors (8 lanes: one AVX register, two SSE or
//! NEON registers).
//!
//! Element-wise ops round exactly like the references (no fused multiply-add where the
//! reference rounds twice); sums ggml keeps in f64 are kept in f64; `exp` is [`exp8`].

use super::simd::{exp8, f16_to_f32, f16x8_to_f32x8, f32x8_to_f16x8};
use crate::block::f16;
use crate::reference::check_rope;
use crate::reference::{GELU_2C0, GELU_2C1};
use wide::f32x8;

#[inline]
fn ld(x: &[f32; 8]) -> f32x8 {
    f32x8::from(*x)
}

#[inline]
fn ld_h(x: &[f16; 8]) -> f32x8 {
    f16x8_to_f32x8(x.map(f16::to_bits))
}

/// A tail of fewer than 8 values, padded with `pad`.
#[inline]
fn ld_tail(t: &[f32], pad: f32) -> f32x8 {
    let mut buf = [pad; 8];
    buf[..t.len()].copy_from_slice(t);
    f32x8::from(buf)
}

#[inline]
fn st_tail(t: &mut [f32], v: f32x8) {
    let n = t.len();
    t.copy_from_slice(&v.to_array()[..n]);
}

/// Adds the lanes of `v` to 8 f64 accumulators.
#[inline]
fn acc_f64(acc: &mut [f64; 8], v: f32x8) {
    for (a, x) in acc.iter_mut().zip(v.to_array()) {
        *a += x as f64;
    }
}

/// `out = x / sqrt(mean(x²) + eps) * w`, sum of squares in f64.
pub(crate) fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    assert!(
        x.len() == w.len() && x.len() == out.len(),
        "rms_norm: length mismatch"
    );
    if x.is_empty() {
        return;
    }
    let (xc, xt) = x.as_chunks::<8>();
    let mut acc = [0.0f64; 8];
    for c in xc {
        let v = ld(c);
        acc_f64(&mut acc, v * v);
    }
    let mut sum: f64 = acc.iter().sum();
    for &v in xt {
        sum += (v * v) as f64;
    }
    let mean = (sum / x.len() as f64) as f32;
    let scale = 1.0 / (mean + eps).sqrt();
    let sv = f32x8::splat(scale);
    let (oc, ot) = out.as_chunks_mut::<8>();
    let (wc, wt) = w.as_chunks::<8>();
    for ((o, c), g) in oc.iter_mut().zip(xc).zip(wc) {
        *o = ((ld(c) * sv) * ld(g)).to_array();
    }
    for ((o, &v), &g) in ot.iter_mut().zip(xt).zip(wt) {
        *o = (v * scale) * g;
    }
}

/// In-place softmax, sum in f64.
pub(crate) fn softmax(x: &mut [f32]) {
    if x.is_empty() {
        return;
    }
    let (xc, xt) = x.as_chunks_mut::<8>();
    // `f32x8::max` picks the non-NaN lane, like the reference's `f32::max` fold.
    let m = xc
        .iter()
        .fold(f32x8::splat(f32::NEG_INFINITY), |m, c| m.max(ld(c)));
    let max = m
        .to_array()
        .into_iter()
        .chain(xt.iter().copied())
        .fold(f32::NEG_INFINITY, f32::max);
    let mv = f32x8::splat(max);
    let mut acc = [0.0f64; 8];
    for c in xc.iter_mut() {
        let e = exp8(ld(c) - mv);
        *c = e.to_array();
        acc_f64(&mut acc, e);
    }
    if !xt.is_empty() {
        // Padding with -inf gives exp() = 0, which adds nothing to the sum.
        let e = exp8(ld_tail(xt, f32::NEG_INFINITY) - mv);
        st_tail(xt, e);
        acc_f64(&mut acc, e);
    }
    let inv = f32x8::splat((1.0 / acc.iter().sum::<f64>()) as f32);
    for c in xc.iter_mut() {
        *c = (ld(c) * inv).to_array();
    }
    if !xt.is_empty() {
        st_tail(xt, ld_tail(xt, 0.0) * inv);
    }
}

#[inline]
fn silu_mul8(g: f32x8, u: f32x8) -> f32x8 {
    g / (f32x8::splat(1.0) + exp8(-g)) * u
}

/// `out = gate / (1 + exp(-gate)) * up`.
pub(crate) fn silu_mul(gate: &[f32], up: &[f32], out: &mut [f32]) {
    glu(gate, up, out, silu_mul8);
}

/// `gelu_tanh(g) * u` in the reference's order (see `reference::gelu_mul_ref`).
#[inline]
fn gelu_mul8(g: f32x8, u: f32x8) -> f32x8 {
    let t = g * (f32x8::splat(GELU_2C0) + f32x8::splat(GELU_2C1) * (g * g));
    g / (f32x8::splat(1.0) + exp8(-t)) * u
}

/// GeGLU: `out = gelu_tanh(gate) * up`.
pub(crate) fn gelu_mul(gate: &[f32], up: &[f32], out: &mut [f32]) {
    glu(gate, up, out, gelu_mul8);
}

/// A gated linear unit, eight lanes at a time.
#[inline(always)]
fn glu(gate: &[f32], up: &[f32], out: &mut [f32], f: fn(f32x8, f32x8) -> f32x8) {
    assert!(
        gate.len() == up.len() && gate.len() == out.len(),
        "glu: length mismatch"
    );
    let (gc, gt) = gate.as_chunks::<8>();
    let (uc, ut) = up.as_chunks::<8>();
    let (oc, ot) = out.as_chunks_mut::<8>();
    for ((o, g), u) in oc.iter_mut().zip(gc).zip(uc) {
        *o = f(ld(g), ld(u)).to_array();
    }
    if !gt.is_empty() {
        st_tail(ot, f(ld_tail(gt, 0.0), ld_tail(ut, 0.0)));
    }
}

/// RoPE NeoX-style: pair `i` rotates `(x[i], x[i + half])`, `half = n_rot / 2 = cs.len() / 2`:
/// two contiguous runs against the deinterleaved `(cos, sin)`.
pub(crate) fn rope_neox(x: &mut [f32], head_dim: usize, cs: &[f32]) {
    check_rope(x, head_dim, cs);
    let half = cs.len() / 2;
    let (cc, ct) = cs.as_chunks::<16>();
    for head in x.chunks_exact_mut(head_dim) {
        let (lo, hi) = head[..2 * half].split_at_mut(half);
        let (lc, lt) = lo.as_chunks_mut::<8>();
        let (hc, ht) = hi.as_chunks_mut::<8>();
        for ((a, b), c) in lc.iter_mut().zip(hc.iter_mut()).zip(cc) {
            let cos = f32x8::from(std::array::from_fn::<f32, 8, _>(|k| c[2 * k]));
            let sin = f32x8::from(std::array::from_fn::<f32, 8, _>(|k| c[2 * k + 1]));
            let (x0, x1) = (ld(a), ld(b));
            *a = (x0 * cos - x1 * sin).to_array();
            *b = (x0 * sin + x1 * cos).to_array();
        }
        for ((a, b), c) in lt.iter_mut().zip(ht.iter_mut()).zip(ct.chunks_exact(2)) {
            let (x0, x1) = (*a, *b);
            *a = x0 * c[0] - x1 * c[1];
            *b = x0 * c[1] + x1 * c[0];
        }
    }
}

/// `x += y`.
pub(crate) fn add(x: &mut [f32], y: &[f32]) {
    assert_eq!(x.len(), y.len(), "add: length mismatch");
    let (xc, xt) = x.as_chunks_mut::<8>();
    let (yc, yt) = y.as_chunks::<8>();
    for (a, b) in xc.iter_mut().zip(yc) {
        *a = (ld(a) + ld(b)).to_array();
    }
    for (a, &b) in xt.iter_mut().zip(yt) {
        *a += b;
    }
}

/// `x *= s`.
pub(crate) fn scale(x: &mut [f32], s: f32) {
    let sv = f32x8::splat(s);
    let (xc, xt) = x.as_chunks_mut::<8>();
    for a in xc.iter_mut() {
        *a = (ld(a) * sv).to_array();
    }
    for a in xt.iter_mut() {
        *a *= s;
    }
}

/// `sum(a * b)`, four 8-lane accumulators.
pub(crate) fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "dot_f32: length mismatch");
    dot_with(a, b, ld)
}

/// `sum(a * b)` with `a` in f16.
pub(crate) fn dot_f16(a: &[f16], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "dot_f16: length mismatch");
    dot_with(a, b, ld_h)
}

#[inline]
fn dot_with<T: Widen>(a: &[T], b: &[f32], load: impl Fn(&[T; 8]) -> f32x8) -> f32 {
    let (ac, at) = a.as_chunks::<8>();
    let (bc, bt) = b.as_chunks::<8>();
    let mut acc = [f32x8::ZERO; 4];
    let (a4, a1) = ac.as_chunks::<4>();
    let (b4, b1) = bc.as_chunks::<4>();
    for (x, y) in a4.iter().zip(b4) {
        for k in 0..4 {
            acc[k] = load(&x[k]).mul_add(ld(&y[k]), acc[k]);
        }
    }
    for (k, (x, y)) in a1.iter().zip(b1).enumerate() {
        acc[k] = load(x).mul_add(ld(y), acc[k]);
    }
    let mut sum = ((acc[0] + acc[1]) + (acc[2] + acc[3])).reduce_add();
    for (&x, &y) in at.iter().zip(bt) {
        sum += x.widen() * y;
    }
    sum
}

/// An element of a row that `dot_with` / `axpy_with` read: f32, or f16 widened exactly.
trait Widen: Copy {
    fn widen(self) -> f32;
}

impl Widen for f32 {
    #[inline]
    fn widen(self) -> f32 {
        self
    }
}

impl Widen for f16 {
    #[inline]
    fn widen(self) -> f32 {
        f16_to_f32(self)
    }
}

/// A group's attention scores: `dot_f16` per head and strided key row, inlined.
pub(crate) fn scores_f16(
    k: &[f16],
    stride: usize,
    q: &[f32],
    heads: usize,
    scale: f32,
    out: &mut [f32],
) {
    crate::attn::scores_by_rows((k, stride), q, heads, scale, out, |r, qh| {
        dot_with(r, qh, ld_h)
    });
}

/// A group's weighted sums of strided value rows: `axpy_f16` per head and row, inlined.
pub(crate) fn mix_f16(v: &[f16], stride: usize, p: &[f32], heads: usize, out: &mut [f32]) {
    crate::attn::mix_by_rows((v, stride), p, heads, out, |o, pj, r| {
        axpy_with(o, pj, r, ld_h)
    });
}

/// `y += s * x`.
pub(crate) fn axpy_f32(y: &mut [f32], s: f32, x: &[f32]) {
    assert_eq!(x.len(), y.len(), "axpy_f32: length mismatch");
    axpy_with(y, s, x, ld)
}

/// `y += s * x` with `x` in f16.
pub(crate) fn axpy_f16(y: &mut [f32], s: f32, x: &[f16]) {
    assert_eq!(x.len(), y.len(), "axpy_f16: length mismatch");
    axpy_with(y, s, x, ld_h)
}

#[inline]
fn axpy_with<T: Widen>(y: &mut [f32], s: f32, x: &[T], load: impl Fn(&[T; 8]) -> f32x8) {
    let sv = f32x8::splat(s);
    let (yc, yt) = y.as_chunks_mut::<8>();
    let (xc, xt) = x.as_chunks::<8>();
    for (o, v) in yc.iter_mut().zip(xc) {
        // mul then add (not mul_add): rounds exactly like the reference.
        *o = (ld(o) + sv * load(v)).to_array();
    }
    for (o, &v) in yt.iter_mut().zip(xt) {
        *o += s * v.widen();
    }
}

/// f16 → f32 (exact).
pub(crate) fn f16_to_f32_row(x: &[f16], y: &mut [f32]) {
    assert_eq!(x.len(), y.len(), "f16_to_f32_row: length mismatch");
    let (xc, xt) = x.as_chunks::<8>();
    let (yc, yt) = y.as_chunks_mut::<8>();
    for (o, h) in yc.iter_mut().zip(xc) {
        *o = ld_h(h).to_array();
    }
    for (o, h) in yt.iter_mut().zip(xt) {
        *o = h.to_f32();
    }
}

/// f32 → f16, round to nearest even.
pub(crate) fn f32_to_f16_row(x: &[f32], y: &mut [f16]) {
    assert_eq!(x.len(), y.len(), "f32_to_f16_row: length mismatch");
    let (xc, xt) = x.as_chunks::<8>();
    let (yc, yt) = y.as_chunks_mut::<8>();
    for (o, v) in yc.iter_mut().zip(xc) {
        *o = f32x8_to_f16x8(ld(v)).map(f16::from_bits);
    }
    for (o, &v) in yt.iter_mut().zip(xt) {
        *o = f16::from_f32(v);
    }
}
