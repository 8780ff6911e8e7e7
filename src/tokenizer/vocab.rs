//! The vocabulary as plain data ([`Vocab`]) and the one-time build of a [`Tokenizer`] from
//! it, with llama.cpp's defaults and heuristics (`llama_vocab::impl::load`).

use super::bpe::BpeTables;
use super::detok::piece_of;
use super::index::TextIndex;
use super::pretokenize::PreTokenizer;
use super::wpm::WpmTables;
use super::{SpecialIds, Tokenizer, TokenizerError};

/// Which tokenizer algorithm a vocabulary uses (`tokenizer.ggml.model`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum VocabKind {
    /// `"gpt2"`: byte-level BPE with merges and a pre-tokenizer.
    #[default]
    Bpe,
    /// `"llama"`: SentencePiece BPE driven by token scores.
    Spm,
    /// `"gemma4"`: BPE with merges over raw UTF-8, spaces written `▁`, `<0xNN>` byte tokens,
    /// words cut only at newlines (llama.cpp's `gemma4` pre-tokenizer, implied by the model).
    Gemma4,
    /// `"bert"`: WordPiece, the longest token at each byte of a normalized word.
    Wpm,
}

impl VocabKind {
    pub fn from_model_name(name: &str) -> Result<VocabKind, TokenizerError> {
        match name {
            "gpt2" => Ok(VocabKind::Bpe),
            "llama" => Ok(VocabKind::Spm),
            "gemma4" => Ok(VocabKind::Gemma4),
            "bert" => Ok(VocabKind::Wpm),
            other => Err(TokenizerError::UnknownModel(other.to_string())),
        }
    }
}

/// GGUF token types (`tokenizer.ggml.token_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenType {
    Undefined = 0,
    Normal = 1,
    Unknown = 2,
    Control = 3,
    UserDefined = 4,
    Unused = 5,
    Byte = 6,
}

/// A vocabulary as a GGUF file stores it. Optional fields are `None` when the file lacks the
/// key; the model's defaults then apply, as in llama.cpp.
#[derive(Clone, Debug, Default)]
pub struct Vocab {
    pub kind: VocabKind,
    /// `tokenizer.ggml.pre` (byte-level BPE only).
    pub pre: Option<String>,
    pub tokens: Vec<String>,
    /// Per-token scores (SentencePiece merge priorities); empty means all zero.
    pub scores: Vec<f32>,
    /// Per-token GGUF types ([`TokenType`] values); empty means all normal.
    pub types: Vec<i32>,
    /// BPE merges, `"left right"`, highest priority first.
    pub merges: Vec<String>,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub eot: Option<u32>,
    pub eom: Option<u32>,
    pub unk: Option<u32>,
    pub sep: Option<u32>,
    pub pad: Option<u32>,
    pub add_bos: Option<bool>,
    pub add_eos: Option<bool>,
    pub add_space_prefix: Option<bool>,
    /// `tokenizer.ggml.normalizer.lowercase` (WordPiece; default true).
    pub lowercase: Option<bool>,
    /// `tokenizer.ggml.normalizer.strip_accents` (WordPiece; default: as `lowercase`).
    pub strip_accents: Option<bool>,
}

/// llama.cpp's token attribute bits (`llama_token_attr`).
pub(crate) mod attr {
    pub const UNKNOWN: u32 = 1 << 0;
    pub const UNUSED: u32 = 1 << 1;
    pub const NORMAL: u32 = 1 << 2;
    pub const CONTROL: u32 = 1 << 3;
    pub const USER_DEFINED: u32 = 1 << 4;
    pub const BYTE: u32 = 1 << 5;
    pub const LSTRIP: u32 = 1 << 7;
    pub const RSTRIP: u32 = 1 << 8;
}

fn attr_of_type(t: i32) -> u32 {
    match t {
        1 => attr::NORMAL,
        2 => attr::UNKNOWN,
        3 => attr::CONTROL,
        4 => attr::USER_DEFINED,
        5 => attr::UNUSED,
        6 => attr::BYTE,
        _ => 0, // undefined
    }
}

pub(crate) fn type_of_attr(a: u32) -> TokenType {
    [
        (attr::CONTROL, TokenType::Control),
        (attr::USER_DEFINED, TokenType::UserDefined),
        (attr::UNKNOWN, TokenType::Unknown),
        (attr::BYTE, TokenType::Byte),
        (attr::UNUSED, TokenType::Unused),
        (attr::NORMAL, TokenType::Normal),
    ]
    .into_iter()
    .find(|&(bit, _)| a & bit != 0)
    .map_or(TokenType::Undefined, |(_, t)| t)
}

