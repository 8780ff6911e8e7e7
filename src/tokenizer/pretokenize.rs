//! Pre-tokenizers of byte-level BPE vocabularies: they cut text into words before merging.
//!
//! llama.cpp describes each pre-tokenizer (`tokenizer.ggml.pre`) as a list of regexes applied
//! one after the other, each splitting the pieces the previous one produced (the text between
//! matches stays a piece too). It runs the GPT-2, Llama 3, Qwen 2 / 3.5 and newline regexes
//! through hand-written matchers (`unicode_regex_split_custom_*`) and the others through
//! `std::regex` on text whose non-ASCII codepoints are collapsed to one byte per category.
//! This module re-implements the stages the supported pre-tokenizers use, by hand, with the
//! same semantics, in linear time: the custom matchers here, the `std::regex` shapes in
//! `regex_stages`. A piece is a run of codepoints and its length is all a stage returns.

use super::regex_stages::{
    Chunk, OUT_OF_RANGE, ascii_digit_triples, class_runs, for_each_chunk, is_crlf, is_deepseek_cjk,
    is_deepseek_letter, is_deepseek_punct, is_default_punct, is_falcon_punct, is_letter, is_number,
    is_punct, single_numbers, singles, space_then_runs, trailing_whitespace,
};
use super::unicode::{Flags, flags};

/// The regex families of `tokenizer.ggml.pre` values this crate implements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PreTokenizer {
    /// llama.cpp's fallback (`default`, or no `tokenizer.ggml.pre`): punctuation runs, GPT-2,
    /// number runs, then ASCII digit triples.
    Default,
    /// GPT-2's regex alone (`gpt-2`, `phi-2`, `olmo`, `mpt`, …).
    Gpt2,
    /// Each digit on its own, then GPT-2's regex (`smollm`, `starcoder`, `refact`, …).
    DigitsThenGpt2,
    /// Llama 3's regex: letters with one optional leading non-letter, numbers in groups of up
    /// to three, newlines kept with punctuation (`llama3`, `llama-bpe`, `dbrx`, …).
    Llama3,
    /// Qwen 2's regex: Llama 3's with single digits (`qwen2`, `deepseek-r1-qwen`, `stablelm2`, …).
    Qwen2,
    /// Qwen 3.5's regex: Qwen 2's where combining marks (`\p{M}`) join letter runs (`qwen35`).
    Qwen35,
    /// The default's stages with the backtick among the punctuation and no number runs
    /// (`falcon`).
    Falcon,
    /// Newlines alone, runs of (cased) letters and of ASCII/CJK punctuation each with one
    /// leading space, trailing whitespace, CJK runs, number runs (`deepseek-llm`).
    DeepseekLlm,
    /// Newlines alone, letter and punctuation runs with one leading space, CJK runs, single
    /// digits (`deepseek-coder`).
    DeepseekCoder,
    /// Runs of newlines and runs of everything else (`[^\n]+|[\n]+`): Gemma 4's, whose BPE
    /// merges across spaces.
    Newlines,
}

/// Splits `cpts` into words; returns their lengths in codepoints (they add up to `cpts.len()`).
pub(crate) fn split(pre: PreTokenizer, cpts: &[u32]) -> Vec<usize> {
    if cpts.is_empty() {
        return Vec::new();
    }
    let whole = vec![cpts.len()];
    match pre {
        PreTokenizer::Default => {
            let s = class_runs(cpts, &whole, is_default_punct);
            let s = gpt2(cpts, &s);
            let s = class_runs(cpts, &s, is_number);
            ascii_digit_triples(cpts, &s)
        }
        PreTokenizer::Gpt2 => gpt2(cpts, &whole),
        PreTokenizer::DigitsThenGpt2 => gpt2(cpts, &single_numbers(cpts, &whole)),
        PreTokenizer::Llama3 => llama3(cpts, &whole, 3, false),
        PreTokenizer::Qwen2 => llama3(cpts, &whole, 1, false),
        PreTokenizer::Qwen35 => llama3(cpts, &whole, 1, true),
        PreTokenizer::Newlines => class_runs(cpts, &whole, |c| c == '\n' as u32),
        PreTokenizer::Falcon => {
            let s = class_runs(cpts, &whole, is_falcon_punct);
            let s = gpt2(cpts, &s);
            ascii_digit_triples(cpts, &s)
        }
        PreTokenizer::DeepseekLlm => {
            let s = singles(cpts, &whole, is_crlf);
            let s = space_then_runs(cpts, &s, is_deepseek_letter);
            let s = space_then_runs(cpts, &s, is_deepseek_punct);
            let s = trailing_whitespace(cpts, &s);
            let s = class_runs(cpts, &s, is_deepseek_cjk);
            class_runs(cpts, &s, is_number)
        }
        PreTokenizer::DeepseekCoder => {
            let s = singles(cpts, &whole, is_crlf);
            let s = space_then_runs(cpts, &s, is_letter);
            let s = space_then_runs(cpts, &s, is_punct);
            let s = class_runs(cpts, &s, is_deepseek_cjk);
            single_numbers(cpts, &s)
        }
    }
}

