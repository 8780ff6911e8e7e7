//! Hyper-parameters from GGUF metadata, checked against caps so that a hostile file cannot
//! make the engine allocate without bound or divide by zero.

use super::ModelError;
use crate::gguf::Metadata;

/// How RoPE pairs dimensions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeType {
    /// Adjacent pairs (LLaMA; ggml mode 0).
    Norm,
    /// Halves (GPT-NeoX, Qwen2; ggml mode 2).
    Neox,
}

/// The shape of a llama-family transformer.
#[derive(Clone, Debug, PartialEq)]
pub struct HParams {
    pub arch: String,
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub n_ff: usize,
    pub n_vocab: usize,
    /// Context the model was trained for (a warning past it, not an error).
    pub n_ctx_train: usize,
    /// Rotated dimensions per head (≤ head_dim, even).
    pub n_rot: usize,
    pub rope_freq_base: f32,
    pub rope_freq_scale: f32,
    pub rope_type: RopeType,
    pub rms_eps: f32,
}

/// Architectures whose graph is the llama one (biases optional).
const ARCHES: [(&str, RopeType); 3] = [
    ("llama", RopeType::Norm),
    ("qwen2", RopeType::Neox),
    ("mistral", RopeType::Norm),
];

/// Most tokens in a vocabulary.
const MAX_VOCAB: usize = 1 << 22;

fn cap(key: &str, v: usize, max: usize) -> Result<usize, ModelError> {
    if v == 0 || v > max {
        return Err(ModelError::BadHParam {
            key: key.to_string(),
            value: v.to_string(),
            why: format!("must be in 1..={max}"),
        });
    }
    Ok(v)
}

impl HParams {
    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }
    pub fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }
    /// Query heads per KV head (grouped-query attention; loading checks that it divides).
    pub fn group(&self) -> usize {
        self.n_head / self.n_head_kv
    }

    /// Reads and checks the hyper-parameters of a model we run; `n_vocab` is the length of
    /// the token list.
    pub fn from_metadata(md: &Metadata, n_vocab: usize) -> Result<HParams, ModelError> {
        let arch = md.architecture()?;
        if !ARCHES.iter().any(|(a, _)| *a == arch) {
            return Err(ModelError::UnsupportedArch(arch.to_string()));
        }
        let hp = HParams::describe(md, n_vocab)?;
        cap("tokenizer.ggml.tokens", hp.n_vocab, MAX_VOCAB)?;
        Ok(hp)
    }

    /// As [`HParams::from_metadata`], to describe a model that may not run here (`inspect`):
    /// an architecture we do not run is read with the llama keys under its own prefix (RoPE
    /// type: llama's), and the token list may be empty (a file without a tokenizer). Every
    /// count is still checked against the same caps, so sizes computed from them are bounded.
    pub fn describe(md: &Metadata, n_vocab: usize) -> Result<HParams, ModelError> {
        let arch = md.architecture()?.to_string();
        let rope_type = ARCHES
            .iter()
            .find(|(a, _)| *a == arch)
            .map_or(RopeType::Norm, |&(_, r)| r);
        let key = |k: &str| format!("{arch}.{k}");
        let get =
            |k: &str| -> Result<usize, ModelError> { md.get_usize(&key(k)).map_err(Into::into) };
        let opt = |k: &str| -> Result<Option<usize>, ModelError> {
            md.opt_usize(&key(k)).map_err(Into::into)
        };

        let n_layer = cap(&key("block_count"), get("block_count")?, 1024)?;
        let n_embd = cap(&key("embedding_length"), get("embedding_length")?, 1 << 16)?;
        let n_ff = cap(
            &key("feed_forward_length"),
            get("feed_forward_length")?,
            1 << 18,
        )?;
        let n_head = cap(
            &key("attention.head_count"),
            get("attention.head_count")?,
            1024,
        )?;
        let n_head_kv = cap(
            &key("attention.head_count_kv"),
            opt("attention.head_count_kv")?.unwrap_or(n_head),
            n_head,
        )?;
        if n_head % n_head_kv != 0 {
            return Err(ModelError::BadHParam {
                key: key("attention.head_count_kv"),
                value: n_head_kv.to_string(),
                why: format!("must divide the head count {n_head}"),
            });
        }
        let head_dim = match opt("attention.key_length")? {
            Some(v) => cap(&key("attention.key_length"), v, 1024)?,
            None if n_embd % n_head == 0 => n_embd / n_head,
            None => {
                return Err(ModelError::BadHParam {
                    key: key("attention.head_count"),
                    value: n_head.to_string(),
                    why: format!("does not divide the embedding length {n_embd}"),
                });
            }
        };
        let n_rot = opt("rope.dimension_count")?.unwrap_or(head_dim);
        if n_rot == 0 || n_rot > head_dim || n_rot % 2 != 0 {
            return Err(ModelError::BadHParam {
                key: key("rope.dimension_count"),
                value: n_rot.to_string(),
                why: format!("must be even and in 2..={head_dim}"),
            });
        }
        let n_ctx_train = opt("context_length")?.unwrap_or(2048).clamp(1, 1 << 24);
        let rope_freq_base = md.opt_f32(&key("rope.freq_base"))?.unwrap_or(10000.0);
        let rope_freq_scale = match md.opt_f32(&key("rope.scale_linear"))? {
            Some(s) if s > 0.0 => 1.0 / s,
            _ => 1.0,
        };
        let rms_eps = md
            .opt_f32(&key("attention.layer_norm_rms_epsilon"))?
            .unwrap_or(1e-5);
        for (k, v) in [
            ("rope.freq_base", rope_freq_base),
            ("attention.layer_norm_rms_epsilon", rms_eps),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return Err(ModelError::BadHParam {
                    key: key(k),
                    value: v.to_string(),
                    why: "must be a positive number".into(),
                });
            }
        }
        if n_vocab != 0 {
            cap("tokenizer.ggml.tokens", n_vocab, MAX_VOCAB)?;
        }
        Ok(HParams {
            arch,
            n_layer,
            n_embd,
            n_head,
            n_head_kv,
            head_dim,
            n_ff,
            n_vocab,
            n_ctx_train,
            n_rot,
            rope_freq_base,
            rope_freq_scale,
            rope_type,
            rms_eps,
        })
    }
}
