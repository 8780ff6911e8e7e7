//! The llama forward pass over a chunk of tokens, on buffers sized once at load.
//!
//! Shapes (d = n_embd, qd = n_head·head_dim, kvd = n_head_kv·head_dim, T = tokens in chunk):
//! ```text
//! x[T][d] = embed(tokens) (· √d for Gemma)
//! per layer:  xn = rmsnorm(x)·attn_norm            [T][d]
//!             q,k,v = xn·Wq, xn·Wk, xn·Wv (+bias)   [T][qd], [T][kvd], [T][kvd]
//!             (Gemma: q, k = rmsnorm(q, k)·q_norm, k_norm per head)
//!             rope(q, k) at positions pos0..pos0+T; K/V rows → cache[layer][pos]
//!             att[t][h] = softmax(q[t][h]·K[first..=pos]ᵀ / √hd) · V   [T][qd]
//!             o = att·Wo (Gemma: o = rmsnorm(o)·post_attention_norm);  x += o
//!             xn = rmsnorm(x)·ffn_norm
//!             f = (act(xn·Wgate) ⊙ xn·Wup)·Wdown (Gemma: f = rmsnorm(f)·post_ffw_norm); x += f
//! logits = rmsnorm(x[T-1])·output_norm · Woutput   [vocab]
//! ```
//! `act` is SiLU, or tanh-GELU for Gemma; `first` is 0, or on Gemma's sliding-window layers
//! the oldest position in the window (which also have their own RoPE base).
//! Matrix products run on the pool, split by rows; attention is split by (token, KV head).
//! Every row and every head is computed whole by one thread, so logits do not depend on the
//! thread count. Nothing here allocates.
//!
//! The T tokens are a chunk of one sequence (a prompt), or one token of each of T sequences
//! (decoding several sessions in one step, [`Seqs`]): the weight products run over the T
//! tokens either way, and a (row, token) result of a product does not depend on the tokens
//! beside it, so a session's logits have the same bits alone or in any batch.
//!
//! Each op is timed into `Arena::prof` when profiling is on (one branch per op when off).

use super::matrix::{
    ActKind, ActNeed, ActScratch, Mat, by_token, matmul, transpose_into, transpose_into_lines,
};
use super::{FfnAct, HParams, Model, RopeType};
use crate::kv::KvCache;
use crate::runtime::{Op, Pool, Profile};
use kernels_neon::{Kernels, PACK_ROWS};

/// Every activation buffer of the forward pass, sized at load for `chunk` tokens. Shapes are
/// for a chunk of T ≤ `chunk` tokens, row-major, `d` = n_embd, `qd` = n_head·head_dim,
/// `kvd` = n_head_kv·head_dim, `ff` = n_ff; only the first T rows are used.
pub struct Arena {
    /// Tokens per forward pass the buffers hold.
    pub chunk: usize,
    /// `[chunk][d]` the residual stream.
    x: Vec<f32>,
    /// `[chunk][d]` the normed residual going into a block, then the block's output before it
    /// is added to `x`.
    xn: Vec<f32>,
    /// `[chunk][qd]` queries, heads side by side (rotated in place).
    q: Vec<f32>,
    /// `[chunk][kvd]` this chunk's keys (rotated in place), before they go to the cache.
    k: Vec<f32>,
    /// `[chunk][kvd]` this chunk's values, likewise.
    v: Vec<f32>,
    /// `[chunk][qd]` attention output, heads side by side.
    att: Vec<f32>,
    /// `[chunk][ff]` FFN gate projection.
    gate: Vec<f32>,
    /// `[chunk][ff]` FFN up projection, then `silu(gate) · up`.
    up: Vec<f32>,
    /// `[row][tok]` output of a batched product, before transposing (rows ≤ max(d, qd, ff));
    /// when decoding, one token's fused `[qd + 2·kvd]` q|k|v or `[2·ff]` gate|up product.
    tmp: Vec<f32>,
    /// `[thread][group][n_ctx]` attention scores: per thread, one row of positions per query
    /// head of the KV head's group it is on.
    scores: Vec<f32>,
    /// `[chunk][max(d, qd, ff) / 32]` Q8_0 and Q8_1 blocks: a product's input quantized.
    acts: ActScratch,
    /// `[chunk][n_rot / 2][cos, sin]` the rotation of the chunk's positions and rotated pairs,
    /// computed per forward pass: a table of every position would cost `n_ctx × n_rot` floats
    /// (64 MiB for Gemma 3's two bases at 32k) to save a few microseconds a token.
    rope: Vec<f32>,
    /// The same for the sliding-window layers' base (empty without a sliding window).
    rope_local: Vec<f32>,
    /// `[n_vocab]` logits of the last token of the last chunk.
    pub logits: Vec<f32>,
    /// `[batch][n_vocab]` logits of a step over several sessions (empty for a batch of 1).
    pub batch_logits: Vec<f32>,
    /// `[Op]` per-op times (a fixed table: turning it on allocates nothing).
    pub prof: Profile,
}

