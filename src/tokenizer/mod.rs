//! Tokenizer and chat templates, matching llama.cpp (`llama-vocab.cpp`, `unicode.cpp`) token
//! for token.
//!
//! - [`Vocab`] is the plain data a GGUF file carries (`tokenizer.ggml.*`); [`Tokenizer::new`]
//!   builds every lookup table once from it, [`Tokenizer::from_gguf`] reads it from a file.
//! - Byte-level BPE (`gpt2` model) with the pre-tokenizer named by `tokenizer.ggml.pre`
//!   ([`PreTokenizer`]), SentencePiece BPE (`llama` model: scores, `▁` for spaces, byte
//!   fallback), Gemma 4's BPE over raw UTF-8 (`gemma4`) and WordPiece (`bert`).
//! - Special tokens (control / user-defined) are recognised in text only when asked
//!   (`parse_special`); [`Tokenizer::is_eog`] knows every end-of-generation token the way
//!   llama.cpp derives them.
//! - Pieces are bytes (a byte-level token can be half a UTF-8 character); [`StreamDecoder`]
//!   turns a stream of pieces into complete UTF-8 text.
//! - [`ChatTemplate`] renders the model's own Jinja chat template with minijinja.
//!
//! Input is untrusted: any bytes, any length. Nothing here panics on input, and tokenizing
//! costs O(n log n) in the length of the longest word.
//!
//! ```no_run
//! use edgellm::tokenizer::{ChatMessage, ChatTemplate, Tokenizer};
//! let gguf = edgellm::gguf::Gguf::open("model.gguf", &Default::default())?;
//! let tok = Tokenizer::from_gguf(&gguf)?;
//! let chat = ChatTemplate::from_gguf(&gguf, &tok)?;
//! let prompt = chat.render(&[ChatMessage::new("user", "Hi!")], true)?;
//! let ids = tok.encode(&prompt, true, true);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod bpe;
mod chat;
// The calendar of templates' `strftime_now`, also the audit trail's timestamps.
pub(crate) use strftime::civil_from_days;
mod detok;
mod encode;
mod gguf;
mod index;
mod jinja2_compat;
mod pretokenize;
mod queue;
mod regex_stages;
mod spm;
mod stream;
mod strftime;
mod templates;
mod unicode;
mod vocab;
mod wpm;

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

pub use chat::{ChatMessage, ChatTemplate, Rendered};
pub use pretokenize::PreTokenizer;
pub use stream::StreamDecoder;
pub use templates::{MAX_TEMPLATE_BYTES, built_in_for, built_in_names};
pub use vocab::{TokenType, Vocab, VocabKind};

/// Everything that can go wrong loading a tokenizer or rendering a chat template. Tokenizing
/// and decoding themselves cannot fail.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("unknown tokenizer model {0:?} (supported: \"gpt2\", \"llama\", \"gemma4\", \"bert\")")]
    UnknownModel(String),
    #[error("unknown pre-tokenizer {0:?}")]
    UnknownPreTokenizer(String),
    #[error("the vocabulary is empty")]
    EmptyVocab,
    #[error("{what} has {got} entries for {n_vocab} tokens")]
    LengthMismatch {
        what: &'static str,
        got: usize,
        n_vocab: usize,
    },
    #[error("duplicate token {text:?}: ids {first} and {second}")]
    DuplicateToken {
        text: String,
        first: u32,
        second: u32,
    },
    #[error("{flag} is set but the model has no {token} token")]
    MissingSpecial {
        flag: &'static str,
        token: &'static str,
    },
    #[error(
        "the model has no chat template (tokenizer.chat_template): name a Jinja template file, \
         or a built-in one (chatml, gemma)"
    )]
    NoChatTemplate,
    #[error("chat template: {0}")]
    Template(String),
    #[error(transparent)]
    Gguf(#[from] crate::gguf::GgufError),
}

