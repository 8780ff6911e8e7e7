//! Text → ids: special tokens are cut out first, then each stretch of plain text goes through
//! the model's tokenizer (llama.cpp's `llama_vocab::impl::tokenize`).

use super::bpe::{BpeScratch, merge_word};
use super::pretokenize::split;
use super::spm::{self, SpmVocab};
use super::unicode::{decode_lenient, push_utf8};
use super::vocab::attr;
use super::wpm;
use super::{Tokenizer, VocabKind};
use std::ops::Range;

/// A stretch of the input: plain text (a byte range) or a special token found in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fragment {
    Text(usize, usize),
    Token(u32),
}

/// llama.cpp's `tokenizer_st_partition`: for each special token, longest text first, every
/// leftmost non-overlapping occurrence inside a still-plain fragment becomes a token. The order
/// matters (a longer token wins over a shorter one it overlaps, wherever they start), so this
/// keeps llama.cpp's token-by-token sweep; each sweep is a SIMD substring search.
/// Without `parse_special`, control and unknown tokens stay plain text; with it, they still stay
/// plain text where an occurrence overlaps one of the `protected` byte ranges (text a user
/// typed, inside a prompt whose template text may hold control tokens).
pub(crate) fn partition(
    t: &Tokenizer,
    text: &[u8],
    parse_special: bool,
    protected: &[Range<usize>],
) -> Vec<Fragment> {
    let mut frags = Vec::new();
    if text.is_empty() {
        return frags;
    }
    frags.push(Fragment::Text(0, text.len()));
    let mut next = Vec::new();
    for &id in &t.special {
        let a = t.attrs[id as usize];
        let control = a & (attr::CONTROL | attr::UNKNOWN) != 0;
        if !parse_special && control {
            continue;
        }
        let needle = &t.texts[id as usize];
        let finder = memchr::memmem::Finder::new(needle);
        if finder.find(text).is_none() {
            continue; // most special tokens never occur: skip rebuilding the fragment list
        }
        let allowed = |m: usize| {
            !control
                || !protected
                    .iter()
                    .any(|r| m < r.end && r.start < m + needle.len())
        };
        next.clear();
        for &f in &frags {
            let Fragment::Text(mut start, end) = f else {
                next.push(f);
                continue;
            };
            // Where the search goes on: past `start` when an occurrence was left as text.
            let mut from = start;
            while start < end {
                let Some(m) = finder.find(&text[from..end]).map(|m| from + m) else {
                    next.push(Fragment::Text(start, end));
                    break;
                };
                if !allowed(m) {
                    from = m + 1;
                    continue;
                }
                let mut left_end = m;
                if a & attr::LSTRIP != 0 {
                    while left_end > start && text[left_end - 1].is_ascii_whitespace_c() {
                        left_end -= 1;
                    }
                }
                if left_end > start {
                    next.push(Fragment::Text(start, left_end));
                }
                next.push(Fragment::Token(id));
                start = m + needle.len();
                if a & attr::RSTRIP != 0 {
                    while start < end && text[start].is_ascii_whitespace_c() {
                        start += 1;
                    }
                }
                from = start;
            }
        }
        std::mem::swap(&mut frags, &mut next);
    }
    frags
}

/// C's `isspace` in the "C" locale (Rust's `is_ascii_whitespace` lacks the vertical tab).
trait CSpace {
    fn is_ascii_whitespace_c(&self) -> bool;
}
impl CSpace for u8 {
    fn is_ascii_whitespace_c(&self) -> bool {
        matches!(self, b' ' | b'\t' | b'\n' | 0x0B | 0x0C | b'\r')
    }
}