/// The rotations of positions `pos0..` into `out` (`n_rot` floats a position), as ggml
/// computes them: θ starts at the position and is multiplied by `base^(-2/n_rot)` once per pair
/// (in f32, like ggml, so the angles match).
fn rope_rows(hp: &HParams, base: f32, pos0: usize, out: &mut [f32]) {
    let n_rot = hp.n_rot;
    let theta_scale = base.powf(-2.0 / n_rot as f32);
    for (p, row) in (pos0..).zip(out.chunks_exact_mut(n_rot)) {
        let mut theta = p as f32 * hp.rope_freq_scale;
        for cs in row.chunks_exact_mut(2) {
            cs[0] = theta.cos();
            cs[1] = theta.sin();
            theta *= theta_scale;
        }
    }
}

impl Arena {
    /// Allocates everything a chunk of `chunk` tokens at up to `n_ctx` positions needs, and
    /// the logits of a step over `batch` sessions (`batch` ≤ `chunk`).
    pub fn new(hp: &HParams, chunk: usize, n_ctx: usize, n_threads: usize, batch: usize) -> Arena {
        let (d, qd, kvd, ff) = (hp.n_embd, hp.q_dim(), hp.kv_dim(), hp.n_ff);
        let widest = d.max(qd).max(ff);
        // `tmp` also takes one token's fused q|k|v or gate|up product when decoding.
        let tmp = (chunk * widest).max(qd + 2 * kvd).max(2 * ff);
        Arena {
            chunk,
            x: vec![0.0; chunk * d],
            xn: vec![0.0; chunk * d],
            q: vec![0.0; chunk * qd],
            k: vec![0.0; chunk * kvd],
            v: vec![0.0; chunk * kvd],
            att: vec![0.0; chunk * qd],
            gate: vec![0.0; chunk * ff],
            up: vec![0.0; chunk * ff],
            tmp: vec![0.0; tmp],
            scores: vec![0.0; n_threads.max(1) * hp.group() * n_ctx],
            acts: ActScratch::new(chunk, widest),
            rope: vec![0.0; chunk * hp.n_rot],
            rope_local: match hp.sliding_window {
                Some(_) => vec![0.0; chunk * hp.n_rot],
                None => Vec::new(),
            },
            logits: vec![0.0; hp.n_vocab],
            batch_logits: vec![0.0; batch_logits(hp, batch)],
            prof: Profile::default(),
        }
    }

    /// Bytes [`Arena::new`] would allocate for these sizes, without allocating them (the
    /// daemon checks them against the board's memory budget before it loads anything).
    pub fn bytes_for(
        hp: &HParams,
        chunk: usize,
        n_ctx: usize,
        n_threads: usize,
        batch: usize,
    ) -> usize {
        let (d, qd, kvd, ff) = (hp.n_embd, hp.q_dim(), hp.kv_dim(), hp.n_ff);
        let widest = d.max(qd).max(ff);
        let tmp = (chunk * widest).max(qd + 2 * kvd).max(2 * ff);
        let floats = chunk * (2 * d + 2 * qd + 2 * kvd + 2 * ff)
            + tmp
            + n_threads.max(1) * hp.group() * n_ctx
            + chunk * hp.n_rot * (1 + usize::from(hp.sliding_window.is_some()))
            + hp.n_vocab
            + batch_logits(hp, batch);
        4 * floats + ActScratch::bytes_for(chunk, widest)
    }

    /// Bytes held (for `inspect` and status).
    pub fn bytes(&self) -> usize {
        4 * (self.x.len()
            + self.xn.len()
            + self.q.len()
            + self.k.len()
            + self.v.len()
            + self.att.len()
            + self.gate.len()
            + self.up.len()
            + self.tmp.len()
            + self.scores.len()
            + self.rope.len()
            + self.rope_local.len()
            + self.logits.len()
            + self.batch_logits.len())
            + self.acts.bytes()
    }
}

