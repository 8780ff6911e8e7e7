//! Which type each tensor gets: llama.cpp's `llama_tensor_get_type` (llama-quant.cpp,
//! 0c1e57098) for the file types edgellm writes, without the parts for imatrix files, MoE
//! models and the IQ types.
//!
//! - Not quantized at all: 1-D tensors, norms and the few others llama.cpp keeps
//!   ([`is_quantizable`]).
//! - The output projection (`output.weight`, or `token_embd.weight` when the embeddings are
//!   tied) gets Q6_K (Q8_0 stays Q8_0; Falcon's gets Q8_0), except in the pure K types.
//! - Q4_K_M and Q5_K_M give Q6_K to `attn_v` and `ffn_down` of the layers `use_more_bits`
//!   picks (the first and last eighth and every third between), and Q5_K / Q6_K to a fused
//!   `attn_qkv`.
//! - A row that is not whole blocks of the chosen type falls back: Q4_K → Q5_0, Q5_K → Q5_1,
//!   Q6_K → Q8_0, and to F16 if even that does not fit.

use crate::gguf::{GgmlType, Gguf, TensorInfo};
use std::str::FromStr;

/// Formats `edgellm quantize` writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QuantType {
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    /// Every matrix Q4_K, the output too (`llama-quantize --pure … Q4_K`).
    Q4K,
    /// Every matrix Q5_K, the output too (`llama-quantize --pure … Q5_K`).
    Q5K,
    Q6K,
    /// llama.cpp's Q4_K_M mix.
    Q4KM,
    /// llama.cpp's Q5_K_M mix.
    Q5KM,
    F16,
}

impl QuantType {
    pub const ALL: [QuantType; 11] = [
        QuantType::Q4_0,
        QuantType::Q4_1,
        QuantType::Q5_0,
        QuantType::Q5_1,
        QuantType::Q8_0,
        QuantType::Q4K,
        QuantType::Q5K,
        QuantType::Q6K,
        QuantType::Q4KM,
        QuantType::Q5KM,
        QuantType::F16,
    ];

    /// The ggml type of most weights.
    pub fn ggml_type(self) -> GgmlType {
        match self {
            QuantType::Q4_0 => GgmlType::Q4_0,
            QuantType::Q4_1 => GgmlType::Q4_1,
            QuantType::Q5_0 => GgmlType::Q5_0,
            QuantType::Q5_1 => GgmlType::Q5_1,
            QuantType::Q8_0 => GgmlType::Q8_0,
            QuantType::Q4K | QuantType::Q4KM => GgmlType::Q4_K,
            QuantType::Q5K | QuantType::Q5KM => GgmlType::Q5_K,
            QuantType::Q6K => GgmlType::Q6_K,
            QuantType::F16 => GgmlType::F16,
        }
    }

    /// llama.cpp's `llama_ftype`, stored as `general.file_type` (the pure K types are
    /// labelled as llama-quantize labels them, with the `_M` mix's number).
    pub fn file_type(self) -> u32 {
        match self {
            QuantType::F16 => 1,
            QuantType::Q4_0 => 2,
            QuantType::Q4_1 => 3,
            QuantType::Q8_0 => 7,
            QuantType::Q5_0 => 8,
            QuantType::Q5_1 => 9,
            QuantType::Q4K | QuantType::Q4KM => 15,
            QuantType::Q5K | QuantType::Q5KM => 17,
            QuantType::Q6K => 18,
        }
    }

    /// Lower-case name as given on the command line.
    pub fn name(self) -> &'static str {
        match self {
            QuantType::Q4_0 => "q4_0",
            QuantType::Q4_1 => "q4_1",
            QuantType::Q5_0 => "q5_0",
            QuantType::Q5_1 => "q5_1",
            QuantType::Q8_0 => "q8_0",
            QuantType::Q4K => "q4_k",
            QuantType::Q5K => "q5_k",
            QuantType::Q6K => "q6_k",
            QuantType::Q4KM => "q4_k_m",
            QuantType::Q5KM => "q5_k_m",
            QuantType::F16 => "f16",
        }
    }

    /// Every matrix the one type, no per-tensor rules (llama-quantize's `--pure`).
    fn is_pure(self) -> bool {
        matches!(self, QuantType::Q4K | QuantType::Q5K)
    }

    fn is_k_mix(self) -> bool {
        matches!(self, QuantType::Q4KM | QuantType::Q5KM)
    }
}

impl FromStr for QuantType {
    type Err = String;
    fn from_str(s: &str) -> Result<QuantType, String> {
        QuantType::ALL
            .into_iter()
            .find(|q| q.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| {
                let names: Vec<_> = QuantType::ALL.iter().map(|q| q.name()).collect();
                format!("unknown type '{s}' (expected one of {})", names.join(", "))
            })
    }
}

impl std::fmt::Display for QuantType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// `GGML_QNT_VERSION`, stored as `general.quantization_version`.
pub const QUANTIZATION_VERSION: u32 = 2;

/// What happens to one tensor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorPlan {
    pub name: String,
    pub from: GgmlType,
    pub to: GgmlType,
}

