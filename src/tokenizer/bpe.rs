//! Byte-level BPE (GPT-2 style, `tokenizer.ggml.model = "gpt2"`), as llama.cpp's
//! `llm_tokenizer_bpe_session` merges a word.
//!
//! A word's bytes are first mapped to GPT-2's visible characters; the symbols are then merged
//! pairwise, always the pair of lowest merge rank first (leftmost on ties), until no adjacent
//! pair has a rank. llama.cpp compares strings at every step; here every string a merge can
//! produce or consume is interned once at load into a symbol id, so the merge table is keyed
//! by `(id, id)` and merging a word allocates nothing. Candidate pairs queued by rank and a
//! linked list of live symbols make a word of n bytes cost O(n log n).
//!
//! Gemma 4's vocabulary (`gemma4` model) is BPE over raw UTF-8 instead ([`BpeTables::raw`]):
//! words start as UTF-8 characters rather than GPT-2 characters of bytes, and a symbol that is
//! no token falls back to `<0xNN>` byte tokens.

use super::FastMap;
use super::queue::{NONE, RankQueue};
use super::unicode::{byte_to_cpt, push_utf8, utf8_len};

/// Symbol ids at or past the vocabulary size name merge strings that are not tokens.
pub(crate) const NO_SYMBOL: u32 = u32::MAX;

/// The load-time tables of byte-level BPE.
pub(crate) struct BpeTables {
    /// `(left, right)` → `(rank, merged)`, lowest rank kept when a merge line repeats.
    pub merges: FastMap<(u32, u32), (u32, u32)>,
    /// The symbol id of each byte's GPT-2 character, `NO_SYMBOL` if no token or merge has it.
    pub byte_symbol: [u32; 256],
    /// The GPT-2 character of each byte, as UTF-8.
    pub byte_text: Vec<Vec<u8>>,
    /// The token whose text is exactly one given byte (llama.cpp's last-resort fallback).
    pub single_byte_token: [Option<u32>; 256],
    /// One past the highest rank.
    pub n_ranks: usize,
    /// Raw UTF-8 BPE (Gemma 4): no GPT-2 byte map; a word that is only newlines and a token
    /// as a whole is that token (llama.cpp's fix for Gemma 4, its PR 21343).
    pub raw: bool,
    /// Raw mode: the symbol ids of merge strings one UTF-8 character long that are no token
    /// (a word's first symbols are its characters).
    pub char_symbols: FastMap<Box<[u8]>, u32>,
    /// Raw mode: the `<0xNN>` token of each byte, for symbols that are no token.
    pub hex_byte_token: [Option<u32>; 256],
}

impl BpeTables {
    /// Builds the tables; `lookup` finds a token by text. Merge lines are `"left right"`, split
    /// at the first space after the first byte as llama.cpp does; a line without one is skipped.
    pub fn new<'a>(
        n_vocab: u32,
        lookup: impl Fn(&[u8]) -> Option<u32>,
        merges: impl Iterator<Item = &'a [u8]>,
        raw: bool,
    ) -> BpeTables {
        let mut extra: FastMap<Vec<u8>, u32> = FastMap::default();
        let mut intern = |s: &[u8]| -> u32 {
            if let Some(id) = lookup(s) {
                return id;
            }
            let next = n_vocab + extra.len() as u32;
            *extra.entry(s.to_vec()).or_insert(next)
        };
        let mut table: FastMap<(u32, u32), (u32, u32)> = FastMap::default();
        let mut joined = Vec::new();
        let mut n_ranks = 0;
        for (rank, line) in merges.enumerate() {
            n_ranks = rank + 1;
            let Some(pos) = line.iter().skip(1).position(|&b| b == b' ').map(|p| p + 1) else {
                continue;
            };
            let (left, right) = (&line[..pos], &line[pos + 1..]);
            joined.clear();
            joined.extend_from_slice(left);
            joined.extend_from_slice(right);
            let key = (intern(left), intern(right));
            let merged = intern(&joined);
            table.entry(key).or_insert((rank as u32, merged));
        }
        let char_symbols = if raw {
            extra
                .iter()
                .filter(|(t, _)| !t.is_empty() && utf8_len(t[0]) == t.len())
                .map(|(t, &id)| (t.clone().into_boxed_slice(), id))
                .collect()
        } else {
            FastMap::default()
        };
        let mut hex_byte_token = [None; 256];
        if raw {
            for (b, slot) in hex_byte_token.iter_mut().enumerate() {
                *slot = lookup(format!("<0x{b:02X}>").as_bytes());
            }
        }
        let mut byte_symbol = [NO_SYMBOL; 256];
        let mut byte_text = Vec::with_capacity(256);
        let mut single_byte_token = [None; 256];
        for b in 0..=255u8 {
            let mut text = Vec::new();
            push_utf8(byte_to_cpt(b), &mut text);
            byte_symbol[b as usize] = lookup(&text)
                .or_else(|| extra.get(&text).copied())
                .unwrap_or(NO_SYMBOL);
            byte_text.push(text);
            single_byte_token[b as usize] = lookup(&[b]);
        }
        BpeTables {
            n_ranks,
            raw,
            char_symbols,
            hex_byte_token,
            merges: table,
            byte_symbol,
            byte_text,
            single_byte_token,
        }
    }
}

#[derive(Clone, Copy)]
struct Symbol {
    id: u32,
    start: u32,
    end: u32,
    prev: u32,
    next: u32,
}

/// Reusable buffers for merging words, so a long prompt does not allocate per word.
#[derive(Default)]
pub(crate) struct BpeScratch {
    symbols: Vec<Symbol>,
    queue: RankQueue,
    bucket: Vec<u32>,
    encoded: Vec<u8>,
}

