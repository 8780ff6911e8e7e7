//! The Unicode pieces the tokenizers need, with llama.cpp's exact conventions (its
//! `unicode.cpp`): lenient UTF-8 decoding, per-codepoint category flags, and GPT-2's
//! byte↔unicode table.
//!
//! The category table is built once at first use from `regex-syntax`'s Unicode tables rather
//! than shipped as a generated source file. llama.cpp's table is generated the same way (from
//! `\p{N}`, `\p{L}`, … of Python's `regex`), so the two agree except for characters assigned
//! in a Unicode version newer than the one llama.cpp's table was made from (they are
//! "undefined" there); such characters are vanishingly rare in prompts.

use std::sync::OnceLock;

/// Category and whitespace flags of one codepoint, with llama.cpp's bit values
/// (`unicode_cpt_flags`). `Flags(0)` means "outside the current chunk" in the splitters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Flags(u16);

impl Flags {
    pub const UNDEFINED: u16 = 0x0001;
    pub const NUMBER: u16 = 0x0002;
    pub const LETTER: u16 = 0x0004;
    pub const SEPARATOR: u16 = 0x0008;
    pub const MARK: u16 = 0x0010;
    pub const PUNCTUATION: u16 = 0x0020;
    pub const SYMBOL: u16 = 0x0040;
    pub const CONTROL: u16 = 0x0080;
    pub const WHITESPACE: u16 = 0x0100;

    pub fn bits(self) -> u16 {
        self.0
    }
    pub fn is_number(self) -> bool {
        self.0 & Self::NUMBER != 0
    }
    pub fn is_letter(self) -> bool {
        self.0 & Self::LETTER != 0
    }
    pub fn is_symbol(self) -> bool {
        self.0 & Self::SYMBOL != 0
    }
    pub fn is_control(self) -> bool {
        self.0 & Self::CONTROL != 0
    }
    pub fn is_mark(self) -> bool {
        self.0 & Self::MARK != 0
    }
    pub fn is_punctuation(self) -> bool {
        self.0 & Self::PUNCTUATION != 0
    }
    pub fn is_whitespace(self) -> bool {
        self.0 & Self::WHITESPACE != 0
    }
}

/// Flags for the Basic Multilingual Plane by direct index, and sorted `(start, flags)` runs for
/// the supplementary planes (each run lasts until the next start).
struct Table {
    bmp: Box<[u16]>,
    astral: Vec<(u32, u16)>,
}

const MAX_CODEPOINTS: u32 = 0x11_0000;

static TABLE: OnceLock<Table> = OnceLock::new();

/// The flags of a codepoint. Values past U+10FFFF (which lenient decoding can produce) are
/// undefined, as in llama.cpp.
pub(crate) fn flags(cpt: u32) -> Flags {
    let t = TABLE.get_or_init(build_table);
    if cpt < 0x1_0000 {
        return Flags(t.bmp[cpt as usize]);
    }
    if cpt >= MAX_CODEPOINTS {
        return Flags(Flags::UNDEFINED);
    }
    // The last run starting at or before `cpt`; the table always starts at U+10000.
    let i = t.astral.partition_point(|&(start, _)| start <= cpt);
    Flags(
        t.astral
            .get(i.wrapping_sub(1))
            .map_or(Flags::UNDEFINED, |r| r.1),
    )
}

/// The codepoint ranges of a `\p{…}` class according to `regex-syntax`. A class that does not
/// parse (it always does) yields no ranges rather than a panic.
fn class_ranges(pattern: &str) -> Vec<(u32, u32)> {
    use regex_syntax::hir::{Class, HirKind};
    let Ok(hir) = regex_syntax::Parser::new().parse(pattern) else {
        return Vec::new();
    };
    match hir.kind() {
        HirKind::Class(Class::Unicode(c)) => c
            .ranges()
            .iter()
            .map(|r| (r.start() as u32, r.end() as u32))
            .collect(),
        _ => Vec::new(),
    }
}

