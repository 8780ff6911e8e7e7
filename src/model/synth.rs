//! Tiny synthetic llama models with random weights, written by our own GGUF writer: the test
//! models of the engine (numerics, threading, allocation), built in milliseconds.

use crate::gguf::{Array, GgmlType, Gguf, GgufWriter, Value};
use kernels_neon::{
    BlockFormat, BlockQ4_0, BlockQ4_1, BlockQ4K, BlockQ5_0, BlockQ5_1, BlockQ5K, BlockQ6K,
    BlockQ8_0, f16,
};

/// The shape and flavour of a synthetic model.
#[derive(Clone, Debug)]
pub struct SynthSpec {
    pub arch: &'static str,
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub n_ff: usize,
    pub n_vocab: usize,
    /// Type of the 2-D weights (the embedding too). The K-quants need `n_embd`, the query
    /// width and `n_ff` to be multiples of 256.
    pub weight_type: GgmlType,
    /// Share the embedding as output (no `output.weight`).
    pub tied: bool,
    /// q/k/v biases (Qwen2-style).
    pub biases: bool,
    /// Width of a head, when not `n_embd / n_head` (written as `attention.key_length`).
    pub head_dim: Option<usize>,
    /// For `arch = "gemma3"`: the sliding window (the other Gemma tensors come with the arch).
    pub sliding_window: usize,
    pub seed: u64,
}

impl Default for SynthSpec {
    fn default() -> Self {
        SynthSpec {
            arch: "llama",
            n_layer: 2,
            n_embd: 64,
            n_head: 4,
            n_head_kv: 2,
            n_ff: 96,
            n_vocab: 300,
            weight_type: GgmlType::Q4_0,
            tied: true,
            biases: false,
            head_dim: None,
            sliding_window: 4,
            seed: 1,
        }
    }
}

impl SynthSpec {
    /// A small Gemma 3: six layers (five sliding, one global), heads wider than
    /// `n_embd / n_head`, one KV head.
    pub fn gemma3() -> SynthSpec {
        SynthSpec {
            arch: "gemma3",
            n_layer: 6,
            n_head: 2,
            n_head_kv: 1,
            head_dim: Some(48),
            ..SynthSpec::default()
        }
    }
}

struct Rng(u64);
impl Rng {
    fn normal(&mut self, sigma: f32) -> f32 {
        let mut s = 0.0;
        for _ in 0..4 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            s += (self.0 >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
        }
        s * 1.732 * sigma
    }
}

fn quantize<B: BlockFormat>(x: &[f32]) -> Vec<u8> {
    let mut y = vec![B::default(); x.len() / B::BLOCK_LEN];
    B::quantize_row_ref(x, &mut y);
    bytemuck::cast_slice(&y).to_vec()
}

fn encode(ty: GgmlType, x: &[f32]) -> Vec<u8> {
    match ty {
        GgmlType::Q4_0 => quantize::<BlockQ4_0>(x),
        GgmlType::Q4_1 => quantize::<BlockQ4_1>(x),
        GgmlType::Q8_0 => quantize::<BlockQ8_0>(x),
        GgmlType::Q5_0 => quantize::<BlockQ5_0>(x),
        GgmlType::Q5_1 => quantize::<BlockQ5_1>(x),
        GgmlType::Q4_K => quantize::<BlockQ4K>(x),
        GgmlType::Q5_K => quantize::<BlockQ5K>(x),
        GgmlType::Q6_K => quantize::<BlockQ6K>(x),
        GgmlType::F16 => x
            .iter()
            .flat_map(|&v| f16::from_f32(v).to_le_bytes())
            .collect(),
        _ => x.iter().flat_map(|v| v.to_le_bytes()).collect(),
    }
}

