//! f32 operations of the forward pass (AVX2 + FMA + F16C).
//!
//! Element-wise ops (`add`, `scale`, `axpy_f32`, `rms_norm`'s output, the conversions) round
//! exactly like the references; `axpy_f16` (the step of attention's mix) is fused, one
//! rounding where the reference has two; reductions differ only in summation order (sums that
//! ggml keeps in f64 are kept in f64 here too); `exp` is the polynomial of [`exp_ps`].

use super::simd::{
    acc_pd, exp_ps, hmax_ps, hsum_pd, hsum_ps, load_ph, load_ps, store_ph, store_ps,
};
use crate::block::f16;
use crate::reference::{GELU_2C0, GELU_2C1, check_rope};
use std::arch::x86_64::*;

avx2_entry!(
    /// `out = x / sqrt(mean(x²) + eps) * w`, sum of squares in f64.
    rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) => rms_norm_body
);
avx2_entry!(
    /// In-place softmax, sum in f64.
    softmax(x: &mut [f32]) => softmax_body
);
avx2_entry!(
    /// `out = gate / (1 + exp(-gate)) * up`.
    silu_mul(gate: &[f32], up: &[f32], out: &mut [f32]) => silu_mul_body
);
avx2_entry!(
    /// `out = gelu_tanh(gate) * up`.
    gelu_mul(gate: &[f32], up: &[f32], out: &mut [f32]) => gelu_mul_body
);
avx2_entry!(
    /// RoPE on adjacent pairs.
    rope_norm(x: &mut [f32], head_dim: usize, cs: &[f32]) => rope_norm_body
);
avx2_entry!(
    /// RoPE NeoX-style.
    rope_neox(x: &mut [f32], head_dim: usize, cs: &[f32]) => rope_neox_body
);
avx2_entry!(
    /// `x += y`.
    add(x: &mut [f32], y: &[f32]) => add_body
);
avx2_entry!(
    /// `x *= s`.
    scale(x: &mut [f32], s: f32) => scale_body
);
avx2_entry!(
    /// `sum(a * b)`.
    dot_f32(a: &[f32], b: &[f32]) -> f32 => dot_f32_body
);
avx2_entry!(
    /// `y += s * x`.
    axpy_f32(y: &mut [f32], s: f32, x: &[f32]) => axpy_f32_body
);
avx2_entry!(
    /// `sum(a * b)`, `a` in f16.
    dot_f16(a: &[f16], b: &[f32]) -> f32 => dot_f16_body
);
avx2_entry!(
    /// `y += s * x`, `x` in f16.
    axpy_f16(y: &mut [f32], s: f32, x: &[f16]) => axpy_f16_body
);
avx2_entry!(
    /// f16 → f32 (exact).
    f16_to_f32_row(x: &[f16], y: &mut [f32]) => f16_to_f32_body
);
avx2_entry!(
    /// f32 → f16, round to nearest even (F16C).
    f32_to_f16_row(x: &[f32], y: &mut [f16]) => f32_to_f16_body
);

#[target_feature(enable = "avx2,fma,f16c")]
fn rms_norm_body(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    assert!(
        x.len() == w.len() && x.len() == out.len(),
        "rms_norm: length mismatch"
    );
    if x.is_empty() {
        return;
    }
    let (xc, xt) = x.as_chunks::<8>();
    let mut acc = [_mm256_setzero_pd(); 2];
    for c in xc {
        let v = load_ps(c);
        acc_pd(&mut acc, _mm256_mul_ps(v, v));
    }
    let mut sum = hsum_pd(acc);
    for &v in xt {
        sum += (v * v) as f64;
    }
    let mean = (sum / x.len() as f64) as f32;
    let scale = 1.0 / (mean + eps).sqrt();
    let sv = _mm256_set1_ps(scale);
    let (oc, ot) = out.as_chunks_mut::<8>();
    let (wc, wt) = w.as_chunks::<8>();
    for ((o, c), g) in oc.iter_mut().zip(xc).zip(wc) {
        store_ps(o, _mm256_mul_ps(_mm256_mul_ps(load_ps(c), sv), load_ps(g)));
    }
    for ((o, &v), &g) in ot.iter_mut().zip(xt).zip(wt) {
        *o = (v * scale) * g;
    }
}