/// Words are split in halves past this size so every index fits a `u32` (a prompt never
/// gets there; the split only keeps hostile sizes from overflowing).
const MAX_WORD: usize = 1 << 30;

/// Merges one word (its UTF-8 bytes) and appends its tokens to `out`.
pub(crate) fn merge_word(
    t: &BpeTables,
    n_vocab: u32,
    lookup: &dyn Fn(&[u8]) -> Option<u32>,
    ignore_merges: bool,
    word: &[u8],
    s: &mut BpeScratch,
    out: &mut Vec<u32>,
) {
    if word.is_empty() {
        return;
    }
    if ignore_merges || (t.raw && word.iter().all(|&b| b == b'\n')) {
        // Llama 3 style: a word that is a token as a whole is taken as is.
        s.encoded.clear();
        if t.raw {
            s.encoded.extend_from_slice(word);
        } else {
            for &b in word {
                s.encoded.extend_from_slice(&t.byte_text[b as usize]);
            }
        }
        if let Some(id) = lookup(&s.encoded) {
            out.push(id);
            return;
        }
    }
    if word.len() > MAX_WORD {
        // At a character boundary, so raw mode's characters stay whole.
        let mut mid = word.len() / 2;
        while mid > 1 && word[mid] & 0xC0 == 0x80 {
            mid -= 1;
        }
        let (a, b) = word.split_at(mid);
        merge_word(t, n_vocab, lookup, ignore_merges, a, s, out);
        merge_word(t, n_vocab, lookup, ignore_merges, b, s, out);
        return;
    }
    s.symbols.clear();
    s.queue.reset(t.n_ranks);
    // The first symbols: one per byte (its GPT-2 character), or one per UTF-8 character in
    // raw mode (cut where the lead byte says, as llama.cpp does, even if that is invalid).
    let mut start = 0;
    while start < word.len() {
        let (len, id) = if t.raw {
            let len = utf8_len(word[start]).min(word.len() - start);
            let c = &word[start..start + len];
            let id = lookup(c).or_else(|| t.char_symbols.get(c).copied());
            (len, id.unwrap_or(NO_SYMBOL))
        } else {
            (1, t.byte_symbol[word[start] as usize])
        };
        let i = s.symbols.len() as u32;
        s.symbols.push(Symbol {
            id,
            start: start as u32,
            end: (start + len) as u32,
            prev: if i == 0 { NONE } else { i - 1 },
            next: i + 1,
        });
        start += len;
    }
    if let Some(last) = s.symbols.last_mut() {
        last.next = NONE;
    }
    let n = s.symbols.len() as u32;
    for i in 1..n {
        if let Some(rank) = pair_rank(t, &s.symbols, i - 1, i) {
            s.queue.push(rank, i - 1);
        }
    }
    let mut bucket = std::mem::take(&mut s.bucket);
    while let Some(rank) = s.queue.pop_bucket(&mut bucket) {
        let mut i = 0;
        while i < bucket.len() {
            let l = bucket[i];
            i += 1;
            let left = s.symbols[l as usize];
            if left.start == left.end || left.next == NONE {
                continue; // absorbed, or nothing to its right any more
            }
            let r = left.next;
            let right = s.symbols[r as usize];
            // A rank names exactly one (left, right) pair: the entry is current iff the pair
            // now at `l` still has this rank (llama.cpp compares the pair's text instead).
            let merged = match t.merges.get(&(left.id, right.id)) {
                Some(&(rk, merged)) if rk == rank => merged,
                _ => continue,
            };
            let l_sym = &mut s.symbols[l as usize];
            l_sym.id = merged;
            l_sym.end = right.end;
            l_sym.next = right.next;
            s.symbols[r as usize].end = right.start; // empty: absorbed
            if right.next != NONE {
                s.symbols[right.next as usize].prev = l;
            }
            // New pairs normally rank after the merge that made their token; if a merge table
            // says otherwise, they must go first: put the rest of this bucket back and re-pick.
            let mut preempt = false;
            for (a, b) in [(left.prev, l), (l, right.next)] {
                if a != NONE
                    && b != NONE
                    && let Some(r2) = pair_rank(t, &s.symbols, a, b)
                {
                    s.queue.push(r2, a);
                    preempt |= r2 <= rank;
                }
            }
            if preempt {
                for &rest in &bucket[i..] {
                    s.queue.push(rank, rest);
                }
                break;
            }
        }
    }
    s.bucket = bucket;
    let mut i = 0;
    while i != NONE {
        let sym = s.symbols[i as usize];
        if sym.id < n_vocab {
            out.push(sym.id);
        } else if t.raw {
            // Not a token: each byte as `<0xNN>` (dropped when there is none, as in llama.cpp).
            for &b in &word[sym.start as usize..sym.end as usize] {
                out.extend(t.hex_byte_token[b as usize]);
            }
        } else {
            // Not a token: llama.cpp looks up each byte of the symbol's GPT-2 text alone.
            for &b in &word[sym.start as usize..sym.end as usize] {
                for &e in &t.byte_text[b as usize] {
                    out.extend(t.single_byte_token[e as usize]);
                }
            }
        }
        i = sym.next;
    }
}

/// The merge rank of the pair `(l, r)`, if it has one.
fn pair_rank(t: &BpeTables, symbols: &[Symbol], l: u32, r: u32) -> Option<u32> {
    let (lid, rid) = (symbols[l as usize].id, symbols[r as usize].id);
    if lid == NO_SYMBOL || rid == NO_SYMBOL {
        return None;
    }
    t.merges.get(&(lid, rid)).map(|&(rank, _)| rank)
}