impl TensorPlan {
    /// Whether the data is copied unchanged.
    pub fn is_copy(&self) -> bool {
        self.from == self.to
    }
}

/// Whether llama.cpp would quantize this tensor at all.
pub fn is_quantizable(t: &TensorInfo) -> bool {
    // ggml_n_dims: trailing dimensions of 1 do not count.
    let n_dims = t.dims.iter().rposition(|&d| d != 1).map_or(1, |i| i + 1);
    const KEEP: [&str; 5] = [
        "_norm.weight",
        "ffn_gate_inp.weight",
        "pos_embd.weight",
        "token_types.weight",
        "ssm_conv1d.weight",
    ];
    t.name.ends_with("weight") && n_dims >= 2 && !KEEP.iter().any(|k| t.name.contains(k))
}

/// What a tensor's type depends on beyond its own name and shape.
#[derive(Clone, Copy, Debug)]
pub struct FileFacts<'a> {
    /// `general.architecture`.
    pub arch: &'a str,
    /// The file has an `output.weight` (else the embeddings are tied and `token_embd` is
    /// the output projection).
    pub has_output: bool,
    /// How many `attn_v` and `ffn_down` matrices the file has (the layers the mixes count).
    pub n_attn_v: usize,
    pub n_ffn_down: usize,
}

/// llama.cpp's `use_more_bits`: the first and last eighth of the layers, and every third
/// between.
fn use_more_bits(i: usize, n: usize) -> bool {
    i < n / 8 || i >= 7 * n / 8 || (i as i64 - (n / 8) as i64).rem_euclid(3) == 2
}

/// The layer of a `blk.N.` tensor.
fn layer_of(name: &str) -> Option<usize> {
    name.strip_prefix("blk.")?.split('.').next()?.parse().ok()
}

/// The type tensor `t` gets when the file is quantized to `target`.
pub fn target_type(t: &TensorInfo, target: QuantType, f: &FileFacts<'_>) -> GgmlType {
    if !is_quantizable(t) {
        return t.ty;
    }
    let base = target.ggml_type();
    if target == QuantType::F16 {
        return base;
    }
    let name = t.name.as_str();
    let is_output = name == "output.weight" || (!f.has_output && name == "token_embd.weight");
    let mut ty = base;
    if !target.is_pure() {
        if is_output {
            ty = if f.arch == "falcon" || !t.row_len().is_multiple_of(base.block_len()) {
                GgmlType::Q8_0
            } else if base != GgmlType::Q8_0 {
                GgmlType::Q6_K
            } else {
                base
            };
        } else if target.is_k_mix() {
            let more = |n: usize| layer_of(name).is_some_and(|i| use_more_bits(i, n));
            if name.ends_with(".attn_v.weight") && more(f.n_attn_v) {
                ty = GgmlType::Q6_K;
            } else if name.ends_with(".ffn_down.weight") && more(f.n_ffn_down) {
                ty = GgmlType::Q6_K;
            } else if name.ends_with(".attn_qkv.weight") {
                ty = if target == QuantType::Q4KM {
                    GgmlType::Q5_K
                } else {
                    GgmlType::Q6_K
                };
            }
        }
    }
    fallback(t.row_len(), ty)
}

/// llama.cpp's `tensor_type_fallback`: a row that is not whole blocks of `ty`.
fn fallback(row: u64, ty: GgmlType) -> GgmlType {
    if row.is_multiple_of(ty.block_len()) {
        return ty;
    }
    let smaller = match ty {
        GgmlType::Q4_K => GgmlType::Q5_0,
        GgmlType::Q5_K => GgmlType::Q5_1,
        GgmlType::Q6_K => GgmlType::Q8_0,
        t => t,
    };
    if row.is_multiple_of(smaller.block_len()) {
        smaller
    } else {
        GgmlType::F16
    }
}

