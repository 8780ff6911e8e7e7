//! SentencePiece-style BPE (`tokenizer.ggml.model = "llama"`, the Llama 1/2, Mistral, TinyLlama
//! family), as llama.cpp's `llm_tokenizer_spm_session` runs it.
//!
//! The text (spaces already escaped to U+2581 by the caller) is cut into UTF-8 characters;
//! adjacent symbols whose concatenation is a token are merged, highest token score first
//! (leftmost on ties), until no adjacent pair forms a token. A symbol left that is not a token
//! falls back to byte tokens `<0xNN>`. No such model ships with this project: the path is
//! tested on a small synthetic vocabulary with hand-computed results (see the tests below).

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use super::unicode::utf8_len;

#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: usize,
    next: usize,
}

const NONE: usize = usize::MAX;

struct Bigram {
    score: f32,
    left: usize,
    right: usize,
    size: usize,
}

// Max-heap order: higher score first, then lower `left` (llama.cpp's `llm_bigram_spm`).
// `total_cmp` keeps the order total even for NaN scores from a hostile file.
impl Ord for Bigram {
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.left.cmp(&self.left))
    }
}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Bigram {}

/// What the merge loop needs from the vocabulary.
pub(crate) trait SpmVocab {
    fn token(&self, text: &[u8]) -> Option<u32>;
    fn score(&self, id: u32) -> f32;
    /// The token for a raw byte: `<0xNN>`, else the one-byte token, else `None`.
    fn byte_token(&self, b: u8) -> Option<u32>;
}

/// Tokenizes already-escaped text, appending ids to `out`.
pub(crate) fn tokenize(v: &impl SpmVocab, text: &[u8], out: &mut Vec<u32>) {
    let mut symbols = Vec::with_capacity(text.len());
    let mut offs = 0;
    while offs < text.len() {
        let len = utf8_len(text[offs]).min(text.len() - offs);
        let index = symbols.len();
        symbols.push(Symbol {
            start: offs,
            len,
            prev: index.wrapping_sub(1), // usize::MAX (NONE) for the first
            next: if offs + len == text.len() {
                NONE
            } else {
                index + 1
            },
        });
        offs += len;
    }
    let mut queue = BinaryHeap::new();
    for i in 1..symbols.len() {
        try_add(v, text, &symbols, &mut queue, i - 1, i);
    }
    while let Some(b) = queue.pop() {
        let (l, r) = (symbols[b.left], symbols[b.right]);
        if l.len == 0 || r.len == 0 || l.len + r.len != b.size {
            continue; // one side already merged elsewhere
        }
        symbols[b.left].len += r.len;
        symbols[b.right].len = 0;
        symbols[b.left].next = r.next;
        if r.next != NONE {
            symbols[r.next].prev = b.left;
        }
        try_add(v, text, &symbols, &mut queue, l.prev, b.left);
        try_add(v, text, &symbols, &mut queue, b.left, r.next);
    }
    let mut i = if symbols.is_empty() { NONE } else { 0 };
    while i != NONE {
        let s = symbols[i];
        let piece = &text[s.start..s.start + s.len];
        match v.token(piece) {
            Some(id) => out.push(id),
            // llama.cpp throws when a byte has no token at all; we drop that byte.
            None => out.extend(piece.iter().filter_map(|&b| v.byte_token(b))),
        }
        i = s.next;
    }
}

fn try_add(
    v: &impl SpmVocab,
    text: &[u8],
    symbols: &[Symbol],
    queue: &mut BinaryHeap<Bigram>,
    left: usize,
    right: usize,
) {
    if left == NONE || right == NONE {
        return;
    }
    let (l, r) = (symbols[left], symbols[right]);
    // Adjacent symbols are contiguous in the text: their concatenation is a slice.
    let joined = &text[l.start..r.start + r.len];
    if let Some(id) = v.token(joined) {
        queue.push(Bigram {
            score: v.score(id),
            left,
            right,
            size: joined.len(),
        });
    }
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
        fn score(&self, id: u32) -> f32 {
            self.scores[id as usize]
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
