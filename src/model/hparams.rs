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

/// The gated unit of the feed-forward block: `act(x·Wgate) ⊙ x·Wup`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FfnAct {
    /// SwiGLU (llama, qwen2, mistral).
    Silu,
    /// GeGLU with the tanh approximation of GELU (Gemma).
    GeluTanh,
}

/// Sliding-window attention: the layers it applies to attend only to the last `window`
/// positions (the query's own included), with their own RoPE base.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SlidingWindow {
    pub window: usize,
    /// Layer `l` slides iff `l % pattern < pattern - 1` (ggml's standard SWA pattern: one
    /// global layer in every `pattern`).
    pub pattern: usize,
    pub rope_freq_base: f32,
}

/// The shape of a llama-family transformer, with the variations of the graphs we run as data
/// (the forward pass has one code path; Gemma 3 is llama plus the fields from `embd_scale` on).
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
    /// The token embedding is multiplied by this (Gemma: √n_embd; else 1).
    pub embd_scale: f32,
    /// Queries and keys get a per-head RMSNorm before RoPE (`attn_q_norm`, `attn_k_norm`).
    pub qk_norm: bool,
    /// The attention and FFN outputs are RMS-normed before their residual add
    /// (`post_attention_norm`, `post_ffw_norm`).
    pub post_norms: bool,
    pub ffn_act: FfnAct,
    pub sliding_window: Option<SlidingWindow>,
}

/// What an architecture changes in the llama graph.
struct Arch {
    name: &'static str,
    rope: RopeType,
    /// Gemma: embedding scale, q/k norms, post norms, GeGLU, sliding window.
    gemma: bool,
}

/// The architectures edgellm runs (biases are optional in all).
const ARCHES: [Arch; 4] = [
    Arch {
        name: "llama",
        rope: RopeType::Norm,
        gemma: false,
    },
    Arch {
        name: "qwen2",
        rope: RopeType::Neox,
        gemma: false,
    },
    Arch {
        name: "mistral",
        rope: RopeType::Norm,
        gemma: false,
    },
    Arch {
        name: "gemma3",
        rope: RopeType::Neox,
        gemma: true,
    },
];

/// The names of [`ARCHES`], for error messages.
pub fn supported_arches() -> String {
    let names: Vec<&str> = ARCHES.iter().map(|a| a.name).collect();
    names.join(", ")
}

