//! SentencePiece-style BPE (`tokenizer.ggml.model = "llama"`, the Llama 1/2, Mistral, TinyLlama
//! family), as llama.cpp's `llm_tokenizer_spm_session` runs it.
//!
//! The text (spaces already escaped to U+2581 by the caller) is cut into UTF-8 characters;
//! adjacent symbols whose concatenation is a token are merged, highest token score first
//! (leftmost on ties), until no adjacent pair forms a token. A symbol left that is not a token
//! falls back to byte tokens `<0xNN>`. No such model ships with this project: the path is
//! tested on a small synthetic vocabulary with hand-computed results (see the tests below).

use super::queue::{NONE, RankQueue};
use super::unicode::utf8_len;

#[derive(Clone, Copy)]
struct Symbol {
    start: u32,
    len: u32,
    prev: u32,
    next: u32,
}

/// What the merge loop needs from the vocabulary.
pub(crate) trait SpmVocab {
    fn token(&self, text: &[u8]) -> Option<u32>;
    /// The token's merge priority: 0 for the highest score; equal scores share a rank.
    fn rank(&self, id: u32) -> u32;
    /// One past the largest rank.
    fn n_ranks(&self) -> usize;
    /// The token for a raw byte: `<0xNN>`, else the one-byte token, else `None`.
    fn byte_token(&self, b: u8) -> Option<u32>;
}

/// Texts past this size are tokenized in halves (cut at a character boundary) so every index
/// fits a `u32`; no prompt gets there.
const MAX_TEXT: usize = 1 << 30;

/// Tokenizes already-escaped text, appending ids to `out`.
pub(crate) fn tokenize(v: &impl SpmVocab, text: &[u8], out: &mut Vec<u32>) {
    if text.len() > MAX_TEXT {
        let mut mid = text.len() / 2;
        while mid > 0 && text[mid] & 0xC0 == 0x80 {
            mid -= 1;
        }
        tokenize(v, &text[..mid], out);
        tokenize(v, &text[mid..], out);
        return;
    }
    let mut symbols: Vec<Symbol> = Vec::with_capacity(text.len());
    let mut offs = 0;
    while offs < text.len() {
        let len = utf8_len(text[offs]).min(text.len() - offs);
        let index = symbols.len() as u32;
        symbols.push(Symbol {
            start: offs as u32,
            len: len as u32,
            prev: if index == 0 { NONE } else { index - 1 },
            next: if offs + len == text.len() {
                NONE
            } else {
                index + 1
            },
        });
        offs += len;
    }
    // Highest score first, leftmost on ties (llama.cpp's `llm_bigram_spm` order), through the
    // rank-bucketed queue; a queued pair is current iff the pair now at its left position is
    // still a token of that rank (llama.cpp checks the pair's byte length instead).
    let mut queue = RankQueue::default();
    queue.reset(v.n_ranks());
    for i in 1..symbols.len() as u32 {
        if let Some(rank) = pair_rank(v, text, &symbols, i - 1, i) {
            queue.push(rank, i - 1);
        }
    }
    let mut bucket = Vec::new();
    while let Some(rank) = queue.pop_bucket(&mut bucket) {
        let mut k = 0;
        while k < bucket.len() {
            let l = bucket[k];
            k += 1;
            let left = symbols[l as usize];
            if left.len == 0 || left.next == NONE {
                continue; // absorbed, or nothing to its right any more
            }
            if pair_rank(v, text, &symbols, l, left.next) != Some(rank) {
                continue; // one side has grown since the pair was queued
            }
            let right = symbols[left.next as usize];
            symbols[l as usize].len += right.len;
            symbols[l as usize].next = right.next;
            symbols[left.next as usize].len = 0;
            if right.next != NONE {
                symbols[right.next as usize].prev = l;
            }
            // A new pair that outranks this bucket must go first (see `queue`).
            let mut preempt = false;
            for (a, b) in [(left.prev, l), (l, right.next)] {
                if a != NONE
                    && b != NONE
                    && let Some(r2) = pair_rank(v, text, &symbols, a, b)
                {
                    queue.push(r2, a);
                    preempt |= r2 <= rank;
                }
            }
            if preempt {
                for &rest in &bucket[k..] {
                    queue.push(rank, rest);
                }
                break;
            }
        }
    }
    let mut i = if symbols.is_empty() { NONE } else { 0 };
    while i != NONE {
        let s = symbols[i as usize];
        let piece = &text[s.start as usize..(s.start + s.len) as usize];
        match v.token(piece) {
            Some(id) => out.push(id),
            // llama.cpp throws when a byte has no token at all; we drop that byte.
            None => out.extend(piece.iter().filter_map(|&b| v.byte_token(b))),
        }
        i = s.next;
    }
}