fn build_table() -> Table {
    // Categories are exclusive; unassigned codepoints (Cn) stay UNDEFINED as in llama.cpp's
    // table, surrogates (which Rust chars cannot hold) are Cs, hence CONTROL.
    let mut all = vec![Flags::UNDEFINED; MAX_CODEPOINTS as usize];
    let categories = [
        (r"\p{N}", Flags::NUMBER),
        (r"\p{L}", Flags::LETTER),
        (r"\p{Z}", Flags::SEPARATOR),
        (r"\p{M}", Flags::MARK),
        (r"\p{P}", Flags::PUNCTUATION),
        (r"\p{S}", Flags::SYMBOL),
        (r"\p{Cc}", Flags::CONTROL),
        (r"\p{Cf}", Flags::CONTROL),
        (r"\p{Co}", Flags::CONTROL),
    ];
    for (pattern, flag) in categories {
        for (lo, hi) in class_ranges(pattern) {
            all[lo as usize..=hi as usize].fill(flag);
        }
    }
    all[0xD800..=0xDFFF].fill(Flags::CONTROL);
    for (lo, hi) in class_ranges(r"\p{White_Space}") {
        for f in &mut all[lo as usize..=hi as usize] {
            *f |= Flags::WHITESPACE;
        }
    }
    let mut astral: Vec<(u32, u16)> = Vec::new();
    for (i, &f) in all.iter().enumerate().skip(0x1_0000) {
        if astral.last().is_none_or(|&(_, last)| last != f) {
            astral.push((i as u32, f));
        }
    }
    all.truncate(0x1_0000);
    Table {
        bmp: all.into_boxed_slice(),
        astral,
    }
}

/// Decodes UTF-8 the way llama.cpp's `unicode_cpts_from_utf8` does: the lead byte alone
/// decides the length (no overlong or surrogate checks), and a byte that does not start a
/// complete sequence becomes U+FFFD and is skipped. Never fails, whatever the bytes.
pub(crate) fn decode_lenient(bytes: &[u8], out: &mut Vec<u32>) {
    out.clear();
    out.reserve(bytes.len());
    let cont = |i: usize| bytes.get(i).is_some_and(|&b| b & 0xC0 == 0x80);
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i] as u32;
        let (cpt, len) = if b & 0x80 == 0 {
            (b, 1)
        } else if b & 0x40 == 0 {
            (0xFFFD, 0)
        } else if b & 0x20 == 0 {
            if cont(i + 1) {
                (((b & 0x1F) << 6) | (bytes[i + 1] as u32 & 0x3F), 2)
            } else {
                (0xFFFD, 0)
            }
        } else if b & 0x10 == 0 {
            if cont(i + 1) && cont(i + 2) {
                let c = ((b & 0x0F) << 12)
                    | ((bytes[i + 1] as u32 & 0x3F) << 6)
                    | (bytes[i + 2] as u32 & 0x3F);
                (c, 3)
            } else {
                (0xFFFD, 0)
            }
        } else if b & 0x08 == 0 {
            if cont(i + 1) && cont(i + 2) && cont(i + 3) {
                let c = ((b & 0x07) << 18)
                    | ((bytes[i + 1] as u32 & 0x3F) << 12)
                    | ((bytes[i + 2] as u32 & 0x3F) << 6)
                    | (bytes[i + 3] as u32 & 0x3F);
                (c, 4)
            } else {
                (0xFFFD, 0)
            }
        } else {
            (0xFFFD, 0)
        };
        out.push(cpt);
        i += len.max(1);
    }
}

/// Appends the UTF-8 form of a codepoint as llama.cpp's `unicode_cpt_to_utf8` writes it
/// (surrogates included). Values past U+10FFFF, which only lenient decoding of 4-byte forms
/// produces, keep their 4-byte shape where llama.cpp would throw.
pub(crate) fn push_utf8(cpt: u32, out: &mut Vec<u8>) {
    if cpt <= 0x7F {
        out.push(cpt as u8);
    } else if cpt <= 0x7FF {
        out.extend_from_slice(&[0xC0 | (cpt >> 6) as u8 & 0x1F, 0x80 | (cpt & 0x3F) as u8]);
    } else if cpt <= 0xFFFF {
        out.extend_from_slice(&[
            0xE0 | (cpt >> 12) as u8 & 0x0F,
            0x80 | (cpt >> 6) as u8 & 0x3F,
            0x80 | (cpt & 0x3F) as u8,
        ]);
    } else {
        out.extend_from_slice(&[
            0xF0 | (cpt >> 18) as u8 & 0x07,
            0x80 | (cpt >> 12) as u8 & 0x3F,
            0x80 | (cpt >> 6) as u8 & 0x3F,
            0x80 | (cpt & 0x3F) as u8,
        ]);
    }
}