/// A tokenizer built from a [`Vocab`]: lookup tables, special tokens, decoded pieces.
pub struct Tokenizer {
    pub(crate) kind: VocabKind,
    pub(crate) pre: PreTokenizer,
    pub(crate) texts: Vec<Box<[u8]>>,
    pub(crate) scores: Vec<f32>,
    /// SentencePiece merge priority of each token: 0 for the highest score, ties shared.
    pub(crate) score_ranks: Vec<u32>,
    pub(crate) n_score_ranks: usize,
    /// llama.cpp's token attribute bits (`vocab::attr`).
    pub(crate) attrs: Vec<u32>,
    pub(crate) ids: index::TextIndex,
    /// `token_to_piece(id, special = true)` for every id.
    pub(crate) pieces: Vec<Box<[u8]>>,
    pub(crate) bpe: Option<bpe::BpeTables>,
    pub(crate) wpm: Option<wpm::WpmTables>,
    /// SentencePiece byte fallback: `<0xNN>`, else the one-byte token, else UNK (llama.cpp
    /// would throw there).
    pub(crate) byte_tokens: [Option<u32>; 256],
    /// Control, user-defined and unknown tokens, longest text first.
    pub(crate) special: Vec<u32>,
    pub(crate) specials: SpecialIds,
    /// End-of-generation ids, sorted.
    pub(crate) eog: Vec<u32>,
    pub(crate) add_bos: bool,
    pub(crate) add_eos: bool,
    pub(crate) add_space_prefix: bool,
    pub(crate) clean_spaces: bool,
    pub(crate) ignore_merges: bool,
}

/// The special token ids llama.cpp tracks, after its defaults, the file's values and its
/// text heuristics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpecialIds {
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub eot: Option<u32>,
    pub eom: Option<u32>,
    pub unk: Option<u32>,
    pub sep: Option<u32>,
    pub pad: Option<u32>,
    pub fim_pre: Option<u32>,
    pub fim_suf: Option<u32>,
    pub fim_mid: Option<u32>,
    pub fim_pad: Option<u32>,
    pub fim_rep: Option<u32>,
    pub fim_sep: Option<u32>,
}

impl Tokenizer {
    /// Tokenizes text. `add_special` adds BOS/EOS where the model asks for them
    /// (`add_bos_token` / `add_eos_token`); `parse_special` recognises control tokens such as
    /// `<|im_start|>` written in the text (user-defined tokens are always recognised, as in
    /// llama.cpp). Same ids as `llama_tokenize`.
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
        let mut out = Vec::new();
        self.encode_into(text.as_bytes(), add_special, parse_special, &mut out);
        out
    }

    /// Like [`Self::encode`] for arbitrary bytes: invalid UTF-8 is tokenized the way llama.cpp
    /// does it (each bad byte becomes U+FFFD).
    pub fn encode_bytes(&self, text: &[u8], add_special: bool, parse_special: bool) -> Vec<u32> {
        let mut out = Vec::new();
        self.encode_into(text, add_special, parse_special, &mut out);
        out
    }

    /// Appends the tokens of `text` to `out` (reuse `out` to avoid reallocating).
    pub fn encode_into(
        &self,
        text: &[u8],
        add_special: bool,
        parse_special: bool,
        out: &mut Vec<u32>,
    ) {
        self.encode_fragments(text, add_special, parse_special, &[], out);
    }

    /// Tokenizes a prompt rendered from a template: control tokens in the template's own text
    /// are recognised, but never inside the `protected` byte ranges (the messages' contents),
    /// so a control token a user types stays text. With no control-token text inside the
    /// ranges the ids are those of `encode(text, add_special, true)`.
    pub fn encode_protected(
        &self,
        text: &str,
        add_special: bool,
        protected: &[std::ops::Range<usize>],
    ) -> Vec<u32> {
        let mut out = Vec::new();
        self.encode_fragments(text.as_bytes(), add_special, true, protected, &mut out);
        out
    }

    fn encode_fragments(
        &self,
        text: &[u8],
        add_special: bool,
        parse_special: bool,
        protected: &[std::ops::Range<usize>],
        out: &mut Vec<u32>,
    ) {
        let fragments = encode::partition(self, text, parse_special, protected);
        match self.kind {
            VocabKind::Bpe | VocabKind::Gemma4 => {
                self.encode_bpe(text, &fragments, add_special, out)
            }
            VocabKind::Spm => self.encode_spm(text, &fragments, add_special, out),
            VocabKind::Wpm => self.encode_wpm(text, &fragments, add_special, out),
        }
    }

    /// The piece of a token as `llama_token_to_piece(.., special = true)` gives it: raw bytes
    /// (possibly part of a UTF-8 character), the literal text of control tokens. Empty for an
    /// id outside the vocabulary.
    pub fn token_to_piece(&self, id: u32) -> &[u8] {
        self.pieces.get(id as usize).map_or(&[], |p| p)
    }

    /// Like [`Self::token_to_piece`]; with `special = false` control and unknown tokens
    /// render as nothing.
    pub fn token_to_piece_special(&self, id: u32, special: bool) -> &[u8] {
        let attr = self.attrs.get(id as usize).copied().unwrap_or(0);
        if !special && attr & (vocab::attr::UNKNOWN | vocab::attr::CONTROL) != 0 {
            return &[];
        }
        self.token_to_piece(id)
    }

    /// The bytes of a token sequence, as `llama_detokenize(.., remove_special = false,
    /// unparse_special = false)`: control tokens vanish, the model's space clean-up applies.
    pub fn decode(&self, ids: &[u32]) -> Vec<u8> {
        self.detokenize(ids, false, false)
    }

    /// `llama_detokenize` with both of its flags: `remove_special` drops a leading BOS and a
    /// trailing EOS the model adds itself; `unparse_special` renders control tokens as text.
    pub fn detokenize(&self, ids: &[u32], remove_special: bool, unparse_special: bool) -> Vec<u8> {
        detok::detokenize(self, ids, remove_special, unparse_special)
    }

    /// Whether generation stops at this token (llama.cpp's `llama_vocab_is_eog`).
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.binary_search(&id).is_ok()
    }

    /// Every end-of-generation id, ascending.
    pub fn eog_ids(&self) -> &[u32] {
        &self.eog
    }

    pub fn n_vocab(&self) -> usize {
        self.texts.len()
    }

    pub fn bos(&self) -> Option<u32> {
        self.specials.bos
    }

    pub fn eos(&self) -> Option<u32> {
        self.specials.eos
    }

    pub fn special_ids(&self) -> &SpecialIds {
        &self.specials
    }

    /// Whether `encode(.., add_special = true, ..)` starts with BOS / ends with EOS.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    pub fn add_eos(&self) -> bool {
        self.add_eos
    }

    pub fn kind(&self) -> VocabKind {
        self.kind
    }

    pub fn pre_tokenizer(&self) -> PreTokenizer {
        self.pre
    }

    /// The token's text as stored in the vocabulary (GPT-2 characters, `▁`, `<0x0A>`, …).
    pub fn token_text(&self, id: u32) -> Option<&[u8]> {
        self.texts.get(id as usize).map(|t| &t[..])
    }

    /// The token's score (SentencePiece merge priority; 0 when the file has none).
    pub fn token_score(&self, id: u32) -> Option<f32> {
        self.scores.get(id as usize).copied()
    }

    /// The id of a token given its vocabulary text.
    pub fn token_id(&self, text: &[u8]) -> Option<u32> {
        self.ids.get(&self.texts, text)
    }

    /// The token's type as llama.cpp sees it after loading (heuristics included).
    pub fn token_type(&self, id: u32) -> Option<TokenType> {
        self.attrs.get(id as usize).map(|&a| vocab::type_of_attr(a))
    }
}