/// The plan for every tensor of `src`, in file order.
pub fn plan(src: &Gguf, target: QuantType) -> Vec<TensorPlan> {
    let count = |suffix: &str| {
        src.tensors()
            .iter()
            .filter(|t| t.name.ends_with(suffix))
            .count()
    };
    let facts = FileFacts {
        arch: src.metadata().get_str("general.architecture").unwrap_or(""),
        has_output: src.get_tensor_info("output.weight").is_some(),
        n_attn_v: count(".attn_v.weight"),
        n_ffn_down: count(".ffn_down.weight"),
    };
    src.tensors()
        .iter()
        .map(|t| TensorPlan {
            name: t.name.clone(),
            from: t.ty,
            to: target_type(t, target, &facts),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(name: &str, ty: GgmlType, dims: &[u64]) -> TensorInfo {
        TensorInfo {
            name: name.into(),
            dims: dims.to_vec(),
            ty,
            offset: 0,
            size: 0,
        }
    }

    fn facts(has_output: bool) -> FileFacts<'static> {
        FileFacts {
            arch: "llama",
            has_output,
            n_attn_v: 18,
            n_ffn_down: 18,
        }
    }

    fn ty(name: &str, dims: &[u64], q: QuantType, has_output: bool) -> GgmlType {
        target_type(&info(name, GgmlType::F16, dims), q, &facts(has_output))
    }

    #[test]
    fn llama_cpp_type_choices() {
        let q = QuantType::Q4_0;
        assert_eq!(
            ty("blk.0.attn_q.weight", &[576, 576], q, false),
            GgmlType::Q4_0
        );
        let norm = info("blk.0.attn_norm.weight", GgmlType::F32, &[576]);
        assert_eq!(target_type(&norm, q, &facts(false)), GgmlType::F32);
        // The output projection: Q6_K, or Q8_0 when its rows are not whole superblocks.
        assert_eq!(
            ty("token_embd.weight", &[576, 49152], q, false),
            GgmlType::Q8_0
        );
        assert_eq!(
            ty("token_embd.weight", &[2048, 1000], q, false),
            GgmlType::Q6_K
        );
        assert_eq!(ty("output.weight", &[2048, 1000], q, true), GgmlType::Q6_K);
        assert_eq!(
            ty("output.weight", &[2048, 1000], QuantType::Q8_0, true),
            GgmlType::Q8_0
        );
        let falcon = FileFacts {
            arch: "falcon",
            ..facts(true)
        };
        let out = info("output.weight", GgmlType::F16, &[2048, 1000]);
        assert_eq!(target_type(&out, q, &falcon), GgmlType::Q8_0);
        // Untied: the embedding follows the file type.
        assert_eq!(
            ty("token_embd.weight", &[576, 49152], q, true),
            GgmlType::Q4_0
        );
        assert_eq!(ty("output.weight", &[576, 49152], q, true), GgmlType::Q8_0);
        // Rows that are not whole blocks: F16.
        assert_eq!(ty("blk.0.ffn_up.weight", &[48, 4], q, false), GgmlType::F16);
        let one_d = info("blk.0.ffn_up.weight", GgmlType::F32, &[64, 1]);
        assert_eq!(
            target_type(&one_d, q, &facts(false)),
            GgmlType::F32,
            "1-D after trailing 1s"
        );
        assert_eq!(
            ty("output.weight", &[64, 4], QuantType::F16, true),
            GgmlType::F16
        );
        assert_eq!("Q8_0".parse::<QuantType>().unwrap(), QuantType::Q8_0);
        assert_eq!("Q4_K_M".parse::<QuantType>().unwrap(), QuantType::Q4KM);
        assert!("q2_k".parse::<QuantType>().unwrap_err().contains("q5_k_m"));
    }

    #[test]
    fn the_k_mixes_give_more_bits_where_llama_cpp_does() {
        // 18 layers: use_more_bits picks 0, 1, 4, 7, 10, 13, 15, 16, 17.
        let more: Vec<usize> = (0..18).filter(|&i| use_more_bits(i, 18)).collect();
        assert_eq!(more, [0, 1, 4, 7, 10, 13, 15, 16, 17]);
        for (q, base, fb) in [
            (QuantType::Q4KM, GgmlType::Q4_K, GgmlType::Q5_0),
            (QuantType::Q5KM, GgmlType::Q5_K, GgmlType::Q5_1),
        ] {
            for i in 0..18 {
                let want = if more.contains(&i) {
                    GgmlType::Q6_K
                } else {
                    base
                };
                let v = format!("blk.{i}.attn_v.weight");
                assert_eq!(ty(&v, &[2048, 512], q, false), want, "{q} {v}");
                let d = format!("blk.{i}.ffn_down.weight");
                assert_eq!(ty(&d, &[2048, 512], q, false), want, "{q} {d}");
                // 640-wide rows: Q6_K falls back to Q8_0, the base type to Q5_0 / Q5_1.
                let want = if more.contains(&i) {
                    GgmlType::Q8_0
                } else {
                    fb
                };
                assert_eq!(ty(&v, &[640, 256], q, false), want, "{q} {v} 640");
            }
            assert_eq!(ty("blk.3.attn_q.weight", &[640, 1024], q, false), fb);
            assert_eq!(ty("blk.3.attn_output.weight", &[1024, 640], q, false), base);
        }
        assert_eq!(
            ty(
                "blk.3.attn_qkv.weight",
                &[2048, 6144],
                QuantType::Q4KM,
                false
            ),
            GgmlType::Q5_K
        );
        // The pure K types: the output projection too, with the fallbacks.
        assert_eq!(
            ty("token_embd.weight", &[2048, 1000], QuantType::Q4K, false),
            GgmlType::Q4_K
        );
        assert_eq!(
            ty("token_embd.weight", &[640, 1000], QuantType::Q5K, false),
            GgmlType::Q5_1
        );
        assert_eq!(
            ty("blk.0.attn_v.weight", &[2048, 512], QuantType::Q4K, false),
            GgmlType::Q4_K
        );
        assert_eq!(
            ty("blk.0.ffn_up.weight", &[48, 4], QuantType::Q6K, false),
            GgmlType::F16
        );
    }
}