/// Copies a tail of fewer than 8 values into a vector padded with `pad`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn load_tail(t: &[f32], pad: f32) -> __m256 {
    let mut buf = [pad; 8];
    buf[..t.len()].copy_from_slice(t);
    load_ps(&buf)
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn store_tail(t: &mut [f32], v: __m256) {
    let mut buf = [0.0; 8];
    store_ps(&mut buf, v);
    let n = t.len();
    t.copy_from_slice(&buf[..n]);
}

#[target_feature(enable = "avx2,fma,f16c")]
fn softmax_body(x: &mut [f32]) {
    if x.is_empty() {
        return;
    }
    let (xc, xt) = x.as_chunks_mut::<8>();
    // `max_ps(v, acc)` keeps `acc` when `v` is NaN, like the reference's `f32::max` fold.
    let mut m = _mm256_set1_ps(f32::NEG_INFINITY);
    for c in xc.iter() {
        m = _mm256_max_ps(load_ps(c), m);
    }
    let mut max = hmax_ps(m);
    for &v in xt.iter() {
        max = max.max(v);
    }
    let mv = _mm256_set1_ps(max);
    let mut acc = [_mm256_setzero_pd(); 2];
    for c in xc.iter_mut() {
        let e = exp_ps(_mm256_sub_ps(load_ps(c), mv));
        store_ps(c, e);
        acc_pd(&mut acc, e);
    }
    if !xt.is_empty() {
        // Padding with -inf gives exp() = 0, which adds nothing to the sum.
        let e = exp_ps(_mm256_sub_ps(load_tail(xt, f32::NEG_INFINITY), mv));
        store_tail(xt, e);
        acc_pd(&mut acc, e);
    }
    let inv = _mm256_set1_ps((1.0 / hsum_pd(acc)) as f32);
    for c in xc.iter_mut() {
        store_ps(c, _mm256_mul_ps(load_ps(c), inv));
    }
    if !xt.is_empty() {
        store_tail(xt, _mm256_mul_ps(load_tail(xt, 0.0), inv));
    }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn silu_mul8(g: __m256, u: __m256) -> __m256 {
    let neg = _mm256_xor_ps(g, _mm256_set1_ps(-0.0));
    let den = _mm256_add_ps(_mm256_set1_ps(1.0), exp_ps(neg));
    _mm256_mul_ps(_mm256_div_ps(g, den), u)
}

#[target_feature(enable = "avx2,fma,f16c")]
fn silu_mul_body(gate: &[f32], up: &[f32], out: &mut [f32]) {
    glu(gate, up, out, |g, u| silu_mul8(g, u));
}

/// `gelu_tanh(g) * u` in the reference's order, unfused (see `reference::gelu_mul_ref`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn gelu_mul8(g: __m256, u: __m256) -> __m256 {
    let g2 = _mm256_mul_ps(g, g);
    let c = _mm256_add_ps(
        _mm256_set1_ps(GELU_2C0),
        _mm256_mul_ps(_mm256_set1_ps(GELU_2C1), g2),
    );
    let neg_t = _mm256_xor_ps(_mm256_mul_ps(g, c), _mm256_set1_ps(-0.0));
    let den = _mm256_add_ps(_mm256_set1_ps(1.0), exp_ps(neg_t));
    _mm256_mul_ps(_mm256_div_ps(g, den), u)
}

#[target_feature(enable = "avx2,fma,f16c")]
fn gelu_mul_body(gate: &[f32], up: &[f32], out: &mut [f32]) {
    glu(gate, up, out, |g, u| gelu_mul8(g, u));
}

