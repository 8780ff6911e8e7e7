//! WordPiece (`tokenizer.ggml.model = "bert"`), as llama.cpp's `llm_tokenizer_wpm_session`
//! runs it.
//!
//! The text is normalized the BERT way (lower case, accents stripped through the Unicode NFD
//! table `scripts/gen-nfd-ranges.py` makes, the one llama.cpp's is made from, control
//! characters dropped) and cut into words at whitespace, with each
//! punctuation, ASCII symbol and CJK ideograph a word of its own. Each word, prefixed with `▁`
//! (GGUF BERT vocabularies mark word starts so, where Hugging Face marks continuations with
//! `##`), is then covered greedily by the longest token at each byte; a word that cannot be
//! covered is the unknown token.

use std::sync::OnceLock;

use super::unicode::{decode_lenient, flags, push_utf8};

/// What WordPiece needs besides the vocabulary's text index.
pub(crate) struct WpmTables {
    /// `tokenizer.ggml.normalizer.lowercase` (default true).
    pub lowercase: bool,
    /// `tokenizer.ggml.normalizer.strip_accents` (default: as `lowercase`).
    pub strip_accents: bool,
    /// The distinct byte lengths of the token texts, longest first: the greedy match tries
    /// only these instead of every length up to the longest token (same result, and a
    /// vocabulary with one huge token cannot make each position cost that much).
    pub lengths: Vec<usize>,
}

impl WpmTables {
    pub fn new(texts: &[Box<[u8]>], lowercase: bool, strip_accents: bool) -> WpmTables {
        let mut lengths: Vec<usize> = texts.iter().map(|t| t.len()).collect();
        lengths.sort_unstable_by(|a, b| b.cmp(a));
        lengths.dedup();
        WpmTables {
            lowercase,
            strip_accents,
            lengths,
        }
    }
}

/// Tokenizes one stretch of plain text, appending ids to `out`. `unk` is pushed for a word
/// no tokens cover (llama.cpp would push -1 when the vocabulary has no unknown token; we push
/// nothing).
pub(crate) fn tokenize(
    t: &WpmTables,
    lookup: &dyn Fn(&[u8]) -> Option<u32>,
    unk: Option<u32>,
    text: &[u8],
    out: &mut Vec<u32>,
) {
    let mut word: Vec<u8> = Vec::new();
    for w in words(t, text) {
        word.clear();
        word.extend_from_slice("\u{2581}".as_bytes());
        word.extend_from_slice(&w);
        let start = out.len();
        let mut i = 0;
        while i < word.len() {
            let rest = word.len() - i;
            let found = t
                .lengths
                .iter()
                .filter(|&&len| len <= rest)
                .find_map(|&len| lookup(&word[i..i + len]).map(|id| (id, len)));
            match found {
                Some((id, len)) => {
                    out.push(id);
                    i += len;
                }
                None => {
                    out.truncate(start); // one gap: the whole word is unknown
                    break;
                }
            }
        }
        if out.len() == start {
            out.extend(unk);
        }
    }
}

/// llama.cpp's `preprocess`: the normalized words of `text`, none empty.
fn words(t: &WpmTables, text: &[u8]) -> Vec<Vec<u8>> {
    let mut cpts = Vec::new();
    decode_lenient(text, &mut cpts);
    let mut words: Vec<Vec<u8>> = vec![Vec::new()];
    for mut cpt in cpts {
        if t.strip_accents {
            cpt = nfd_first(cpt);
        }
        let f = flags(cpt);
        if f.is_whitespace() {
            if !words.last().is_some_and(Vec::is_empty) {
                words.push(Vec::new());
            }
            continue;
        }
        if cpt == 0 || cpt == 0xFFFD || f.is_control() || (t.strip_accents && f.is_mark()) {
            continue;
        }
        let mut s = Vec::new();
        push_utf8(if t.lowercase { lower(cpt) } else { cpt }, &mut s);
        if f.is_punctuation() || (cpt < 0x7F && f.is_symbol()) || is_chinese_char(cpt) {
            if !words.last().is_some_and(Vec::is_empty) {
                words.push(Vec::new());
            }
            words.push(Vec::new());
            let n = words.len();
            words[n - 2] = s; // a word of its own
        } else if let Some(last) = words.last_mut() {
            last.extend_from_slice(&s);
        }
    }
    words.retain(|w| !w.is_empty());
    words
}

