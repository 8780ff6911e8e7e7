//! The golden forward pass: plain scalar code over the reference kernels, one token at a time,
//! allocating freely. It is slow and obvious on purpose; the fast engine's logits are tested
//! against it (in the spirit of llama2.c's `run.c`).
//!
//! It follows llama.cpp's arithmetic: activations quantized to Q8_0/Q8_1 before each quantized
//! product (the reference quantizers), keys and values rounded to the cache type, f32 elsewhere.

use super::matrix::{Mat, MatData};
use super::{FfnAct, Model, RopeType};
use crate::kv::KvType;
use kernels_neon::reference as r;
use kernels_neon::{BlockFormat, PackedFormat, f16};

/// `x` quantized to `W`'s activation blocks, times `W` with the row reference.
fn quantized<W: BlockFormat>(w: &[W], x: &[f32], y: &mut [f32]) {
    let mut a = vec![W::Activation::default(); x.len() / W::Activation::BLOCK_LEN];
    W::Activation::quantize_row_ref(x, &mut a);
    r::matvec_ref(w, &a, y);
}

/// [`quantized`] over packed weights: the packed reference gives the row reference's bits.
fn packed<P: PackedFormat>(w: &[P], x: &[f32], y: &mut [f32])
where
    P::Row: BlockFormat,
{
    type Act<P> = <<P as PackedFormat>::Row as BlockFormat>::Activation;
    let mut a = vec![Act::<P>::default(); x.len() / Act::<P>::BLOCK_LEN];
    Act::<P>::quantize_row_ref(x, &mut a);
    r::matvec_packed_ref(w, &a, y);
}

/// `y[rows] = W · x[cols]` with the reference kernels.
fn matvec(m: &Mat<'_>, x: &[f32]) -> Vec<f32> {
    let mut y = vec![0.0f32; m.rows];
    match m.data {
        MatData::Q4_0(w) => quantized(w, x, &mut y),
        MatData::Q8_0(w) => quantized(w, x, &mut y),
        MatData::Q4_1(w) => quantized(w, x, &mut y),
        MatData::Q5_0(w) => quantized(w, x, &mut y),
        MatData::Q5_1(w) => quantized(w, x, &mut y),
        MatData::Q4K(w) => quantized(w, x, &mut y),
        MatData::Q5K(w) => quantized(w, x, &mut y),
        MatData::Q6K(w) => quantized(w, x, &mut y),
        MatData::F16(w) => {
            for (o, row) in y.iter_mut().zip(w.chunks_exact(m.cols)) {
                *o = r::dot_f16_ref(row, x);
            }
        }
        MatData::F32(w) => {
            for (o, row) in y.iter_mut().zip(w.chunks_exact(m.cols)) {
                *o = r::dot_f32_ref(row, x);
            }
        }
        MatData::Q4_0x8(w) => packed(w, x, &mut y),
        MatData::Q8_0x8(w) => packed(w, x, &mut y),
        MatData::Q5_0x8(w) => packed(w, x, &mut y),
        MatData::Q4_1x8(w) => packed(w, x, &mut y),
        MatData::Q4Kx8(w) => packed(w, x, &mut y),
        MatData::Q5Kx8(w) => packed(w, x, &mut y),
        MatData::Q6Kx8(w) => packed(w, x, &mut y),
    }
    y
}

fn round_kv(v: &[f32], ty: KvType) -> Vec<f32> {
    match ty {
        KvType::F32 => v.to_vec(),
        KvType::F16 => v.iter().map(|&x| f16::from_f32(x).to_f32()).collect(),
    }
}

/// `x = rmsnorm(x) · w` for each `w.len()`-wide piece of `x`.
fn rms_norm_pieces(x: &mut [f32], w: &[f32], eps: f32) {
    for xi in x.chunks_exact_mut(w.len()) {
        let mut o = vec![0.0f32; w.len()];
        r::rms_norm_ref(xi, w, eps, &mut o);
        xi.copy_from_slice(&o);
    }
}