/// `'s|'t|'re|'ve|'m|'ll|'d` at `pos`: the match length, 0 if none. `fold` makes it case
/// insensitive (Llama 3 / Qwen 2); only ASCII letters fold to these, so ASCII folding is exact.
fn contraction(c: &Chunk, pos: usize, fold: bool) -> usize {
    if c.cpt(pos) != '\'' as u32 || pos + 1 >= c.end {
        return 0;
    }
    let low = |x: u32| {
        if fold && (b'A' as u32..=b'Z' as u32).contains(&x) {
            x + 32
        } else {
            x
        }
    };
    let n1 = low(c.cpt(pos + 1));
    if [b's', b't', b'm', b'd'].iter().any(|&b| n1 == b as u32) {
        return 2;
    }
    if pos + 2 < c.end {
        let n2 = low(c.cpt(pos + 2));
        let pair = |a: u8, b: u8| n1 == a as u32 && n2 == b as u32;
        if pair(b'r', b'e') || pair(b'v', b'e') || pair(b'l', b'l') {
            return 3;
        }
    }
    0
}

fn is_other(f: Flags) -> bool {
    !(f.is_whitespace() || f.is_letter() || f.is_number()) && f.bits() != 0
}

/// GPT-2: `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`, as
/// llama.cpp's `unicode_regex_split_custom_gpt2` matches it.
fn gpt2(cpts: &[u32], chunks: &[usize]) -> Vec<usize> {
    for_each_chunk(cpts, chunks, |c, out| {
        let mut pos = c.ini;
        while pos < c.end {
            let cpt = c.cpts[pos];
            let n = contraction(c, pos, false);
            if n > 0 {
                pos += c.add(pos + n, out);
                continue;
            }
            let space = cpt == ' ' as u32;
            let mut f2 = if space { c.flags(pos + 1) } else { flags(cpt) };
            for class in [Flags::is_letter, Flags::is_number, is_other] {
                if class(f2) {
                    pos += space as usize;
                    while class(f2) {
                        pos += 1;
                        f2 = c.flags(pos);
                    }
                    break;
                }
            }
            if pos > c.prev_end {
                c.add(pos, out);
                continue;
            }
            pos = whitespace_tail(c, pos, out);
        }
    })
}

/// The shared end of the GPT-2 and Llama 3 matchers: `\s+(?!\S)|\s+`, or one lone codepoint.
fn whitespace_tail(c: &mut Chunk, pos: usize, out: &mut Vec<usize>) -> usize {
    let mut n = 0;
    while c.flags(pos + n).is_whitespace() {
        n += 1;
    }
    let end = if n > 1 && c.cpt(pos + n) != OUT_OF_RANGE {
        pos + n - 1 // leave the last space to prefix the next word
    } else if n > 0 {
        pos + n
    } else {
        pos + 1
    };
    c.add(end, out);
    end
}