/// The rank of the token the adjacent symbols `l`, `r` form together, if any.
fn pair_rank(v: &impl SpmVocab, text: &[u8], symbols: &[Symbol], l: u32, r: u32) -> Option<u32> {
    let (l, r) = (symbols[l as usize], symbols[r as usize]);
    // Adjacent symbols are contiguous in the text: their concatenation is a slice.
    let joined = &text[l.start as usize..(r.start + r.len) as usize];
    v.token(joined).map(|id| v.rank(id))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    struct Toy {
        ids: HashMap<Vec<u8>, u32>,
        scores: Vec<f32>,
    }

    impl Toy {
        /// Byte tokens `<0x00>`..`<0xFF>` are ids 0..=255, then the given pieces in order.
        fn new(pieces: &[(&str, f32)]) -> Toy {
            let mut ids = HashMap::new();
            let mut scores = Vec::new();
            for b in 0..=255u32 {
                ids.insert(format!("<0x{b:02X}>").into_bytes(), b);
                scores.push(0.0);
            }
            for (p, s) in pieces {
                ids.insert(p.as_bytes().to_vec(), scores.len() as u32);
                scores.push(*s);
            }
            Toy { ids, scores }
        }
        fn run(&self, text: &str) -> Vec<u32> {
            let mut out = Vec::new();
            tokenize(self, text.as_bytes(), &mut out);
            out
        }
    }

    impl SpmVocab for Toy {
        fn token(&self, text: &[u8]) -> Option<u32> {
            self.ids.get(text).copied()
        }
        fn rank(&self, id: u32) -> u32 {
            // Scores here are small multiples of 0.5: rank by them directly.
            (-self.scores[id as usize] * 2.0) as u32
        }
        fn n_ranks(&self) -> usize {
            64
        }
        fn byte_token(&self, b: u8) -> Option<u32> {
            Some(b as u32)
        }
    }

    #[test]
    fn highest_score_pair_merges_first() {
        // "abc": "ab" (-1) and "bc" (-0.5) compete; "bc" wins, then "a"+"bc" is no token.
        let t = Toy::new(&[
            ("a", -3.0),
            ("b", -3.0),
            ("c", -3.0),
            ("ab", -1.0),
            ("bc", -0.5),
        ]);
        assert_eq!(t.run("abc"), [256, 260]);
        // With "abc" in the vocabulary the second merge happens.
        let t = Toy::new(&[
            ("a", -3.),
            ("b", -3.),
            ("c", -3.),
            ("ab", -1.),
            ("bc", -0.5),
            ("abc", -2.),
        ]);
        assert_eq!(t.run("abc"), [261]);
    }

    #[test]
    fn ties_merge_the_leftmost_pair() {
        let t = Toy::new(&[("a", -1.0), ("aa", -1.0)]);
        assert_eq!(t.run("aaa"), [257, 256]);
    }

    #[test]
    fn unknown_characters_fall_back_to_byte_tokens() {
        let t = Toy::new(&[("h", -1.0), ("i", -1.0), ("hi", -0.1)]);
        assert_eq!(t.run("hi é"), [258, 0x20, 0xC3, 0xA9]);
    }
}