/// Logits after each token of `tokens` (fed one at a time from position 0): `[T][vocab]`.
pub fn golden_logits(model: &Model, tokens: &[u32], kv_type: KvType) -> Vec<Vec<f32>> {
    let hp = &model.hp;
    let (d, hd) = (hp.n_embd, hp.head_dim);
    let group = hp.group();
    let scale = 1.0 / (hd as f32).sqrt();
    // key_cache[layer][pos] = kv_dim values (rounded as the cache stores them); same for values.
    let mut key_cache: Vec<Vec<Vec<f32>>> = vec![Vec::new(); hp.n_layer];
    let mut value_cache: Vec<Vec<Vec<f32>>> = vec![Vec::new(); hp.n_layer];
    let mut all = Vec::new();

    for (pos, &tok) in tokens.iter().enumerate() {
        // Rotation angles for this position and a layer's base, as ggml computes them.
        let angles = |base: f32| {
            let theta_scale = base.powf(-2.0 / hp.n_rot as f32);
            let mut cs = Vec::new();
            let mut theta = pos as f32 * hp.rope_freq_scale;
            for _ in 0..hp.n_rot / 2 {
                cs.push(theta.cos());
                cs.push(theta.sin());
                theta *= theta_scale;
            }
            cs
        };
        let rope = |v: &mut [f32], cs: &[f32]| match hp.rope_type {
            RopeType::Norm => r::rope_norm_ref(v, hd, cs),
            RopeType::Neox => r::rope_neox_ref(v, hd, cs),
        };

        let mut x = vec![0.0f32; d]; // [d]
        model.tok_embd().row_f32(tok as usize, &mut x);
        for v in &mut x {
            *v *= hp.embd_scale;
        }

        for l in 0..hp.n_layer {
            let lw = model.layer(l);
            let mut xn = vec![0.0f32; d]; // [d]
            r::rms_norm_ref(&x, lw.attn_norm, hp.rms_eps, &mut xn);
            let mut q = matvec(&lw.wq, &xn); // [n_head * hd]
            let mut k = matvec(&lw.wk, &xn); // [n_head_kv * hd]
            let mut v = matvec(&lw.wv, &xn); // [n_head_kv * hd]
            for (y, b) in [(&mut q, lw.bq), (&mut k, lw.bk), (&mut v, lw.bv)] {
                if let Some(b) = b {
                    r::add_ref(y, b);
                }
            }
            if let (Some(qn), Some(kn)) = (lw.q_norm, lw.k_norm) {
                rms_norm_pieces(&mut q, qn, hp.rms_eps);
                rms_norm_pieces(&mut k, kn, hp.rms_eps);
            }
            let cs = angles(hp.rope_base(l));
            rope(&mut q, &cs);
            rope(&mut k, &cs);
            key_cache[l].push(round_kv(&k, kv_type));
            value_cache[l].push(round_kv(&v, kv_type));

            // A sliding window sees the last `window` positions, its own included.
            let first = match hp.sliding_window {
                Some(w) if hp.slides(l) => (pos + 1).saturating_sub(w.window),
                _ => 0,
            };
            let mut att = vec![0.0f32; hp.q_dim()]; // [n_head * hd]
            for h in 0..hp.n_head {
                let g = h / group;
                let qh = &q[h * hd..(h + 1) * hd];
                let mut s: Vec<f32> = key_cache[l][first..] // [pos + 1 - first]
                    .iter()
                    .map(|kr| r::dot_f32_ref(&kr[g * hd..(g + 1) * hd], qh) * scale)
                    .collect();
                r::softmax_ref(&mut s);
                let out = &mut att[h * hd..(h + 1) * hd];
                for (p, vr) in s.iter().zip(&value_cache[l][first..]) {
                    r::axpy_f32_ref(out, *p, &vr[g * hd..(g + 1) * hd]);
                }
            }
            let mut o = matvec(&lw.wo, &att); // [d]
            if let Some(w) = lw.post_attn_norm {
                rms_norm_pieces(&mut o, w, hp.rms_eps);
            }
            r::add_ref(&mut x, &o);

            r::rms_norm_ref(&x, lw.ffn_norm, hp.rms_eps, &mut xn);
            let gate = matvec(&lw.w_gate, &xn); // [n_ff]
            let up = matvec(&lw.w_up, &xn); // [n_ff]
            let mut hbuf = vec![0.0f32; hp.n_ff]; // [n_ff]
            match hp.ffn_act {
                FfnAct::Silu => r::silu_mul_ref(&gate, &up, &mut hbuf),
                FfnAct::GeluTanh => r::gelu_mul_ref(&gate, &up, &mut hbuf),
            }
            let mut down = matvec(&lw.w_down, &hbuf); // [d]
            if let Some(w) = lw.post_ffn_norm {
                rms_norm_pieces(&mut down, w, hp.rms_eps);
            }
            r::add_ref(&mut x, &down);
        }
        let mut xn = vec![0.0f32; d];
        r::rms_norm_ref(&x, model.output_norm(), hp.rms_eps, &mut xn);
        all.push(matvec(&model.output(), &xn)); // [vocab]
    }
    all
}