/// Floats of [`Arena::batch_logits`]: none for a batch of one, whose logits are the last
/// token's.
fn batch_logits(hp: &HParams, batch: usize) -> usize {
    if batch > 1 { batch * hp.n_vocab } else { 0 }
}

/// The sequences a forward pass's tokens belong to, and their positions.
pub enum Seqs<'a, 'k> {
    /// A chunk of one sequence: token `t` at position `pos0 + t` of `kv`.
    One { kv: &'a mut KvCache, pos0: usize },
    /// One token of each of several sequences: token `t` at position `pos[t]` of `kvs[t]`.
    Each {
        kvs: &'a mut [&'k mut KvCache],
        pos: &'a [usize],
    },
}

impl Seqs<'_, '_> {
    /// The position of token `t`.
    fn pos(&self, t: usize) -> usize {
        match self {
            Seqs::One { pos0, .. } => pos0 + t,
            Seqs::Each { pos, .. } => pos[t],
        }
    }
    /// The cache token `t` goes into and attends over.
    fn kv(&self, t: usize) -> &KvCache {
        match self {
            Seqs::One { kv, .. } => kv,
            Seqs::Each { kvs, .. } => kvs[t],
        }
    }
    fn kv_mut(&mut self, t: usize) -> &mut KvCache {
        match self {
            Seqs::One { kv, .. } => kv,
            Seqs::Each { kvs, .. } => kvs[t],
        }
    }
    /// Makes room in every cache for the `n` tokens' positions (see [`KvCache::make_room`]).
    fn make_room(&mut self, n: usize) {
        match self {
            Seqs::One { kv, pos0 } => kv.make_room(*pos0, n),
            Seqs::Each { kvs, pos } => {
                for (kv, &p) in kvs.iter_mut().zip(pos.iter()) {
                    kv.make_room(p, 1);
                }
            }
        }
    }
    /// Whether the tokens' positions fit their caches.
    fn fit(&self, n: usize) -> bool {
        match self {
            Seqs::One { kv, pos0 } => pos0 + n <= kv.n_ctx(),
            Seqs::Each { kvs, pos } => {
                kvs.len() == n && pos.len() == n && (0..n).all(|t| pos[t] < kvs[t].n_ctx())
            }
        }
    }
}