/// A gated linear unit, eight lanes at a time.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn glu(gate: &[f32], up: &[f32], out: &mut [f32], f: impl Fn(__m256, __m256) -> __m256) {
    assert!(
        gate.len() == up.len() && gate.len() == out.len(),
        "glu: length mismatch"
    );
    let (gc, gt) = gate.as_chunks::<8>();
    let (uc, ut) = up.as_chunks::<8>();
    let (oc, ot) = out.as_chunks_mut::<8>();
    for ((o, g), u) in oc.iter_mut().zip(gc).zip(uc) {
        store_ps(o, f(load_ps(g), load_ps(u)));
    }
    if !gt.is_empty() {
        store_tail(ot, f(load_tail(gt, 0.0), load_tail(ut, 0.0)));
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn rope_norm_body(x: &mut [f32], head_dim: usize, cs: &[f32]) {
    check_rope(x, head_dim, cs);
    // Pairs and (cos, sin) share the layout: out = x * cos ∓ swap(x) * sin.
    let n = cs.len().min(head_dim);
    let (cc, ct) = cs[..n].as_chunks::<8>();
    for head in x.chunks_exact_mut(head_dim) {
        let (hc, ht) = head[..n].as_chunks_mut::<8>();
        for (h, c) in hc.iter_mut().zip(cc) {
            let v = load_ps(h);
            let c = load_ps(c);
            let cos = _mm256_moveldup_ps(c);
            let sin = _mm256_movehdup_ps(c);
            let swapped = _mm256_permute_ps::<0b1011_0001>(v);
            // even lanes: x0*c - x1*s, odd lanes: x1*c + x0*s.
            store_ps(h, _mm256_fmaddsub_ps(v, cos, _mm256_mul_ps(swapped, sin)));
        }
        for (pair, c) in ht.chunks_exact_mut(2).zip(ct.chunks_exact(2)) {
            let (x0, x1) = (pair[0], pair[1]);
            pair[0] = x0 * c[0] - x1 * c[1];
            pair[1] = x0 * c[1] + x1 * c[0];
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn rope_neox_body(x: &mut [f32], head_dim: usize, cs: &[f32]) {
    check_rope(x, head_dim, cs);
    // Pair i rotates (x[i], x[i + half]), half = n_rot / 2 = cs.len() / 2: two contiguous runs
    // against the deinterleaved (cos, sin).
    let half = cs.len() / 2;
    let (cc, ct) = cs.as_chunks::<16>();
    for head in x.chunks_exact_mut(head_dim) {
        let (lo, hi) = head[..2 * half].split_at_mut(half);
        let (lc, lt) = lo.as_chunks_mut::<8>();
        let (hc, ht) = hi.as_chunks_mut::<8>();
        for ((a, b), c) in lc.iter_mut().zip(hc.iter_mut()).zip(cc) {
            // Deinterleave 8 (cos, sin) pairs: even and odd elements per 128-bit lane, then
            // the 64-bit quarters back in order.
            let (p, q) = (
                load_ps(c[..8].try_into().unwrap()),
                load_ps(c[8..].try_into().unwrap()),
            );
            let cos = _mm256_castpd_ps(_mm256_permute4x64_pd::<0b1101_1000>(_mm256_castps_pd(
                _mm256_shuffle_ps::<0b1000_1000>(p, q),
            )));
            let sin = _mm256_castpd_ps(_mm256_permute4x64_pd::<0b1101_1000>(_mm256_castps_pd(
                _mm256_shuffle_ps::<0b1101_1101>(p, q),
            )));
            let (x0, x1) = (load_ps(a), load_ps(b));
            store_ps(a, _mm256_fmsub_ps(x0, cos, _mm256_mul_ps(x1, sin)));
            store_ps(b, _mm256_fmadd_ps(x0, sin, _mm256_mul_ps(x1, cos)));
        }
        for ((a, b), c) in lt.iter_mut().zip(ht.iter_mut()).zip(ct.chunks_exact(2)) {
            let (x0, x1) = (*a, *b);
            *a = x0 * c[0] - x1 * c[1];
            *b = x0 * c[1] + x1 * c[0];
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn add_body(x: &mut [f32], y: &[f32]) {
    assert_eq!(x.len(), y.len(), "add: length mismatch");
    let (xc, xt) = x.as_chunks_mut::<8>();
    let (yc, yt) = y.as_chunks::<8>();
    for (a, b) in xc.iter_mut().zip(yc) {
        store_ps(a, _mm256_add_ps(load_ps(a), load_ps(b)));
    }
    for (a, &b) in xt.iter_mut().zip(yt) {
        *a += b;
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn scale_body(x: &mut [f32], s: f32) {
    let sv = _mm256_set1_ps(s);
    let (xc, xt) = x.as_chunks_mut::<8>();
    for a in xc.iter_mut() {
        store_ps(a, _mm256_mul_ps(load_ps(a), sv));
    }
    for a in xt.iter_mut() {
        *a *= s;
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn dot_f32_body(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "dot_f32: length mismatch");
    let (ac, at) = a.as_chunks::<8>();
    let (bc, bt) = b.as_chunks::<8>();
    let mut acc = [_mm256_setzero_ps(); 4];
    let (a4, a1) = ac.as_chunks::<4>();
    let (b4, b1) = bc.as_chunks::<4>();
    for (x, y) in a4.iter().zip(b4) {
        for k in 0..4 {
            acc[k] = _mm256_fmadd_ps(load_ps(&x[k]), load_ps(&y[k]), acc[k]);
        }
    }
    for (k, (x, y)) in a1.iter().zip(b1).enumerate() {
        acc[k] = _mm256_fmadd_ps(load_ps(x), load_ps(y), acc[k]);
    }
    let v = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
    let mut sum = hsum_ps(v);
    for (&x, &y) in at.iter().zip(bt) {
        sum += x * y;
    }
    sum
}

#[target_feature(enable = "avx2,fma,f16c")]
fn axpy_f32_body(y: &mut [f32], s: f32, x: &[f32]) {
    assert_eq!(x.len(), y.len(), "axpy_f32: length mismatch");
    let sv = _mm256_set1_ps(s);
    let (yc, yt) = y.as_chunks_mut::<8>();
    let (xc, xt) = x.as_chunks::<8>();
    for (o, v) in yc.iter_mut().zip(xc) {
        // mul then add (not fma): rounds exactly like the reference.
        store_ps(o, _mm256_add_ps(load_ps(o), _mm256_mul_ps(sv, load_ps(v))));
    }
    for (o, &v) in yt.iter_mut().zip(xt) {
        *o += s * v;
    }
}

/// As [`dot_f32_body`]: four 8-lane accumulators over the 8-element chunks (chunk `c` into
/// `acc[c % 4]`), summed `(0 + 1) + (2 + 3)`, then the tail in order.
#[target_feature(enable = "avx2,fma,f16c")]
fn dot_f16_body(a: &[f16], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "dot_f16: length mismatch");
    let (ac, at) = a.as_chunks::<8>();
    let (bc, bt) = b.as_chunks::<8>();
    let mut acc = [_mm256_setzero_ps(); 4];
    for (k, (x, y)) in ac.iter().zip(bc).enumerate() {
        acc[k % 4] = _mm256_fmadd_ps(load_ph(x), load_ps(y), acc[k % 4]);
    }
    let v = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
    let mut sum = hsum_ps(v);
    for (&x, &y) in at.iter().zip(bt) {
        sum += x.to_f32() * y;
    }
    sum
}

#[target_feature(enable = "avx2,fma,f16c")]
fn axpy_f16_body(y: &mut [f32], s: f32, x: &[f16]) {
    assert_eq!(x.len(), y.len(), "axpy_f16: length mismatch");
    let sv = _mm256_set1_ps(s);
    let (yc, yt) = y.as_chunks_mut::<8>();
    let (xc, xt) = x.as_chunks::<8>();
    // Fused (one rounding per element): a multiply then an add is two instructions on the
    // same ports and a longer chain, and the mix of attention is this loop.
    for (o, v) in yc.iter_mut().zip(xc) {
        store_ps(o, _mm256_fmadd_ps(sv, load_ph(v), load_ps(o)));
    }
    for (o, &v) in yt.iter_mut().zip(xt) {
        *o = s.mul_add(v.to_f32(), *o);
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn f16_to_f32_body(x: &[f16], y: &mut [f32]) {
    assert_eq!(x.len(), y.len(), "f16_to_f32_row: length mismatch");
    let (xc, xt) = x.as_chunks::<8>();
    let (yc, yt) = y.as_chunks_mut::<8>();
    for (o, h) in yc.iter_mut().zip(xc) {
        store_ps(o, load_ph(h));
    }
    if !xt.is_empty() {
        let mut buf = [f16::ZERO; 8];
        buf[..xt.len()].copy_from_slice(xt);
        store_tail(yt, load_ph(&buf));
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn f32_to_f16_body(x: &[f32], y: &mut [f16]) {
    assert_eq!(x.len(), y.len(), "f32_to_f16_row: length mismatch");
    let (xc, xt) = x.as_chunks::<8>();
    let (yc, yt) = y.as_chunks_mut::<8>();
    for (o, v) in yc.iter_mut().zip(xc) {
        store_ph(o, load_ps(v));
    }
    if !xt.is_empty() {
        let mut buf = [f16::ZERO; 8];
        store_ph(&mut buf, load_tail(xt, 0.0));
        let n = yt.len();
        yt.copy_from_slice(&buf[..n]);
    }
}