/// What a `tokenizer.ggml.pre` name implies besides its regexes.
struct PreConfig {
    pre: PreTokenizer,
    clean_spaces: bool,
    ignore_merges: bool,
    add_bos: bool,
    no_bos: bool,
}

fn pre_config(name: Option<&str>) -> Result<PreConfig, TokenizerError> {
    use PreTokenizer::*;
    let c = |pre, clean_spaces| PreConfig {
        pre,
        clean_spaces,
        ignore_merges: false,
        add_bos: false,
        no_bos: false,
    };
    Ok(match name.unwrap_or("") {
        "" | "default" => c(Default, true),
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0"
        | "lfm2" | "jina-v5-nano" => PreConfig {
            ignore_merges: true,
            add_bos: true,
            ..c(Llama3, true)
        },
        "dbrx" | "smaug-bpe" => c(Llama3, true),
        "chatglm-bpe" | "glm4" => PreConfig {
            no_bos: true,
            ..c(Llama3, true)
        },
        "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es" | "jina-v2-de"
        | "a.x-4.0" | "mellum" | "modern-bert" | "exaone4" | "mpt" | "olmo" | "jais" => {
            c(Gpt2, true)
        }
        "trillion" | "granite-docling" => c(Gpt2, false),
        "starcoder" | "refact" | "codeshell" | "exaone" | "minerva-7b" | "mellum2" => {
            c(DigitsThenGpt2, true)
        }
        "smollm" | "command-r" => c(DigitsThenGpt2, false),
        "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "hunyuan" => c(Qwen2, false),
        "megrez" | "stablelm2" => c(Qwen2, true),
        "qwen35" => c(Qwen35, false),
        "falcon" => c(Falcon, true),
        "deepseek-llm" => c(DeepseekLlm, false),
        "deepseek-coder" => c(DeepseekCoder, false),
        other => return Err(TokenizerError::UnknownPreTokenizer(other.to_string())),
    })
}

/// Token texts llama.cpp promotes to special roles when the file does not name them
/// (ref. llama.cpp issue 9606: "determined based on the token text, which is not ideal").
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];
const EOM_TEXTS: &[&str] = &["<|eom_id|>"];
const FIM_PRE: &[&str] = &[
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<｜fim▁begin｜>",
    "<PRE>",
    "▁<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
];
const FIM_SUF: &[&str] = &[
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<｜fim▁hole｜>",
    "<SUF>",
    "▁<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
];
const FIM_MID: &[&str] = &[
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<｜fim▁end｜>",
    "<MID>",
    "▁<MID>",
    "<|code_middle|>",
    "<|middle|>",
];
const FIM_PAD: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const FIM_REP: &[&str] = &[
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
];
const FIM_SEP: &[&str] = &["<|file_sep|>"];
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