fn need(ms: &[&Mat<'_>]) -> ActNeed {
    [ActKind::Q8_0, ActKind::Q8_1, ActKind::Q8K].map(|a| ms.iter().any(|m| m.act_kind() == a))
}

/// Bytes of each KV head's key (and value) run prefetched at the start of a decoded token's
/// layer: 16 positions of SmolLM2's heads, from where the hardware prefetchers follow. The
/// prefetches themselves wait on the core's outstanding misses, so more costs more than it
/// saves (measured on Zen 4 with `--profile`, tg64: 2 KB best of 1-8 KB).
const KV_PREFETCH_BYTES: usize = 2 << 10;

/// Runs the layers over `tokens` at the positions `seqs` gives them; writes their K/V rows into
/// their caches and, if `want_logits`, the last token's logits into `arena.logits`. The caller
/// checks that the tokens are in the vocabulary and fit in the chunk and the context.
///
/// Each step is one op of the profile: `prof.timed(op, || step)`.
#[allow(clippy::too_many_arguments)] // the forward pass's inputs: no struct would be clearer
pub fn forward(
    k: &Kernels,
    pool: &Pool,
    model: &Model,
    ar: &mut Arena,
    mut seqs: Seqs<'_, '_>,
    tokens: &[u32],
    want_logits: bool,
) {
    let hp = &model.hp;
    let n = tokens.len();
    debug_assert!(n > 0 && n <= ar.chunk && seqs.fit(n));
    // The sliding-window layers' rings take the tokens' positions.
    seqs.make_room(n);
    let (d, qd, kvd, hd, ff) = (hp.n_embd, hp.q_dim(), hp.kv_dim(), hp.head_dim, hp.n_ff);
    let (nd, nqd, nff) = (n * d, n * qd, n * ff);
    let eps = hp.rms_eps;
    let rope = match hp.rope_type {
        RopeType::Norm => k.rope_norm,
        RopeType::Neox => k.rope_neox,
    };
    let glu = match hp.ffn_act {
        FfnAct::Silu => k.silu_mul,
        FfnAct::GeluTanh => k.gelu_mul,
    };
    // The packed weights when this path has products over them (the engine packed the model).
    let pk = packed_for(k, model);
    let prof = &mut ar.prof;

    // x = embed(tokens)
    prof.timed(Op::Embed, || {
        let embd = model.tok_embd_in(pk);
        for (&tok, x) in tokens.iter().zip(ar.x.chunks_exact_mut(d)) {
            embd.row_f32(tok as usize, x);
        }
        if hp.embd_scale != 1.0 {
            (k.scale)(&mut ar.x[..nd], hp.embd_scale);
        }
    });

    for l in 0..hp.n_layer {
        let lw = model.layer_in(l, pk);
        if n == 1 {
            seqs.kv(0).prefetch(l, seqs.pos(0), KV_PREFETCH_BYTES);
        }

        // xn = rmsnorm(x) · attn_norm
        prof.timed(Op::RmsNorm, || {
            rms_norm_rows(k, &ar.x[..nd], lw.attn_norm, eps, &mut ar.xn[..nd]);
        });
        // q, k, v = xn·Wq, xn·Wk, xn·Wv (+ bias)
        let a = prof.timed(Op::Quantize, || {
            ar.acts
                .quantize(k, pool, &ar.xn[..nd], n, need(&[&lw.wq, &lw.wk, &lw.wv]))
        });
        let parts = [
            (Op::AttnQ, &lw.wq, &mut ar.q, lw.bq),
            (Op::AttnK, &lw.wk, &mut ar.k, lw.bk),
            (Op::AttnV, &lw.wv, &mut ar.v, lw.bv),
        ];
        match lw.qkv.filter(|_| n == 1) {
            // Decoding: one product over q, k and v packed side by side, one pass over
            // their weights (and one hand-off between threads instead of three).
            Some(fused) => {
                let bytes = [
                    (Op::AttnQ, lw.wq.bytes()),
                    (Op::AttnK, lw.wk.bytes()),
                    (Op::AttnV, lw.wv.bytes()),
                ];
                prof.timed_fused(&bytes, || {
                    matmul(k, pool, &fused, &a, &mut ar.tmp[..fused.rows]);
                    let mut at = 0;
                    for (_, m, out, bias) in parts {
                        out[..m.rows].copy_from_slice(&ar.tmp[at..at + m.rows]);
                        if let Some(b) = bias {
                            (k.add)(&mut out[..m.rows], b);
                        }
                        at += m.rows;
                    }
                });
            }
            None => {
                for (op, m, out, bias) in parts {
                    // The bias add is counted with its product (it is the product's epilogue).
                    prof.timed_bytes(op, m.bytes(), || {
                        mat_into(k, pool, m, &a, &mut ar.tmp, out);
                        if let Some(b) = bias {
                            for row in out[..n * m.rows].chunks_exact_mut(m.rows) {
                                (k.add)(row, b);
                            }
                        }
                    });
                }
            }
        }
        // q, k = rmsnorm(q, k) · q_norm, k_norm, head by head
        if let (Some(qn), Some(kn)) = (lw.q_norm, lw.k_norm) {
            prof.timed(Op::RmsNorm, || {
                rms_norm_in_place(k, &mut ar.q[..nqd], qn, eps, &mut ar.tmp);
                rms_norm_in_place(k, &mut ar.k[..n * kvd], kn, eps, &mut ar.tmp);
            });
        }
        // q, k = rope(q, k) at positions pos0..pos0+T
        prof.timed(Op::Rope, || {
            let n_rot = hp.n_rot;
            if l == 0 {
                // The rotations of this pass's positions, for both bases, once a pass (a
                // position's rotation depends on the position only).
                let bases = [
                    Some(hp.rope_freq_base),
                    hp.sliding_window.map(|w| w.rope_freq_base),
                ];
                for (base, table) in bases.into_iter().zip([&mut ar.rope, &mut ar.rope_local]) {
                    let Some(base) = base else { continue };
                    for (t, row) in table[..n * n_rot].chunks_exact_mut(n_rot).enumerate() {
                        rope_rows(hp, base, seqs.pos(t), row);
                    }
                }
            }
            let table = if hp.slides(l) {
                &ar.rope_local
            } else {
                &ar.rope
            };
            for t in 0..n {
                let cs = &table[t * n_rot..(t + 1) * n_rot];
                rope(&mut ar.q[t * qd..(t + 1) * qd], hd, cs);
                rope(&mut ar.k[t * kvd..(t + 1) * kvd], hd, cs);
            }
        });
        // cache[l][pos(t)] = k[t], v[t]: a loop of its own (rather than fused with rope) so
        // that its time is measured apart.
        prof.timed(Op::KvStore, || {
            for t in 0..n {
                let (kt, vt) = (&ar.k[t * kvd..(t + 1) * kvd], &ar.v[t * kvd..(t + 1) * kvd]);
                let p = seqs.pos(t);
                seqs.kv_mut(t).store(k, l, p, kt, vt);
            }
        });
        // att[t][h] = softmax(q[t][h]·K[first..=pos]ᵀ / √hd) · V
        prof.timed(Op::Attention, || {
            let (q, att) = (&ar.q[..nqd], &mut ar.att[..nqd]);
            attention(k, pool, hp, &seqs, l, q, att, &mut ar.scores);
        });
        // x += att·Wo
        let a = prof.timed(Op::Quantize, || {
            ar.acts
                .quantize(k, pool, &ar.att[..nqd], n, need(&[&lw.wo]))
        });
        prof.timed_bytes(Op::AttnOutput, lw.wo.bytes(), || {
            mat_into(k, pool, &lw.wo, &a, &mut ar.tmp, &mut ar.xn);
        });
        if let Some(w) = lw.post_attn_norm {
            prof.timed(Op::RmsNorm, || {
                rms_norm_in_place(k, &mut ar.xn[..nd], w, eps, &mut ar.tmp);
            });
        }
        prof.timed(Op::Residual, || (k.add)(&mut ar.x[..nd], &ar.xn[..nd]));

        // xn = rmsnorm(x) · ffn_norm
        prof.timed(Op::RmsNorm, || {
            rms_norm_rows(k, &ar.x[..nd], lw.ffn_norm, eps, &mut ar.xn[..nd]);
        });
        // up = act(xn·Wgate) ⊙ xn·Wup
        let a = prof.timed(Op::Quantize, || {
            ar.acts
                .quantize(k, pool, &ar.xn[..nd], n, need(&[&lw.w_gate, &lw.w_up]))
        });
        match lw.gate_up.filter(|_| n == 1) {
            // Decoding: gate and up in one product, as q/k/v above; the gated unit reads
            // both halves where the product left them.
            Some(fused) => {
                let bytes = [
                    (Op::FfnGate, lw.w_gate.bytes()),
                    (Op::FfnUp, lw.w_up.bytes()),
                ];
                prof.timed_fused(&bytes, || {
                    matmul(k, pool, &fused, &a, &mut ar.tmp[..fused.rows]);
                });
                prof.timed(Op::Glu, || {
                    let (gate, up) = ar.tmp[..2 * ff].split_at(ff);
                    glu(gate, up, &mut ar.up[..ff]);
                });
            }
            None => {
                prof.timed_bytes(Op::FfnGate, lw.w_gate.bytes(), || {
                    mat_into(k, pool, &lw.w_gate, &a, &mut ar.tmp, &mut ar.gate);
                });
                prof.timed_bytes(Op::FfnUp, lw.w_up.bytes(), || {
                    mat_into(k, pool, &lw.w_up, &a, &mut ar.tmp, &mut ar.up);
                });
                prof.timed(Op::Glu, || {
                    glu_in_place(pool, glu, &ar.gate[..nff], &mut ar.up[..nff], n);
                });
            }
        }
        // x += up·Wdown
        let a = prof.timed(Op::Quantize, || {
            ar.acts
                .quantize(k, pool, &ar.up[..nff], n, need(&[&lw.w_down]))
        });
        prof.timed_bytes(Op::FfnDown, lw.w_down.bytes(), || {
            mat_into(k, pool, &lw.w_down, &a, &mut ar.tmp, &mut ar.xn);
        });
        if let Some(w) = lw.post_ffn_norm {
            prof.timed(Op::RmsNorm, || {
                rms_norm_in_place(k, &mut ar.xn[..nd], w, eps, &mut ar.tmp);
            });
        }
        prof.timed(Op::Residual, || (k.add)(&mut ar.x[..nd], &ar.xn[..nd]));
    }

    if want_logits {
        // logits = rmsnorm(x[T-1]) · output_norm · Woutput
        let output = model.output_in(pk);
        prof.timed(Op::RmsNorm, || {
            let last = &ar.x[(n - 1) * d..nd];
            rms_norm_rows(k, last, model.output_norm(), eps, &mut ar.xn[..d]);
        });
        let a = prof.timed(Op::Quantize, || {
            ar.acts.quantize(k, pool, &ar.xn[..d], 1, need(&[&output]))
        });
        prof.timed_bytes(Op::Output, output.bytes(), || {
            matmul(k, pool, &output, &a, &mut ar.logits);
        });
    }
}

/// The logits of the tokens `rows` of the chunk the last [`forward`] ran over (whose final
/// residual stream stays in `ar.x`) into `out`, `[rows.len()][n_vocab]`, token-major: what
/// scoring a text needs (perplexity, KL divergence), where [`forward`] computes only the last
/// token's. Call it after a [`forward`] of at least `rows.end` tokens.
///
/// Only the caller's `out` is new: the product runs over slices of the vocabulary small enough
/// for `ar.tmp` (the kernels write `[row][token]`), each transposed into its columns of `out`,
/// so the arena stays as sized at load and the decode path does not pay for this. The output
/// matrix is still read once for all the tokens.
///
/// A token's logits have the bits [`forward`] gives when that token is the last: its norm and
/// the quantization of its activations depend on its row only, and a product's (row, token)
/// result does not depend on the rows or tokens computed with it (`kernels_neon`'s
/// `tests/exactness.rs` and `tests/row_split.rs`), whatever the slice.
pub fn logits_rows(
    k: &Kernels,
    pool: &Pool,
    model: &Model,
    ar: &mut Arena,
    rows: std::ops::Range<usize>,
    out: &mut [f32],
) {
    let (d, n_vocab) = (model.hp.n_embd, model.hp.n_vocab);
    let m = rows.len();
    assert!(m > 0 && rows.end <= ar.chunk && out.len() >= m * n_vocab);
    let output = model.output_in(packed_for(k, model));
    let prof = &mut ar.prof;
    prof.timed(Op::RmsNorm, || {
        let x = &ar.x[rows.start * d..rows.end * d];
        rms_norm_rows(
            k,
            x,
            model.output_norm(),
            model.hp.rms_eps,
            &mut ar.xn[..m * d],
        );
    });
    let a = prof.timed(Op::Quantize, || {
        ar.acts
            .quantize(k, pool, &ar.xn[..m * d], m, need(&[&output]))
    });
    // Vocabulary rows per slice: as many as `tmp` holds for `m` tokens, in whole packed
    // groups (`tmp` holds at least `chunk × n_embd` floats, so a slice is never empty).
    let per = (ar.tmp.len() / m) / PACK_ROWS * PACK_ROWS;
    debug_assert!(per > 0);
    prof.timed_bytes(Op::Output, output.bytes(), || {
        for r0 in (0..n_vocab).step_by(per) {
            let r1 = (r0 + per).min(n_vocab);
            let slice = output.row_slice(r0, r1);
            let tmp = &mut ar.tmp[..slice.rows * m];
            matmul(k, pool, &slice, &a, tmp);
            transpose_into_lines(
                pool,
                tmp,
                slice.rows,
                m,
                &mut out[..m * n_vocab],
                n_vocab,
                r0,
            );
        }
    });
}

/// `out[t] = rmsnorm(x[t]) · w` for every row `t` of `x` (`[T][d]`, `d` = `w.len()`).
fn rms_norm_rows(k: &Kernels, x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let d = w.len();
    for (xt, ot) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        (k.rms_norm)(xt, w, eps, ot);
    }
}

