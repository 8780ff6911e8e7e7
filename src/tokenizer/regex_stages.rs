//! The pre-tokenizer stages llama.cpp runs through `std::regex` rather than a hand-written
//! matcher: one simple regex shape each (`[X]`, `[X]+`, `\s?[X]+`, `\s+$`, `[0-9]{3}`) over a
//! character class. llama.cpp applies them to "collapsed" text when the regex names a Unicode
//! category (`\p{L}`: every non-ASCII codepoint becomes one byte per category) and to the wide
//! text otherwise; either way non-ASCII whitespace is first replaced by U+000B, so it matches
//! `\s` and never a class. Each shape is matched here by hand, in linear time, with
//! `std::regex`'s leftmost-first semantics; [`wide`] and the `is_*` classes do the replacing.

use super::unicode::{Flags, flags};

pub(super) const OUT_OF_RANGE: u32 = u32::MAX;

/// One chunk of the previous stage: reads outside it see no codepoint and empty flags, which
/// is how llama.cpp keeps each chunk independent (a regex cannot look across chunks).
pub(super) struct Chunk<'a> {
    pub cpts: &'a [u32],
    pub ini: usize,
    pub end: usize,
    pub prev_end: usize,
}

impl Chunk<'_> {
    pub fn cpt(&self, pos: usize) -> u32 {
        if self.ini <= pos && pos < self.end {
            self.cpts[pos]
        } else {
            OUT_OF_RANGE
        }
    }

    pub fn flags(&self, pos: usize) -> Flags {
        if self.ini <= pos && pos < self.end {
            flags(self.cpts[pos])
        } else {
            Flags::default()
        }
    }

    /// Ends the current word at `end`; returns its length (0 words are not recorded).
    pub fn add(&mut self, end: usize, out: &mut Vec<usize>) -> usize {
        let len = end - self.prev_end;
        if len > 0 {
            out.push(len);
        }
        self.prev_end = end;
        len
    }
}

pub(super) fn for_each_chunk(
    cpts: &[u32],
    chunks: &[usize],
    mut f: impl FnMut(&mut Chunk, &mut Vec<usize>),
) -> Vec<usize> {
    let mut out = Vec::with_capacity(chunks.len() * 2);
    let mut start = 0;
    for &len in chunks {
        let mut c = Chunk {
            cpts,
            ini: start,
            end: start + len,
            prev_end: start,
        };
        f(&mut c, &mut out);
        start += len;
    }
    out
}

/// A `\p{N}` regex: every number codepoint is a word of its own, the text between stays whole.
pub(super) fn single_numbers(cpts: &[u32], chunks: &[usize]) -> Vec<usize> {
    for_each_chunk(cpts, chunks, |c, out| {
        for pos in c.ini..c.end {
            if is_number(c.cpts[pos]) {
                c.add(pos, out);
                c.add(pos + 1, out);
            }
        }
        c.add(c.end, out);
    })
}

/// A `[class]+` regex: maximal runs of class members are words, and so is the text between.
pub(super) fn class_runs(cpts: &[u32], chunks: &[usize], member: fn(u32) -> bool) -> Vec<usize> {
    for_each_chunk(cpts, chunks, |c, out| {
        let mut pos = c.ini;
        while pos < c.end {
            let inside = member(c.cpts[pos]);
            while pos < c.end && member(c.cpts[pos]) == inside {
                pos += 1;
            }
            c.add(pos, out);
        }
    })
}

/// `[0-9][0-9][0-9]`: leftmost runs of three ASCII digits are words.
pub(super) fn ascii_digit_triples(cpts: &[u32], chunks: &[usize]) -> Vec<usize> {
    let digit = |x: u32| (b'0' as u32..=b'9' as u32).contains(&x);
    for_each_chunk(cpts, chunks, |c, out| {
        let mut pos = c.ini;
        while pos < c.end {
            if pos + 3 <= c.end && (pos..pos + 3).all(|p| digit(c.cpts[p])) {
                c.add(pos, out);
                c.add(pos + 3, out);
                pos += 3;
            } else {
                pos += 1;
            }
        }
        c.add(c.end, out);
    })
}

/// `\p{N}` on llama.cpp's collapsed text: ASCII digits, or a non-ASCII number that is not
/// whitespace (whitespace collapses to a vertical tab before categories are looked at).
pub(super) fn is_number(cpt: u32) -> bool {
    let f = flags(cpt);
    f.is_number() && !f.is_whitespace()
}