/// The GGUF bytes of a synthetic model.
pub fn synth_model_bytes(spec: &SynthSpec) -> Vec<u8> {
    let s = spec;
    let mut rng = Rng(s.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut w = GgufWriter::new();
    let a = s.arch;
    let head_dim = s.head_dim.unwrap_or(s.n_embd / s.n_head);
    let gemma = a == "gemma3";
    w.set_str("general.architecture", a);
    w.set_str("general.name", "edgellm synthetic test model");
    w.set_u32(&format!("{a}.block_count"), s.n_layer as u32);
    w.set_u32(&format!("{a}.embedding_length"), s.n_embd as u32);
    w.set_u32(&format!("{a}.feed_forward_length"), s.n_ff as u32);
    w.set_u32(&format!("{a}.attention.head_count"), s.n_head as u32);
    w.set_u32(&format!("{a}.attention.head_count_kv"), s.n_head_kv as u32);
    w.set_u32(&format!("{a}.context_length"), 512);
    w.set_u32(&format!("{a}.rope.dimension_count"), head_dim as u32);
    w.set_f32(&format!("{a}.rope.freq_base"), 10000.0);
    w.set_f32(&format!("{a}.attention.layer_norm_rms_epsilon"), 1e-5);
    if s.head_dim.is_some() {
        w.set_u32(&format!("{a}.attention.key_length"), head_dim as u32);
        w.set_u32(&format!("{a}.attention.value_length"), head_dim as u32);
    }
    if gemma {
        w.set_u32(
            &format!("{a}.attention.sliding_window"),
            s.sliding_window as u32,
        );
        // The global layers' base; the sliding ones keep the architecture's 10000.
        w.set_f32(&format!("{a}.rope.freq_base"), 1e6);
    }
    w.set_str("tokenizer.ggml.model", "gpt2");
    w.set_str("tokenizer.ggml.pre", "default");
    let tokens: Vec<String> = (0..s.n_vocab)
        .map(|i| match i {
            0 => "<|endoftext|>".to_string(),
            1 => "<|im_start|>".to_string(),
            2 => "<|im_end|>".to_string(),
            _ => format!("t{i}"),
        })
        .collect();
    let types: Vec<i32> = (0..s.n_vocab).map(|i| if i < 3 { 3 } else { 1 }).collect();
    w.set_array("tokenizer.ggml.tokens", Array::String(tokens));
    w.set_array("tokenizer.ggml.token_type", Array::I32(types));
    w.set_array("tokenizer.ggml.merges", Array::String(Vec::new()));
    w.set("tokenizer.ggml.bos_token_id", Value::U32(1));
    w.set("tokenizer.ggml.eos_token_id", Value::U32(2));

    let mut mat = |w: &mut GgufWriter, name: &str, cols: usize, rows: usize| {
        let sigma = 1.0 / (cols as f32).sqrt();
        let x: Vec<f32> = (0..cols * rows).map(|_| rng.normal(sigma)).collect();
        w.add_tensor(
            name,
            s.weight_type,
            &[cols as u64, rows as u64],
            encode(s.weight_type, &x),
        )
        .expect("synthetic tensor");
    };
    let qd = s.n_head * head_dim;
    let kvd = s.n_head_kv * head_dim;
    // The embedding is larger than the other weights so that logits spread.
    mat(&mut w, "token_embd.weight", s.n_embd, s.n_vocab);
    if !s.tied {
        mat(&mut w, "output.weight", s.n_embd, s.n_vocab);
    }
    let mut rng2 = Rng(s.seed ^ 0xABCD_EF01 | 1);
    let mut vector = |w: &mut GgufWriter, name: &str, n: usize, base: f32| {
        let v: Vec<f32> = (0..n).map(|_| base + rng2.normal(0.1)).collect();
        w.add_f32(name, &[n as u64], &v).expect("synthetic vector");
    };
    vector(&mut w, "output_norm.weight", s.n_embd, 1.0);
    for l in 0..s.n_layer {
        let n = |x: &str| format!("blk.{l}.{x}");
        vector(&mut w, &n("attn_norm.weight"), s.n_embd, 1.0);
        vector(&mut w, &n("ffn_norm.weight"), s.n_embd, 1.0);
        if gemma {
            vector(&mut w, &n("attn_q_norm.weight"), head_dim, 1.0);
            vector(&mut w, &n("attn_k_norm.weight"), head_dim, 1.0);
            vector(&mut w, &n("post_attention_norm.weight"), s.n_embd, 1.0);
            vector(&mut w, &n("post_ffw_norm.weight"), s.n_embd, 1.0);
        }
        if s.biases {
            vector(&mut w, &n("attn_q.bias"), qd, 0.0);
            vector(&mut w, &n("attn_k.bias"), kvd, 0.0);
            vector(&mut w, &n("attn_v.bias"), kvd, 0.0);
        }
        mat(&mut w, &n("attn_q.weight"), s.n_embd, qd);
        mat(&mut w, &n("attn_k.weight"), s.n_embd, kvd);
        mat(&mut w, &n("attn_v.weight"), s.n_embd, kvd);
        mat(&mut w, &n("attn_output.weight"), qd, s.n_embd);
        mat(&mut w, &n("ffn_gate.weight"), s.n_embd, s.n_ff);
        mat(&mut w, &n("ffn_up.weight"), s.n_embd, s.n_ff);
        mat(&mut w, &n("ffn_down.weight"), s.n_ff, s.n_embd);
    }
    w.to_bytes().expect("synthetic model serialises")
}

/// A synthetic model, opened from memory.
pub fn synth_model(spec: &SynthSpec) -> super::Model {
    let gguf = Gguf::from_bytes("synthetic.gguf", synth_model_bytes(spec))
        .expect("synthetic model parses");
    super::Model::from_gguf(gguf).expect("synthetic model loads")
}