/// `x[i] = rmsnorm(x[i]) · w` for every `w.len()`-wide piece `i` of `x` (rows, or heads),
/// through `tmp` (the kernel takes separate in/out slices).
fn rms_norm_in_place(k: &Kernels, x: &mut [f32], w: &[f32], eps: f32, tmp: &mut [f32]) {
    let t = &mut tmp[..w.len()];
    for xi in x.chunks_exact_mut(w.len()) {
        (k.rms_norm)(xi, w, eps, t);
        xi.copy_from_slice(t);
    }
}

/// A gated-unit kernel: `out = act(gate) · up`.
type Glu = fn(&[f32], &[f32], &mut [f32]);

/// `up = act(gate) · up`, through the kernel (which takes separate in/out slices); a prompt's
/// tokens split between the threads.
fn glu_in_place(pool: &Pool, glu: Glu, gate: &[f32], up: &mut [f32], n_tok: usize) {
    by_token(pool, gate, n_tok, up, &|g, u| glu_pieces(glu, g, u));
}

/// `up = glu(gate, up)` in place, on the calling thread.
fn glu_pieces(glu: Glu, gate: &[f32], up: &mut [f32]) {
    // The kernel reads `up` and writes `out`; process in stack-sized pieces to avoid aliasing
    // without a heap buffer.
    let mut buf = [0.0f32; 256];
    for (g, u) in gate.chunks(256).zip(up.chunks_mut(256)) {
        let o = &mut buf[..g.len()];
        glu(g, u, o);
        u.copy_from_slice(o);
    }
}