/// Llama 3 (`max_digits` 3) and Qwen 2 (`max_digits` 1):
/// `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`,
/// as llama.cpp's `unicode_regex_split_custom_llama3` / `_qwen2` match it. With `marks`, Qwen
/// 3.5's: `\p{L}+` becomes `[\p{L}\p{M}]+` and the punctuation class excludes `\p{M}` too
/// (`unicode_regex_split_custom_qwen35`), so a combining accent stays on its letter.
fn llama3(cpts: &[u32], chunks: &[usize], max_digits: usize, marks: bool) -> Vec<usize> {
    let is_crlf = |x: u32| x == '\r' as u32 || x == '\n' as u32;
    let wordy = |f: Flags| f.is_letter() || (marks && f.is_mark());
    let other = |f: Flags| !(f.is_whitespace() || wordy(f) || f.is_number()) && f.bits() != 0;
    for_each_chunk(cpts, chunks, |c, out| {
        let mut pos = c.ini;
        while pos < c.end {
            let cpt = c.cpts[pos];
            let f = flags(cpt);
            let n = contraction(c, pos, true);
            if n > 0 {
                pos += c.add(pos + n, out);
                continue;
            }
            // [^\r\n\p{L}\p{N}]?\p{L}+ (or [\p{L}\p{M}]+)
            if !(is_crlf(cpt) || f.is_number()) && (wordy(f) || wordy(c.flags(pos + 1))) {
                pos += 1;
                while wordy(c.flags(pos)) {
                    pos += 1;
                }
                c.add(pos, out);
                continue;
            }
            // \p{N}{1,max_digits}
            if f.is_number() {
                let mut ini = pos;
                while c.flags(pos).is_number() {
                    pos += 1;
                    if pos - ini >= max_digits {
                        c.add(pos, out);
                        ini = pos;
                    }
                }
                c.add(pos, out);
                continue;
            }
            // ` ?[^\s\p{L}\p{N}]+[\r\n]*`; llama.cpp tests the first char's own flags here,
            // which only matters for a space at the very end of a chunk (it becomes a word).
            let space = cpt == ' ' as u32;
            let mut f2 = if space { c.flags(pos + 1) } else { f };
            if !(f2.is_whitespace() || wordy(f2) || f2.is_number()) && f.bits() != 0 {
                pos += space as usize;
                while other(f2) {
                    pos += 1;
                    f2 = c.flags(pos);
                }
                while is_crlf(c.cpt(pos)) {
                    pos += 1;
                }
                c.add(pos, out);
                continue;
            }
            // \s*[\r\n]+ : up to the last CR/LF of the whitespace run.
            let mut n = 0;
            let mut last_crlf_end = 0;
            while c.flags(pos + n).is_whitespace() {
                if is_crlf(c.cpt(pos + n)) {
                    last_crlf_end = pos + n + 1;
                }
                n += 1;
            }
            if last_crlf_end > 0 {
                pos = last_crlf_end;
                c.add(pos, out);
                continue;
            }
            pos = whitespace_tail(c, pos, out);
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(pre: PreTokenizer, text: &str) -> Vec<String> {
        let cpts: Vec<u32> = text.chars().map(|c| c as u32).collect();
        let mut start = 0;
        split(pre, &cpts)
            .into_iter()
            .map(|n| {
                let w: String = text.chars().skip(start).take(n).collect();
                start += n;
                w
            })
            .collect()
    }

    #[test]
    fn gpt2_keeps_the_space_before_a_word_and_the_last_of_a_run() {
        assert_eq!(
            words(PreTokenizer::Gpt2, "Hello  world's 42!!\n"),
            ["Hello", " ", " world", "'s", " 42", "!!", "\n"]
        );
    }

    #[test]
    fn smollm_splits_digits_one_by_one() {
        assert_eq!(
            words(PreTokenizer::DigitsThenGpt2, "age >= 18x"),
            ["age", " >=", " ", "1", "8", "x"]
        );
    }

    #[test]
    fn llama3_groups_digits_by_three_and_keeps_newlines_with_punctuation() {
        assert_eq!(
            words(PreTokenizer::Llama3, "1234567 I'M ok.\n\n  x"),
            ["123", "456", "7", " I", "'M", " ok", ".\n\n", " ", " x"]
        );
    }

    #[test]
    fn qwen2_splits_single_digits() {
        assert_eq!(
            words(PreTokenizer::Qwen2, "x=123"),
            ["x", "=", "1", "2", "3"]
        );
    }

    #[test]
    fn default_cuts_punctuation_runs_and_digit_triples() {
        assert_eq!(
            words(PreTokenizer::Default, "a+b 12345"),
            ["a", "+", "b", " ", "123", "45"]
        );
    }

    #[test]
    fn qwen35_keeps_combining_marks_on_their_letters() {
        let text = "e\u{301}'T x\u{308}";
        assert_eq!(
            words(PreTokenizer::Qwen35, text),
            ["e\u{301}", "'T", " x\u{308}"]
        );
        assert_eq!(
            words(PreTokenizer::Qwen2, text),
            ["e", "\u{301}'", "T", " x", "\u{308}"]
        );
    }

    #[test]
    fn falcon_counts_the_backtick_as_punctuation() {
        assert_eq!(
            words(PreTokenizer::Falcon, "a``b 12345"),
            ["a", "``", "b", " ", "123", "45"]
        );
    }

    #[test]
    fn deepseek_llm_cuts_newlines_letters_punctuation_and_trailing_space() {
        // U+3000 is whitespace to llama.cpp's regexes: a leading space, never punctuation.
        assert_eq!(
            words(PreTokenizer::DeepseekLlm, "ab\u{3000}！\n  "),
            ["ab", "\u{3000}！", "\n", "  "]
        );
        assert_eq!(
            words(PreTokenizer::DeepseekLlm, "!\u{3000}"),
            ["!", "\u{3000}"]
        );
        assert_eq!(words(PreTokenizer::DeepseekLlm, "½  "), ["½", "  "]);
    }

    #[test]
    fn deepseek_coder_splits_digits_one_by_one() {
        assert_eq!(
            words(PreTokenizer::DeepseekCoder, "x1 23\n"),
            ["x", "1", " ", "2", "3", "\n"]
        );
    }

    #[test]
    fn gemma4_words_are_newline_runs_and_the_text_between() {
        assert_eq!(
            words(PreTokenizer::Newlines, "a b\n\nc"),
            ["a b", "\n\n", "c"]
        );
    }

    #[test]
    fn words_always_cover_the_whole_text() {
        let text = "x\u{0378}\u{3000}\u{0301}é ½'S\r\n \t！一";
        for pre in [
            PreTokenizer::Default,
            PreTokenizer::Gpt2,
            PreTokenizer::DigitsThenGpt2,
            PreTokenizer::Llama3,
            PreTokenizer::Qwen2,
            PreTokenizer::Qwen35,
            PreTokenizer::Falcon,
            PreTokenizer::DeepseekLlm,
            PreTokenizer::DeepseekCoder,
            PreTokenizer::Newlines,
        ] {
            assert_eq!(words(pre, text).concat(), text, "{pre:?}");
        }
    }
}