impl Tokenizer {
    pub(crate) fn encode_bpe(
        &self,
        text: &[u8],
        frags: &[Fragment],
        add_special: bool,
        out: &mut Vec<u32>,
    ) {
        if add_special && self.add_bos {
            out.extend(self.specials.bos);
        }
        let mut cpts = Vec::new();
        let mut norm = Vec::new();
        let mut escaped = Vec::new();
        let mut scratch = BpeScratch::default();
        let n_vocab = self.texts.len() as u32;
        let lookup = |s: &[u8]| self.ids.get(&self.texts, s);
        for &f in frags {
            let (start, end) = match f {
                Fragment::Token(id) => {
                    out.push(id);
                    continue;
                }
                Fragment::Text(s, e) => (s, e),
            };
            let Some(tables) = &self.bpe else { continue };
            // Words are runs of codepoints; their bytes are the codepoints re-encoded, which
            // equals the input for valid UTF-8 and turns each invalid byte into U+FFFD.
            // Gemma 4 writes spaces as `▁` first (llama.cpp's escape_whitespaces).
            if self.kind == VocabKind::Gemma4 {
                escaped.clear();
                for &b in &text[start..end] {
                    if b == b' ' {
                        escaped.extend_from_slice("\u{2581}".as_bytes());
                    } else {
                        escaped.push(b);
                    }
                }
                decode_lenient(&escaped, &mut cpts);
            } else {
                decode_lenient(&text[start..end], &mut cpts);
            }
            let mut at = 0;
            for len in split(self.pre, &cpts) {
                norm.clear();
                for &c in &cpts[at..at + len] {
                    push_utf8(c, &mut norm);
                }
                at += len;
                merge_word(
                    tables,
                    n_vocab,
                    &lookup,
                    self.ignore_merges,
                    &norm,
                    &mut scratch,
                    out,
                );
            }
        }
        if add_special && self.add_eos {
            out.extend(self.specials.eos);
        }
    }

    pub(crate) fn encode_spm(
        &self,
        text: &[u8],
        frags: &[Fragment],
        add_special: bool,
        out: &mut Vec<u32>,
    ) {
        // A space is prepended to plain text at the start and after every special token
        // (SentencePiece's dummy prefix), when the model asks for it.
        let mut prev_special = true;
        if add_special && self.add_bos {
            out.extend(self.specials.bos);
        }
        let mut buf = Vec::new();
        for &f in frags {
            match f {
                Fragment::Token(id) => {
                    out.push(id);
                    prev_special = true;
                }
                Fragment::Text(s, e) => {
                    buf.clear();
                    if self.add_space_prefix && prev_special {
                        buf.extend_from_slice("\u{2581}".as_bytes());
                    }
                    for &b in &text[s..e] {
                        if b == b' ' {
                            buf.extend_from_slice("\u{2581}".as_bytes());
                        } else {
                            buf.push(b);
                        }
                    }
                    spm::tokenize(self, &buf, out);
                    prev_special = false;
                }
            }
        }
        if add_special && self.add_eos {
            out.extend(self.specials.eos);
        }
    }
}

impl Tokenizer {
    /// llama.cpp's WPM branch: with `add_special`, BOS (`[CLS]`) and SEP around the text
    /// whatever add_bos says (llama.cpp does not look at it there).
    pub(crate) fn encode_wpm(
        &self,
        text: &[u8],
        frags: &[Fragment],
        add_special: bool,
        out: &mut Vec<u32>,
    ) {
        if add_special {
            out.extend(self.specials.bos);
        }
        let lookup = |s: &[u8]| self.ids.get(&self.texts, s);
        for &f in frags {
            match f {
                Fragment::Token(id) => out.push(id),
                Fragment::Text(s, e) => {
                    if let Some(t) = &self.wpm {
                        wpm::tokenize(t, &lookup, self.specials.unk, &text[s..e], out);
                    }
                }
            }
        }
        if add_special {
            out.extend(self.specials.sep);
        }
    }
}

impl SpmVocab for Tokenizer {
    fn token(&self, text: &[u8]) -> Option<u32> {
        self.ids.get(&self.texts, text)
    }

    fn rank(&self, id: u32) -> u32 {
        // Ids come from vocabulary lookups, so they are in range; 0 keeps the queue in bounds.
        self.score_ranks.get(id as usize).copied().unwrap_or(0)
    }

    fn n_ranks(&self) -> usize {
        self.n_score_ranks
    }

    fn byte_token(&self, b: u8) -> Option<u32> {
        self.byte_tokens[b as usize]
    }
}