/// One matrix product into `out` as `[tok][row]`.
fn mat_into(
    k: &Kernels,
    pool: &Pool,
    m: &Mat<'_>,
    a: &super::matrix::Acts<'_>,
    tmp: &mut [f32],
    out: &mut [f32],
) {
    let n = a.n_tok;
    if n == 1 {
        matmul(k, pool, m, a, &mut out[..m.rows]);
    } else {
        matmul(k, pool, m, a, &mut tmp[..m.rows * n]);
        transpose_into(pool, &tmp[..m.rows * n], m.rows, n, &mut out[..m.rows * n]);
    }
}

/// Causal grouped-query attention of `q` (`[T][qd]`) over layer `l` of each token's cache, up
/// to its position. Work items are (token, KV head) pairs, each computed whole by one thread:
/// the query heads sharing a KV head go through its keys and values together.
#[allow(clippy::too_many_arguments)]
fn attention(
    k: &Kernels,
    pool: &Pool,
    hp: &HParams,
    seqs: &Seqs<'_, '_>,
    l: usize,
    q: &[f32],
    att: &mut [f32],
    scores: &mut [f32],
) {
    let hd = hp.head_dim;
    let n_kv = hp.n_head_kv;
    let group = hp.group();
    let scale = 1.0 / (hd as f32).sqrt();
    // Each thread's scores hold a row of positions per query head; the arena sized them for
    // the engine's context, which no cache exceeds.
    let per_thread = scores.len() / pool.n_threads();
    pool.run_split_scratch(att, group * hd, scores, per_thread, &|_, items, out, sc| {
        for (i, item) in items.enumerate() {
            let (t, g) = (item / n_kv, item % n_kv);
            let (kv, pos) = (seqs.kv(t), seqs.pos(t));
            let first = hp.first_visible(l, pos);
            let n_pos = pos + 1 - first;
            let qg = &q[(t * n_kv + g) * group * hd..(t * n_kv + g + 1) * group * hd];
            let s = &mut sc[..group * n_pos];
            kv.scores(k, l, g, first, qg, scale, s);
            for row in s.chunks_exact_mut(n_pos) {
                (k.softmax)(row);
            }
            let o = &mut out[i * group * hd..(i + 1) * group * hd];
            o.fill(0.0);
            kv.mix_values(k, l, g, first, s, o);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::Arena;
    use crate::model::synth::{SynthSpec, synth_model};

    #[test]
    fn the_arena_size_known_before_loading_is_the_size_allocated() {
        for spec in [
            SynthSpec::default(),
            SynthSpec {
                n_embd: 96,
                n_head: 6,
                n_head_kv: 3,
                n_ff: 224,
                n_vocab: 517,
                ..SynthSpec::default()
            },
            // A second RoPE table for the sliding-window layers.
            SynthSpec::gemma3(),
        ] {
            let hp = synth_model(&spec).hp;
            for (chunk, ctx, threads) in [(1, 1, 1), (64, 2048, 4), (7, 300, 3), (512, 33, 64)] {
                assert_eq!(
                    Arena::bytes_for(&hp, chunk, ctx, threads, chunk.min(4)),
                    Arena::new(&hp, chunk, ctx, threads, chunk.min(4)).bytes(),
                    "chunk {chunk}, ctx {ctx}, threads {threads}"
                );
            }
        }
    }
}

/// The model's packed weights, when `k` has the packed products of every format packed (else
/// the file's layout: the model was packed for another engine's path, and `k`'s own products
/// over the file's layout give its bits).
fn packed_for<'m>(k: &Kernels, model: &'m Model) -> Option<&'m super::packed::Packed> {
    model.packed().filter(|p| p.served_by(k))
}
