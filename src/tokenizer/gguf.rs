//! Reading a [`Vocab`] from GGUF metadata (`tokenizer.ggml.*`).

use crate::gguf::{Array, Gguf, Metadata};

use super::{Tokenizer, TokenizerError, Vocab, VocabKind};

impl Tokenizer {
    /// Builds the tokenizer of a GGUF model file.
    pub fn from_gguf(g: &Gguf) -> Result<Tokenizer, TokenizerError> {
        Tokenizer::new(Vocab::from_metadata(g.metadata())?)
    }
}

impl Vocab {
    /// Collects the tokenizer keys. Missing optional keys stay `None`/empty; a special-token
    /// id of the wrong type or range is treated as missing, as llama.cpp ignores bad ids.
    pub fn from_metadata(m: &Metadata) -> Result<Vocab, TokenizerError> {
        let kind = VocabKind::from_model_name(m.get_str("tokenizer.ggml.model")?)?;
        let id = |key: &str| m.opt_u32(key).ok().flatten();
        let flag = |key: &str| m.opt_bool(key).ok().flatten();
        // llama.cpp accepts scores stored as f32 or as i32.
        let scores = match m.opt_array("tokenizer.ggml.scores")? {
            Some(Array::F32(v)) => v.clone(),
            Some(Array::I32(v)) => v.iter().map(|&s| s as f32).collect(),
            Some(_) | None => Vec::new(),
        };
        Ok(Vocab {
            kind,
            pre: m.opt_str("tokenizer.ggml.pre")?.map(str::to_string),
            tokens: m.get_array_str("tokenizer.ggml.tokens")?.to_vec(),
            scores,
            types: m
                .opt_array_i32("tokenizer.ggml.token_type")?
                .map(<[i32]>::to_vec)
                .unwrap_or_default(),
            merges: m
                .opt_array_str("tokenizer.ggml.merges")?
                .map(<[String]>::to_vec)
                .unwrap_or_default(),
            bos: id("tokenizer.ggml.bos_token_id"),
            eos: id("tokenizer.ggml.eos_token_id"),
            eot: id("tokenizer.ggml.eot_token_id"),
            eom: id("tokenizer.ggml.eom_token_id"),
            unk: id("tokenizer.ggml.unknown_token_id"),
            sep: id("tokenizer.ggml.seperator_token_id"),
            pad: id("tokenizer.ggml.padding_token_id"),
            add_bos: flag("tokenizer.ggml.add_bos_token"),
            add_eos: flag("tokenizer.ggml.add_eos_token"),
            add_space_prefix: flag("tokenizer.ggml.add_space_prefix"),
            lowercase: flag("tokenizer.ggml.normalizer.lowercase"),
            strip_accents: flag("tokenizer.ggml.normalizer.strip_accents"),
        })
    }
}