/// `[\p{P}\$\+<=>\^~\|]` on collapsed text: punctuation or one of `$+<=>^~|`.
pub(super) fn is_default_punct(cpt: u32) -> bool {
    let f = flags(cpt);
    (f.is_punctuation() && !f.is_whitespace()) || "$+<=>^~|".bytes().any(|b| b as u32 == cpt)
}

/// A `[X]` regex: every member is a word of its own, the text between stays whole.
pub(super) fn singles(cpts: &[u32], chunks: &[usize], member: fn(u32) -> bool) -> Vec<usize> {
    for_each_chunk(cpts, chunks, |c, out| {
        for pos in c.ini..c.end {
            if member(c.cpts[pos]) {
                c.add(pos, out);
                c.add(pos + 1, out);
            }
        }
        c.add(c.end, out);
    })
}

/// `\s?[X]+`: a run of members, with the one whitespace codepoint before it when there is one.
/// At each position the regex first tries to take a whitespace and then needs a member after
/// it; failing that, it needs a member right there.
pub(super) fn space_then_runs(
    cpts: &[u32],
    chunks: &[usize],
    member: fn(u32) -> bool,
) -> Vec<usize> {
    for_each_chunk(cpts, chunks, |c, out| {
        let (cpts, end) = (c.cpts, c.end);
        let is = |pos: usize| pos < end && member(cpts[pos]);
        let mut pos = c.ini;
        while pos < c.end {
            let start = pos;
            if is_space(c.cpts[pos]) && is(pos + 1) {
                pos += 1;
            } else if !is(pos) {
                pos += 1;
                continue;
            }
            while is(pos) {
                pos += 1;
            }
            c.add(start, out);
            c.add(pos, out);
        }
        c.add(c.end, out);
    })
}

/// `\s+$`: the whitespace that ends a chunk is a word of its own (`$` is the chunk's end: the
/// regex only ever sees one chunk).
pub(super) fn trailing_whitespace(cpts: &[u32], chunks: &[usize]) -> Vec<usize> {
    for_each_chunk(cpts, chunks, |c, out| {
        let mut start = c.end;
        while start > c.ini && is_space(c.cpts[start - 1]) {
            start -= 1;
        }
        c.add(start, out);
        c.add(c.end, out);
    })
}

/// `\s` on llama.cpp's texts: ASCII space, tab, LF, VT, FF, CR (the C locale's), plus every
/// non-ASCII whitespace, which became U+000B. Unicode's White_Space is exactly that.
fn is_space(cpt: u32) -> bool {
    flags(cpt).is_whitespace()
}

/// The codepoint a `std::wregex` sees: non-ASCII whitespace is U+000B.
fn wide(cpt: u32) -> u32 {
    if cpt > 0x7F && is_space(cpt) {
        0x0B
    } else {
        cpt
    }
}

fn in_ranges(ranges: &[(u32, u32)], cpt: u32) -> bool {
    let i = ranges.partition_point(|&(_, hi)| hi < cpt);
    ranges.get(i).is_some_and(|&(lo, _)| lo <= cpt)
}

/// `[\r\n]`.
pub(super) fn is_crlf(cpt: u32) -> bool {
    cpt == '\r' as u32 || cpt == '\n' as u32
}

/// `\p{L}` on collapsed text (letters are never whitespace, so nothing collapses away).
pub(super) fn is_letter(cpt: u32) -> bool {
    flags(cpt).is_letter()
}

/// `\p{P}` on collapsed text: punctuation that is not whitespace.
pub(super) fn is_punct(cpt: u32) -> bool {
    let f = flags(cpt);
    f.is_punctuation() && !f.is_whitespace()
}

/// `[\p{P}\$\+<=>\^~\|`]` (falcon): the default's class with the backtick.
pub(super) fn is_falcon_punct(cpt: u32) -> bool {
    is_default_punct(cpt) || cpt == '`' as u32
}

