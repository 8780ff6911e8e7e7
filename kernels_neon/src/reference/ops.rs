//! f32 operations of the forward pass, as ggml computes them on the CPU.

use crate::block::f16;

/// `out = x / sqrt(mean(x²) + eps) * w`. The sum of squares is kept in f64 as ggml does.
pub fn rms_norm_ref(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    assert!(
        x.len() == w.len() && x.len() == out.len(),
        "rms_norm: length mismatch"
    );
    if x.is_empty() {
        return;
    }
    let sum: f64 = x.iter().map(|&v| (v * v) as f64).sum();
    let mean = (sum / x.len() as f64) as f32;
    let scale = 1.0 / (mean + eps).sqrt();
    for ((o, &v), &g) in out.iter_mut().zip(x).zip(w) {
        *o = (v * scale) * g;
    }
}

/// In-place softmax: `x = exp(x - max) / sum`. The sum is kept in f64 as ggml does.
pub fn softmax_ref(x: &mut [f32]) {
    if x.is_empty() {
        return;
    }
    let max = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    let mut sum = 0.0f64;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v as f64;
    }
    let inv = (1.0 / sum) as f32;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// SwiGLU: `out = silu(gate) * up`, `silu(g) = g / (1 + exp(-g))`.
pub fn silu_mul_ref(gate: &[f32], up: &[f32], out: &mut [f32]) {
    assert!(
        gate.len() == up.len() && gate.len() == out.len(),
        "silu_mul: length mismatch"
    );
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = g / (1.0 + (-g).exp()) * u;
    }
}

/// `2·√(2/π)` and `2·√(2/π)·0.044715`: GELU's tanh approximation as a sigmoid,
/// `0.5·(1 + tanh(u)) = 1 / (1 + exp(-2u))`, `u = √(2/π)·(g + 0.044715·g³)`, so GeGLU runs on
/// the same `exp` as SwiGLU on every path.
pub const GELU_2C0: f32 = 1.595_769;
pub const GELU_2C1: f32 = 0.071_354_816;

/// GeGLU (Gemma): `out = gelu_tanh(gate) * up`, computed as
/// `g / (1 + exp(-(g · (GELU_2C0 + GELU_2C1 · g · g)))) * u`, each step rounded to f32 in that
/// order (the fast paths follow it, so only `exp` differs between them).
pub fn gelu_mul_ref(gate: &[f32], up: &[f32], out: &mut [f32]) {
    assert!(
        gate.len() == up.len() && gate.len() == out.len(),
        "gelu_mul: length mismatch"
    );
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        let t = g * (GELU_2C0 + GELU_2C1 * (g * g));
        *o = g / (1.0 + (-t).exp()) * u;
    }
}

pub fn check_rope(x: &[f32], head_dim: usize, cs: &[f32]) {
    assert!(
        head_dim > 0 && x.len().is_multiple_of(head_dim),
        "rope: {} values are not whole heads of {}",
        x.len(),
        head_dim
    );
    assert!(
        cs.len().is_multiple_of(2) && cs.len() <= head_dim,
        "rope: bad cos/sin table length {}",
        cs.len()
    );
}

/// RoPE, "normal" (LLaMA/ggml mode 0): rotates adjacent pairs `(x[2i], x[2i+1])` of each head.
///
/// `x` holds whole heads of `head_dim`; `cs` holds `(cos θ_i, sin θ_i)` for the
/// `n_rot / 2` rotated pairs, `n_rot = cs.len() <= head_dim`; dimensions past `n_rot` pass
/// through.
pub fn rope_norm_ref(x: &mut [f32], head_dim: usize, cs: &[f32]) {
    check_rope(x, head_dim, cs);
    for head in x.chunks_exact_mut(head_dim) {
        for (pair, c) in head.chunks_exact_mut(2).zip(cs.chunks_exact(2)) {
            let (x0, x1) = (pair[0], pair[1]);
            pair[0] = x0 * c[0] - x1 * c[1];
            pair[1] = x0 * c[1] + x1 * c[0];
        }
    }
}

/// RoPE, "neox" (GPT-NeoX/Qwen2): rotates `(x[i], x[i + n_rot/2])` for `i < n_rot/2`,
/// `n_rot = cs.len()`, with `(cos θ_i, sin θ_i) = (cs[2i], cs[2i+1])`.
pub fn rope_neox_ref(x: &mut [f32], head_dim: usize, cs: &[f32]) {
    check_rope(x, head_dim, cs);
    let half = cs.len() / 2;
    for head in x.chunks_exact_mut(head_dim) {
        for (i, c) in cs.chunks_exact(2).enumerate() {
            let (x0, x1) = (head[i], head[i + half]);
            head[i] = x0 * c[0] - x1 * c[1];
            head[i + half] = x0 * c[1] + x1 * c[0];
        }
    }
}