/// Gemma 3's sliding-window pattern (one global layer in six) and local RoPE base: neither is in
/// the GGUF files llama.cpp writes, which take them from the architecture, as we do.
const GEMMA3_SWA_PATTERN: usize = 6;
const GEMMA3_SWA_ROPE_BASE: f32 = 10000.0;

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

    /// Whether layer `l` attends through the sliding window.
    pub fn slides(&self, l: usize) -> bool {
        self.sliding_window
            .is_some_and(|w| l % w.pattern < w.pattern - 1)
    }

    /// The sliding window as the KV cache sees it.
    pub fn kv_window(&self) -> Option<crate::kv::Window> {
        self.sliding_window.map(|w| crate::kv::Window {
            size: w.window,
            pattern: w.pattern,
        })
    }

    /// The first position a query at `pos` in layer `l` attends to.
    pub fn first_visible(&self, l: usize, pos: usize) -> usize {
        match self.sliding_window {
            Some(w) if self.slides(l) => (pos + 1).saturating_sub(w.window),
            _ => 0,
        }
    }

    /// The RoPE base of layer `l`.
    pub fn rope_base(&self, l: usize) -> f32 {
        match self.sliding_window {
            Some(w) if self.slides(l) => w.rope_freq_base,
            _ => self.rope_freq_base,
        }
    }

    /// Reads and checks the hyper-parameters of a model we run; `n_vocab` is the length of
    /// the token list.
    pub fn from_metadata(md: &Metadata, n_vocab: usize) -> Result<HParams, ModelError> {
        let arch = md.architecture()?;
        if !ARCHES.iter().any(|a| a.name == arch) {
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
        let spec = ARCHES.iter().find(|a| a.name == arch);
        let rope_type = spec.map_or(RopeType::Norm, |a| a.rope);
        let gemma = spec.is_some_and(|a| a.gemma);
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
        // One width for keys and values: the cache and the attention kernels assume it.
        if let Some(v) = opt("attention.value_length")?
            && v != head_dim
        {
            return Err(ModelError::BadHParam {
                key: key("attention.value_length"),
                value: v.to_string(),
                why: format!("must equal the key length {head_dim}"),
            });
        }
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
        // Gemma 2 caps its logits with tanh; Gemma 3 has no cap. A file that asks for one
        // would run wrong here: refuse it rather than ignore the key.
        for k in ["attn_logit_softcapping", "final_logit_softcapping"] {
            if let Some(v) = md.opt_f32(&key(k))?
                && v != 0.0
            {
                return Err(ModelError::BadHParam {
                    key: key(k),
                    value: v.to_string(),
                    why: "logit soft-capping is not supported".into(),
                });
            }
        }
        let sliding_window = if gemma {
            let window = cap(
                &key("attention.sliding_window"),
                get("attention.sliding_window")?,
                1 << 24,
            )?;
            let rope_freq_base = md
                .opt_f32(&key("rope.freq_base_swa"))?
                .unwrap_or(GEMMA3_SWA_ROPE_BASE);
            if !(rope_freq_base.is_finite() && rope_freq_base > 0.0) {
                return Err(ModelError::BadHParam {
                    key: key("rope.freq_base_swa"),
                    value: rope_freq_base.to_string(),
                    why: "must be a positive number".into(),
                });
            }
            Some(SlidingWindow {
                window,
                pattern: GEMMA3_SWA_PATTERN,
                rope_freq_base,
            })
        } else {
            None
        };
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
            // ggml computes sqrtf(n_embd) in f32.
            embd_scale: if gemma { (n_embd as f32).sqrt() } else { 1.0 },
            qk_norm: gemma,
            post_norms: gemma,
            ffn_act: if gemma {
                FfnAct::GeluTanh
            } else {
                FfnAct::Silu
            },
            sliding_window,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::{Gguf, GgufWriter};
    use crate::model::synth::{SynthSpec, synth_model_bytes};

    /// The hyper-parameters of the synthetic Gemma 3, with `edit` applied to its metadata.
    fn gemma(edit: impl Fn(&mut GgufWriter)) -> Result<HParams, ModelError> {
        let g = Gguf::from_bytes("g.gguf", synth_model_bytes(&SynthSpec::gemma3())).unwrap();
        let mut w = GgufWriter::new();
        w.set_all(g.metadata());
        edit(&mut w);
        let g = Gguf::from_bytes("g.gguf", w.to_bytes().unwrap()).unwrap();
        HParams::from_metadata(g.metadata(), 300)
    }

    #[test]
    fn gemma3_slides_on_five_layers_of_six_with_its_own_rope_base() {
        let hp = gemma(|w| {
            w.set_u32("gemma3.block_count", 18);
        })
        .unwrap();
        let global: Vec<usize> = (0..18).filter(|&l| !hp.slides(l)).collect();
        assert_eq!(global, [5, 11, 17]);
        assert_eq!((hp.rope_base(0), hp.rope_base(5)), (10000.0, 1e6));
        // Window 4: position p sees p-3..=p on a sliding layer, everything on a global one.
        assert_eq!([0, 3, 4, 9].map(|p| hp.first_visible(0, p)), [0, 0, 1, 6]);
        assert_eq!(hp.first_visible(5, 9), 0);
        assert_eq!(hp.embd_scale, 8.0);
        assert!(hp.qk_norm && hp.post_norms && hp.ffn_act == FfnAct::GeluTanh);
        assert_eq!(hp.head_dim, 48, "from attention.key_length");
        // The base comes from the file when it has one.
        let hp = gemma(|w| {
            w.set_f32("gemma3.rope.freq_base_swa", 5000.0);
        })
        .unwrap();
        assert_eq!(hp.rope_base(0), 5000.0);
    }

    #[test]
    fn gemma3_keys_we_cannot_honour_are_errors() {
        for (edit, want) in [
            (
                &(|w: &mut GgufWriter| {
                    w.set_f32("gemma3.final_logit_softcapping", 30.0);
                }) as &dyn Fn(&mut GgufWriter),
                "gemma3.final_logit_softcapping",
            ),
            (
                &|w: &mut GgufWriter| {
                    w.set_f32("gemma3.attn_logit_softcapping", 50.0);
                },
                "soft-capping is not supported",
            ),
            (
                &|w: &mut GgufWriter| {
                    w.set_u32("gemma3.attention.value_length", 64);
                },
                "must equal the key length 48",
            ),
            (
                &|w: &mut GgufWriter| {
                    w.set_u32("gemma3.attention.sliding_window", 0);
                },
                "gemma3.attention.sliding_window",
            ),
            (
                &|w: &mut GgufWriter| {
                    w.set_f32("gemma3.rope.freq_base_swa", f32::NAN);
                },
                "must be a positive number",
            ),
        ] {
            let e = gemma(edit).unwrap_err().to_string();
            assert!(e.contains(want), "{e}");
        }
        // A soft-cap of 0 is llama.cpp's "off".
        gemma(|w| {
            w.set_f32("gemma3.final_logit_softcapping", 0.0);
        })
        .unwrap();
    }

    #[test]
    fn an_architecture_we_do_not_run_is_named_with_the_ones_we_do() {
        let e = gemma(|w| {
            w.set_str("general.architecture", "gemma2");
        })
        .unwrap_err()
        .to_string();
        assert_eq!(
            e,
            "architecture 'gemma2' is not supported (edgellm runs llama, qwen2, mistral, \
             gemma3 graphs)"
        );
    }
}