/// Unicode's simple lower-case mapping (llama.cpp's `unicode_tolower`). Rust's full mapping
/// differs only where it yields several characters (U+0130 → "i̇"); the first is the simple one.
fn lower(cpt: u32) -> u32 {
    char::from_u32(cpt)
        .and_then(|c| c.to_lowercase().next())
        .map_or(cpt, |c| c as u32)
}

/// The CJK ideograph blocks of Hugging Face's BERT (`_is_chinese_char`), 0x2B920 included.
fn is_chinese_char(cpt: u32) -> bool {
    matches!(cpt,
        0x4E00..=0x9FFF
        | 0x3400..=0x4DBF
        | 0x20000..=0x2A6DF
        | 0x2A700..=0x2B73F
        | 0x2B740..=0x2B81F
        | 0x2B920..=0x2CEAF
        | 0xF900..=0xFAFF
        | 0x2F800..=0x2FA1F)
}

/// The first codepoint of `cpt`'s NFD form, through the Unicode table in nfd_ranges.txt.
fn nfd_first(cpt: u32) -> u32 {
    let ranges = nfd_ranges();
    let i = ranges.partition_point(|&(_, last, _)| last < cpt);
    match ranges.get(i) {
        Some(&(first, _, nfd)) if first <= cpt => nfd,
        _ => cpt,
    }
}

/// `(first, last, nfd)`, sorted; parsed once from the shipped text (a malformed entry, which
/// the unit test rules out, is skipped rather than a panic).
fn nfd_ranges() -> &'static [(u32, u32, u32)] {
    static RANGES: OnceLock<Vec<(u32, u32, u32)>> = OnceLock::new();
    RANGES.get_or_init(|| {
        let hex = |s: &str| u32::from_str_radix(s, 16).ok();
        include_str!("nfd_ranges.txt")
            .lines()
            .filter(|l| !l.starts_with('#'))
            .flat_map(str::split_whitespace)
            .filter_map(|e| {
                let (range, nfd) = e.split_once(':')?;
                let (first, last) = range.split_once('-').unwrap_or((range, range));
                Some((hex(first)?, hex(last)?, hex(nfd)?))
            })
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words_of(text: &str) -> Vec<String> {
        let t = WpmTables::new(&[], true, true);
        words(&t, text.as_bytes())
            .into_iter()
            .map(|w| String::from_utf8(w).unwrap())
            .collect()
    }

    #[test]
    fn the_nfd_table_is_whole_and_sorted() {
        let r = nfd_ranges();
        assert_eq!(r.len(), 1827, "every entry of nfd_ranges.txt parses");
        assert!(r.windows(2).all(|w| w[0].1 < w[1].0));
        assert_eq!(nfd_first('é' as u32), 'e' as u32);
        assert_eq!(
            nfd_first('가' as u32),
            0x1100,
            "Hangul: the leading consonant"
        );
        assert_eq!(nfd_first('x' as u32), 'x' as u32);
    }

    #[test]
    fn words_are_lowered_stripped_and_cut_at_punctuation() {
        assert_eq!(
            words_of("Héllo, WORLD!\u{3000}中文 a$b e\u{301}\u{200b}x"),
            ["hello", ",", "world", "!", "中", "文", "a", "$", "b", "ex"]
        );
        assert_eq!(words_of("  \t "), Vec::<String>::new());
        assert_eq!(words_of("İ"), ["i"]);
    }

    #[test]
    fn a_word_is_the_longest_tokens_or_unknown() {
        let texts: Vec<Box<[u8]>> = ["[UNK]", "▁un", "▁unaff", "able", "aff", "▁x"]
            .iter()
            .map(|s| s.as_bytes().into())
            .collect();
        let t = WpmTables::new(&texts, true, true);
        let lookup = |s: &[u8]| texts.iter().position(|t| &**t == s).map(|i| i as u32);
        let mut out = Vec::new();
        tokenize(&t, &lookup, Some(0), b"Unaffable x unq", &mut out);
        assert_eq!(out, [2, 3, 5, 0]);
    }
}