impl Tokenizer {
    /// Builds every table from a vocabulary; fails on an inconsistent one.
    pub fn new(v: Vocab) -> Result<Tokenizer, TokenizerError> {
        let n = v.tokens.len();
        if n == 0 {
            return Err(TokenizerError::EmptyVocab);
        }
        for (what, got) in [("scores", v.scores.len()), ("token types", v.types.len())] {
            if got != 0 && got < n {
                return Err(TokenizerError::LengthMismatch {
                    what,
                    got,
                    n_vocab: n,
                });
            }
        }
        let in_range = |id: Option<u32>| id.filter(|&i| (i as usize) < n);
        let (pre, mut s, mut add_bos, add_eos, mut add_space_prefix, clean_spaces, ignore_merges);
        match v.kind {
            VocabKind::Spm => {
                pre = PreTokenizer::Default;
                s = SpecialIds {
                    bos: Some(1),
                    eos: Some(2),
                    unk: Some(0),
                    ..Default::default()
                };
                (
                    add_bos,
                    add_eos,
                    add_space_prefix,
                    clean_spaces,
                    ignore_merges,
                ) = (true, false, true, false, false);
            }
            VocabKind::Bpe => {
                let c = pre_config(v.pre.as_deref())?;
                pre = c.pre;
                let bos = if c.no_bos { None } else { Some(11) };
                s = SpecialIds {
                    bos,
                    eos: Some(11),
                    ..Default::default()
                };
                (add_bos, add_eos, add_space_prefix) = (c.add_bos, false, false);
                (clean_spaces, ignore_merges) = (c.clean_spaces, c.ignore_merges);
            }
            VocabKind::Gemma4 => {
                // No default special ids: the file names them. The file's
                // tokenizer.ggml.pre is ignored (llama.cpp forces "gemma4").
                pre = PreTokenizer::Newlines;
                s = SpecialIds::default();
                (add_bos, add_eos, add_space_prefix) = (false, false, false);
                (clean_spaces, ignore_merges) = (true, false);
            }
            VocabKind::Wpm => {
                pre = PreTokenizer::Default; // unused: WordPiece cuts its own words
                s = SpecialIds {
                    bos: Some(101),
                    unk: Some(100),
                    sep: Some(102),
                    pad: Some(0),
                    ..Default::default()
                };
                (add_bos, add_eos, add_space_prefix) = (true, false, false);
                (clean_spaces, ignore_merges) = (true, false);
            }
        }
        // Defaults outside the vocabulary are dropped; file values outside it are ignored.
        for id in [&mut s.bos, &mut s.eos, &mut s.unk, &mut s.sep, &mut s.pad] {
            *id = in_range(*id);
        }
        let file = [
            (&mut s.bos, v.bos),
            (&mut s.eos, v.eos),
            (&mut s.eot, v.eot),
            (&mut s.eom, v.eom),
        ];
        for (slot, value) in file {
            if let Some(id) = in_range(value) {
                *slot = Some(id);
            }
        }
        for (slot, value) in [
            (&mut s.unk, v.unk),
            (&mut s.sep, v.sep),
            (&mut s.pad, v.pad),
        ] {
            if let Some(id) = in_range(value) {
                *slot = Some(id);
            }
        }
        add_space_prefix = v.add_space_prefix.unwrap_or(add_space_prefix);
        add_bos = v.add_bos.unwrap_or(add_bos);
        // llama.cpp overrides a Gemma 4 file that says no BOS (its PR 21500).
        add_bos |= v.kind == VocabKind::Gemma4;
        let add_eos = v.add_eos.unwrap_or(add_eos);
        if add_bos && s.bos.is_none() {
            return Err(TokenizerError::MissingSpecial {
                flag: "add_bos_token",
                token: "BOS",
            });
        }
        if add_eos && s.eos.is_none() {
            return Err(TokenizerError::MissingSpecial {
                flag: "add_eos_token",
                token: "EOS",
            });
        }

        let texts: Vec<Box<[u8]>> = v
            .tokens
            .iter()
            .enumerate()
            .map(|(i, t)| {
                if t.is_empty() {
                    format!("[EMPTY_{i}]").into_bytes().into()
                } else {
                    t.as_bytes().into()
                }
            })
            .collect();
        let ids =
            TextIndex::build(&texts).map_err(|(first, second)| TokenizerError::DuplicateToken {
                text: String::from_utf8_lossy(&texts[second as usize]).into_owned(),
                first,
                second,
            })?;
        let mut attrs: Vec<u32> = (0..n)
            .map(|i| v.types.get(i).map_or(attr::NORMAL, |&t| attr_of_type(t)))
            .collect();
        let eog = derive_special_roles(&texts, &mut attrs, &mut s);

        let mut special: Vec<u32> = (0..n as u32)
            .filter(|&i| {
                attrs[i as usize] & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN) != 0
            })
            .collect();
        special.sort_by_key(|&i| std::cmp::Reverse(texts[i as usize].len()));

        let lookup = |t: &[u8]| ids.get(&texts, t);
        let raw = v.kind == VocabKind::Gemma4;
        let lowercase = v.lowercase.unwrap_or(true);
        let wpm = (v.kind == VocabKind::Wpm)
            .then(|| WpmTables::new(&texts, lowercase, v.strip_accents.unwrap_or(lowercase)));
        let bpe = matches!(v.kind, VocabKind::Bpe | VocabKind::Gemma4)
            .then(|| BpeTables::new(n as u32, lookup, v.merges.iter().map(|m| m.as_bytes()), raw));
        let mut byte_tokens = [None; 256];
        for (b, slot) in byte_tokens.iter_mut().enumerate() {
            let hex = format!("<0x{b:02X}>");
            *slot = lookup(hex.as_bytes())
                .or_else(|| lookup(&[b as u8]))
                .or(s.unk);
        }
        let pieces = (0..n)
            .map(|i| piece_of(v.kind, &texts[i], attrs[i]).into_boxed_slice())
            .collect();
        let scores = if v.scores.is_empty() {
            vec![0.0; n]
        } else {
            v.scores
        };
        let (score_ranks, n_score_ranks) = score_ranks(&scores);
        Ok(Tokenizer {
            kind: v.kind,
            pre,
            texts,
            scores,
            score_ranks,
            n_score_ranks,
            attrs,
            ids,
            pieces,
            bpe,
            wpm,
            byte_tokens,
            special,
            specials: s,
            eog,
            add_bos,
            add_eos,
            add_space_prefix,
            clean_spaces,
            ignore_merges,
        })
    }
}