/// A small, fast, unkeyed hasher for the lookup tables (FxHash's mix, Murmur3's finalizer).
/// Keys come from the model file, so an attacker's text cannot fill a bucket; lookups only
/// probe.
#[derive(Default, Clone, Copy)]
pub(crate) struct FxHasher(u64);

const FX_SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl FxHasher {
    fn mix(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(FX_SEED);
    }
}

impl Hasher for FxHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.mix(u64::from_le_bytes(w));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            self.mix(u64::from_le_bytes(w) ^ ((rest.len() as u64) << 59));
        }
    }
    fn write_u32(&mut self, i: u32) {
        self.mix(i as u64);
    }
    fn write_u64(&mut self, i: u64) {
        self.mix(i);
    }
    fn write_usize(&mut self, i: usize) {
        self.mix(i as u64);
    }
    fn finish(&self) -> u64 {
        // A multiply only carries input bits upwards, so the low bits that pick a bucket would
        // ignore the tail of a key; MurmurHash3's finalizer spreads every bit over all bits.
        let mut h = self.0;
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 33;
        h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        h ^ (h >> 33)
    }
}

pub(crate) type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<FxHasher>>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    #[test]
    fn keys_sharing_a_prefix_spread_over_buckets() {
        // Vocabulary texts share prefixes ("Ġthe", "Ġthey", …); the low bits that pick a
        // bucket must still differ, or lookups degrade into long probes.
        let build = BuildHasherDefault::<FxHasher>::default();
        let mut buckets = std::collections::HashSet::new();
        for i in 0..4096u32 {
            let key: Box<[u8]> = format!("Ġthe{i}").into_bytes().into();
            buckets.insert(build.hash_one(&key) & 0xFFF);
            buckets.insert(build.hash_one((i, i + 1)) & 0xFFF | 0x1000);
        }
        // Uniform hashing fills about 63% of 4096 buckets per key family.
        assert!(buckets.len() > 2 * 2300, "{} buckets used", buckets.len());
    }
}