/// `x += y`.
pub fn add_ref(x: &mut [f32], y: &[f32]) {
    assert_eq!(x.len(), y.len(), "add: length mismatch");
    for (a, &b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// `x *= s`.
pub fn scale_ref(x: &mut [f32], s: f32) {
    for a in x.iter_mut() {
        *a *= s;
    }
}

/// `sum(a * b)` over f32.
pub fn dot_f32_ref(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "dot_f32: length mismatch");
    a.iter().zip(b).map(|(&x, &y)| x * y).sum()
}

/// `y += s * x` over f32.
pub fn axpy_f32_ref(y: &mut [f32], s: f32, x: &[f32]) {
    assert_eq!(x.len(), y.len(), "axpy_f32: length mismatch");
    for (o, &v) in y.iter_mut().zip(x) {
        *o += s * v;
    }
}

/// `sum(a * b)` with `a` from an f16 KV cache row.
pub fn dot_f16_ref(a: &[f16], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "dot_f16: length mismatch");
    a.iter().zip(b).map(|(&x, &y)| x.to_f32() * y).sum()
}

/// `y += s * x` with `x` from an f16 KV cache row.
pub fn axpy_f16_ref(y: &mut [f32], s: f32, x: &[f16]) {
    assert_eq!(x.len(), y.len(), "axpy_f16: length mismatch");
    for (o, &v) in y.iter_mut().zip(x) {
        *o += s * v.to_f32();
    }
}

/// Checks that `data` holds `n` strided rows of `width` elements (row `j` at `j * stride`).
#[inline]
pub fn check_strided(what: &str, len: usize, stride: usize, n: usize, width: usize) {
    let need = match n {
        0 => Some(0),
        _ => (n - 1)
            .checked_mul(stride)
            .and_then(|a| a.checked_add(width)),
    };
    assert!(
        need.is_some_and(|need| need <= len),
        "{what}: {n} rows of {width} at stride {stride} do not fit {len} elements"
    );
}

/// Checks the shapes of a group of `heads` query heads over strided rows: `wide` is `heads`
/// vectors of the rows' width (queries or outputs), `per_head` is `heads` rows of `n` (scores
/// or weights), and `len` holds the `n` rows. Returns `(width, n)`.
#[inline]
pub fn check_group(
    what: &str,
    len: usize,
    stride: usize,
    heads: usize,
    wide: usize,
    per_head: usize,
) -> (usize, usize) {
    assert!(
        heads > 0 && wide.is_multiple_of(heads) && per_head.is_multiple_of(heads),
        "{what}: {wide} and {per_head} values for {heads} heads"
    );
    let (width, n) = (wide / heads, per_head / heads);
    check_strided(what, len, stride, n, width);
    (width, n)
}

/// Attention scores of `heads` query heads sharing one KV head (grouped-query attention):
/// `out[h·n + j] = dot_f16(row j, q_h) · scale`, with `q_h = q[h·hd..][..hd]`, row `j` of `k`
/// at `k[j·stride..][..hd]` and `hd = q.len() / heads`, `n = out.len() / heads`.
pub fn scores_f16_ref(
    k: &[f16],
    stride: usize,
    q: &[f32],
    heads: usize,
    scale: f32,
    out: &mut [f32],
) {
    // One head and row at a time, through the shape checks every path shares.
    crate::attn::scores_by_rows((k, stride), q, heads, scale, out, dot_f16_ref);
}

/// The weighted sums of cached values for `heads` query heads sharing one KV head:
/// `out_h += p[h·n + j] · row j` for `j` in order, each step rounded as [`axpy_f16_ref`];
/// `out_h = out[h·hd..][..hd]`, row `j` of `v` at `v[j·stride..][..hd]`.
pub fn mix_f16_ref(v: &[f16], stride: usize, p: &[f32], heads: usize, out: &mut [f32]) {
    // One head and row at a time, through the shape checks every path shares.
    crate::attn::mix_by_rows((v, stride), p, heads, out, axpy_f16_ref);
}

#[cfg(test)]
mod tests {
    use super::*;

    // Independent of every implementation: rotating unit vectors by hand-known angles.
    #[test]
    fn rope_norm_rotates_adjacent_pairs_and_neox_rotates_halves() {
        let (c0, s0, c1, s1) = (0.6f32, 0.8f32, 0.0f32, 1.0f32);
        let cs = [c0, s0, c1, s1];
        let mut x = [1.0, 0.0, 1.0, 0.0, 7.0, 9.0];
        rope_norm_ref(&mut x, 6, &cs);
        assert_eq!(x, [c0, s0, c1, s1, 7.0, 9.0]);
        // neox, n_rot 4 of head_dim 6: pairs (0, 2) and (1, 3); dims 4 and 5 untouched.
        let mut x = [1.0, 1.0, 0.0, 0.0, 7.0, 9.0];
        rope_neox_ref(&mut x, 6, &cs);
        assert_eq!(x, [c0, c1, s0, s1, 7.0, 9.0]);
    }
}