/// Byte length of the UTF-8 sequence a lead byte announces (1 for stray continuation bytes),
/// llama.cpp's `unicode_len_utf8`.
pub(crate) fn utf8_len(lead: u8) -> usize {
    const LOOKUP: [usize; 16] = [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4];
    LOOKUP[(lead >> 4) as usize]
}

/// GPT-2's reversible byte→codepoint map: printable Latin-1 bytes map to themselves, the rest
/// (controls, space, …) to U+0100 onwards in byte order, so every byte has a visible char.
/// Both directions are tables built once: the forward one by byte, the inverse one by
/// codepoint (only U+0000..U+0143 are used).
struct ByteMap {
    to_cpt: [u32; 256],
    to_byte: [Option<u8>; 324],
}

fn byte_map() -> &'static ByteMap {
    static MAP: OnceLock<ByteMap> = OnceLock::new();
    MAP.get_or_init(|| {
        let mut m = ByteMap {
            to_cpt: [0; 256],
            to_byte: [None; 324],
        };
        let mut n = 0;
        for b in 0..=255u8 {
            let printable = matches!(b, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF);
            let cpt = if printable {
                b as u32
            } else {
                n += 1;
                255 + n
            };
            m.to_cpt[b as usize] = cpt;
            m.to_byte[cpt as usize] = Some(b);
        }
        m
    })
}

pub(crate) fn byte_to_cpt(b: u8) -> u32 {
    byte_map().to_cpt[b as usize]
}

/// The inverse of [`byte_to_cpt`]: `None` for codepoints outside the 256 used ones.
pub(crate) fn cpt_to_byte(cpt: u32) -> Option<u8> {
    *byte_map().to_byte.get(cpt as usize)?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn categories_match_llama_cpp_conventions() {
        assert!(flags('a' as u32).is_letter());
        assert!(flags('7' as u32).is_number());
        assert!(flags('½' as u32).is_number());
        assert!(flags(' ' as u32).is_whitespace());
        assert!(flags(0x3000).is_whitespace());
        assert!(!flags(0x1C).is_whitespace(), "\\x1c is not White_Space");
        assert!(flags('!' as u32).is_punctuation());
        assert_eq!(flags('$' as u32).bits(), Flags::SYMBOL);
        assert_eq!(flags(0x0378).bits(), Flags::UNDEFINED, "unassigned");
        assert_eq!(flags(0xD800).bits(), Flags::CONTROL, "surrogate");
        assert!(flags(0x20000).is_letter(), "CJK extension B");
        assert_eq!(flags(0x11_0000).bits(), Flags::UNDEFINED);
    }

    #[test]
    fn lenient_decoding_replaces_each_bad_byte() {
        let mut out = Vec::new();
        decode_lenient(b"a\xffb\xe4\xbd", &mut out);
        assert_eq!(out, vec![0x61, 0xFFFD, 0x62, 0xFFFD, 0xFFFD]);
        decode_lenient("é你😀".as_bytes(), &mut out);
        assert_eq!(out, vec![0xE9, 0x4F60, 0x1F600]);
    }

    #[test]
    fn gpt2_byte_map_round_trips_every_byte() {
        for b in 0..=255u8 {
            assert_eq!(cpt_to_byte(byte_to_cpt(b)), Some(b));
        }
        assert_eq!(byte_to_cpt(b' '), 0x120, "space is Ġ");
        assert_eq!(byte_to_cpt(b'\n'), 0x10A, "newline is Ċ");
        assert_eq!(cpt_to_byte(0x4F60), None);
    }
}