/// Ranks tokens by score, highest first, equal scores sharing a rank (SentencePiece merges the
/// best-scoring pair first). `total_cmp` keeps the order total even for NaN from a bad file.
fn score_ranks(scores: &[f32]) -> (Vec<u32>, usize) {
    let mut order: Vec<u32> = (0..scores.len() as u32).collect();
    order.sort_by(|&a, &b| scores[b as usize].total_cmp(&scores[a as usize]));
    let mut ranks = vec![0u32; scores.len()];
    let mut rank = 0u32;
    for (k, &id) in order.iter().enumerate() {
        if k > 0
            && scores[id as usize]
                .total_cmp(&scores[order[k - 1] as usize])
                .is_ne()
        {
            rank += 1;
        }
        ranks[id as usize] = rank;
    }
    (ranks, rank as usize + 1)
}

/// Fills EOT/EOM/FIM roles from token texts, marks the tokens involved as control, and returns
/// the sorted end-of-generation set, following llama.cpp step by step. llama.cpp walks a hash
/// map, so when several texts could fill one role its pick is unspecified; we take the lowest id.
fn derive_special_roles(texts: &[Box<[u8]>], attrs: &mut [u32], s: &mut SpecialIds) -> Vec<u32> {
    let find = |names: &[&str]| -> Vec<u32> {
        (0..texts.len() as u32)
            .filter(|&i| names.iter().any(|n| n.as_bytes() == &*texts[i as usize]))
            .collect()
    };
    let roles: [(&mut Option<u32>, &[&str]); 8] = [
        (&mut s.eot, EOT_TEXTS),
        (&mut s.eom, EOM_TEXTS),
        (&mut s.fim_pre, FIM_PRE),
        (&mut s.fim_suf, FIM_SUF),
        (&mut s.fim_mid, FIM_MID),
        (&mut s.fim_pad, FIM_PAD),
        (&mut s.fim_rep, FIM_REP),
        (&mut s.fim_sep, FIM_SEP),
    ];
    for (slot, names) in roles {
        if slot.is_none()
            && let Some(&id) = find(names).first()
        {
            *slot = Some(id);
            attrs[id as usize] |= attr::CONTROL;
        }
    }
    // Control tokens named "unused…" are unused.
    for (i, t) in texts.iter().enumerate() {
        if attrs[i] & attr::CONTROL != 0 && memchr::memmem::find(t, b"unused").is_some() {
            attrs[i] |= attr::UNUSED;
        }
    }
    let mut eog: Vec<u32> = [s.fim_pad, s.fim_rep, s.fim_sep]
        .into_iter()
        .flatten()
        .collect();
    for id in find(EOG_TEXTS) {
        eog.push(id);
        attrs[id as usize] |= attr::CONTROL;
    }
    // gpt-oss: these are always rendered, never special.
    for id in find(&["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"]) {
        attrs[id as usize] = attr::USER_DEFINED;
    }
    eog.extend([s.eos, s.eot, s.eom].into_iter().flatten());
    eog.sort_unstable();
    eog.dedup();
    let has = |eog: &[u32], name: &str| {
        eog.iter()
            .copied()
            .find(|&i| &*texts[i as usize] == name.as_bytes())
    };
    // gpt-oss (o200k_harmony) and solar-open: "<|end|>" ends a message, not the generation.
    if let Some(end) = has(&eog, "<|end|>") {
        let call = has(&eog, "<|call|>").or(has(&eog, "<|calls|>")).is_some();
        let ret = has(&eog, "<|return|>").is_some();
        let flush = has(&eog, "<|flush|>").is_some();
        if call && (ret || flush) {
            eog.retain(|&i| i != end);
            attrs[end as usize] = attr::USER_DEFINED;
        }
    }
    // gemma4 / paddleocr: "</s>" is not an end of generation next to "<|tool_response>".
    if let (Some(_), Some(s_id)) = (has(&eog, "<|tool_response>"), has(&eog, "</s>")) {
        eog.retain(|&i| i != s_id);
        attrs[s_id as usize] = attr::NORMAL;
    }
    eog
}