/// deepseek-llm's letter class, `[A-Za-zµÀ-ÖØ-öø-ƺ…]`: the cased letters of some Unicode
/// version, spelled out as codepoint ranges in llama.cpp (so not `\p{L}`), copied here as is.
const DEEPSEEK_LETTERS: &[(u32, u32)] = &[
    (0x41, 0x5A),
    (0x61, 0x7A),
    (0xB5, 0xB5),
    (0xC0, 0xD6),
    (0xD8, 0xF6),
    (0xF8, 0x1BA),
    (0x1BC, 0x1BF),
    (0x1C4, 0x293),
    (0x295, 0x2AF),
    (0x370, 0x373),
    (0x376, 0x376),
    (0x377, 0x377),
    (0x37B, 0x37D),
    (0x37F, 0x37F),
    (0x386, 0x386),
    (0x388, 0x38A),
    (0x38C, 0x38C),
    (0x38E, 0x3A1),
    (0x3A3, 0x3F5),
    (0x3F7, 0x481),
    (0x48A, 0x52F),
    (0x531, 0x556),
    (0x10A0, 0x10C5),
    (0x13A0, 0x13F5),
    (0x13F8, 0x13FD),
    (0x1C90, 0x1CBA),
    (0x1CBD, 0x1CBF),
    (0x1D00, 0x1D2B),
    (0x1D6B, 0x1D77),
    (0x1D79, 0x1D9A),
    (0x1E00, 0x1F15),
    (0x1F18, 0x1F1D),
    (0x1F20, 0x1F45),
    (0x1F48, 0x1F4D),
    (0x1F50, 0x1F57),
    (0x1F59, 0x1F59),
    (0x1F5B, 0x1F5B),
    (0x1F5D, 0x1F5D),
    (0x1F5F, 0x1F7D),
    (0x1F80, 0x1FB4),
    (0x1FB6, 0x1FBC),
    (0x1FBE, 0x1FBE),
    (0x1FC2, 0x1FC4),
    (0x1FC6, 0x1FCC),
    (0x1FD0, 0x1FD3),
    (0x1FD6, 0x1FDB),
    (0x1FE0, 0x1FEC),
    (0x1FF2, 0x1FF4),
    (0x1FF6, 0x1FFC),
    (0x2102, 0x2102),
    (0x2107, 0x2107),
    (0x210A, 0x2113),
    (0x2115, 0x2115),
    (0x2119, 0x211D),
    (0x2124, 0x2124),
    (0x2126, 0x2126),
    (0x2128, 0x2128),
    (0x212A, 0x212D),
    (0x212F, 0x2134),
    (0x2139, 0x2139),
    (0x213C, 0x213F),
    (0x2145, 0x2149),
    (0x214E, 0x214E),
    (0x2183, 0x2183),
    (0x2184, 0x2184),
    (0x2C00, 0x2C7B),
    (0x2C7E, 0x2CE4),
    (0x2CEB, 0x2CEE),
    (0x2CF2, 0x2CF2),
    (0x2CF3, 0x2CF3),
    (0xA640, 0xA66D),
    (0xA680, 0xA69B),
    (0xA722, 0xA76F),
    (0xA771, 0xA787),
    (0xA78B, 0xA78E),
    (0xAB70, 0xABBF),
    (0xFB00, 0xFB06),
    (0xFB13, 0xFB17),
    (0xFF21, 0xFF3A),
    (0xFF41, 0xFF5A),
    (0x10400, 0x1044F),
    (0x104B0, 0x104D3),
    (0x104D8, 0x104FB),
    (0x10C80, 0x10CB2),
    (0x10CC0, 0x10CF2),
    (0x118A0, 0x118DF),
    (0x1E900, 0x1E943),
];

pub(super) fn is_deepseek_letter(cpt: u32) -> bool {
    in_ranges(DEEPSEEK_LETTERS, wide(cpt))
}

/// deepseek-llm's punctuation, `[!-/:-~！-／：-～‘-‟　-。]`: ASCII `:-~` includes the letters,
/// and U+3000 never matches (it is whitespace, so it became U+000B).
const DEEPSEEK_PUNCT: &[(u32, u32)] = &[
    (0x21, 0x2F),
    (0x3A, 0x7E),
    (0x2018, 0x201F),
    (0x3000, 0x3002),
    (0xFF01, 0xFF0F),
    (0xFF1A, 0xFF5E),
];

pub(super) fn is_deepseek_punct(cpt: u32) -> bool {
    in_ranges(DEEPSEEK_PUNCT, wide(cpt))
}

/// `[一-龥ࠀ-一가-퟿]` (both deepseeks): U+0800..U+9FA5 and U+AC00..U+D7FF, whitespace excepted.
const DEEPSEEK_CJK: &[(u32, u32)] = &[(0x0800, 0x9FA5), (0xAC00, 0xD7FF)];

pub(super) fn is_deepseek_cjk(cpt: u32) -> bool {
    in_ranges(DEEPSEEK_CJK, wide(cpt))
}
