//! Ids → bytes: token pieces (`llama_token_to_piece`) and whole sequences
//! (`llama_detokenize`), including llama.cpp's space clean-up passes.

use super::unicode::{cpt_to_byte, decode_lenient, push_utf8};
use super::vocab::attr;
use super::{Tokenizer, VocabKind};

/// The piece of one token with `special = true`, computed once per token at load.
pub(crate) fn piece_of(kind: VocabKind, text: &[u8], a: u32) -> Vec<u8> {
    if a & (attr::UNKNOWN | attr::CONTROL | attr::USER_DEFINED) != 0 {
        return text.to_vec();
    }
    if a & attr::NORMAL != 0 {
        return match kind {
            VocabKind::Spm | VocabKind::Gemma4 | VocabKind::Wpm => unescape_spaces(text),
            VocabKind::Bpe => gpt2_text_to_bytes(text),
        };
    }
    if a & attr::BYTE != 0 {
        return vec![byte_token_value(text)];
    }
    Vec::new() // undefined and unused tokens render as nothing
}

/// `▁` (U+2581) back to spaces.
fn unescape_spaces(text: &[u8]) -> Vec<u8> {
    const ESC: &[u8] = "\u{2581}".as_bytes();
    let mut out = Vec::with_capacity(text.len());
    let mut i = 0;
    while i < text.len() {
        if text[i..].starts_with(ESC) {
            out.push(b' ');
            i += ESC.len();
        } else {
            out.push(text[i]);
            i += 1;
        }
    }
    out
}

/// GPT-2 characters back to the bytes they stand for (llama.cpp's `llama_decode_text`); a
/// character outside the byte map is spelled out as llama.cpp does.
fn gpt2_text_to_bytes(text: &[u8]) -> Vec<u8> {
    let mut cpts = Vec::new();
    decode_lenient(text, &mut cpts);
    let mut out = Vec::with_capacity(text.len());
    for &c in &cpts {
        match cpt_to_byte(c) {
            Some(b) => out.push(b),
            None => {
                let mut utf8 = Vec::new();
                push_utf8(c, &mut utf8);
                out.extend_from_slice(b"[UNK_BYTE_0x");
                for b in utf8 {
                    out.extend_from_slice(format!("{b:02x}").as_bytes());
                }
                out.extend_from_slice(text);
                out.push(b']');
            }
        }
    }
    out
}

/// The byte of a `<0xNN>` token, parsed like llama.cpp's `strtol(text.substr(3, 2), 16)`:
/// leading hex digits only, 0 when there are none.
fn byte_token_value(text: &[u8]) -> u8 {
    let digits = text.get(3..).unwrap_or(&[]);
    let mut v: u32 = 0;
    for &d in digits.iter().take(2) {
        match (d as char).to_digit(16) {
            Some(x) => v = v * 16 + x,
            None => break,
        }
    }
    v as u8
}

pub(crate) fn detokenize(
    t: &Tokenizer,
    ids: &[u32],
    remove_special: bool,
    unparse_special: bool,
) -> Vec<u8> {
    let mut ids = ids;
    // SentencePiece-style models drop the dummy-prefix space of the first piece.
    let mut remove_space = t.add_space_prefix;
    if remove_special && t.add_bos && !ids.is_empty() && Some(ids[0]) == t.specials.bos {
        remove_space = false;
        ids = &ids[1..];
    }
    if remove_special && t.add_eos && ids.last().is_some_and(|&l| Some(l) == t.specials.eos) {
        ids = &ids[..ids.len() - 1];
    }
    let mut out = Vec::new();
    for &id in ids {
        let mut piece = t.token_to_piece_special(id, unparse_special);
        if remove_space && piece.first() == Some(&b' ') {
            piece = &piece[1..];
        }
        remove_space = false;
        out.extend_from_slice(piece);
    }
    if t.clean_spaces {
        clean_spaces(&mut out);
    }
    out
}

/// llama.cpp's three clean-up passes for BPE models that ask for them, ported index for index
/// (the second pass edits the buffer it reads, which later checks see).
fn clean_spaces(text: &mut Vec<u8>) {
    // " ?", " !", " .", " ," lose their space.
    let n1 = text.len();
    let mut total = n1.min(1);
    for i in 1..n1 {
        let x = text[i];
        if text[i - 1] == b' ' && matches!(x, b'?' | b'!' | b'.' | b',') {
            total -= 1;
        }
        text[total] = x;
        total += 1;
    }
    // " ' " becomes "'".
    let n2 = total;
    total = n2.min(1);
    let mut i = 1;
    while i < n2 {
        let x = text[i];
        if x == b'\'' && i + 1 < n2 && text[i - 1] == b' ' && text[i + 1] == b' ' {
            total -= 1;
            i += 1;
            text[i] = 0;
        }
        text[total] = x;
        total += 1;
        i += 1;
    }
    // " 's", " 'm", " 're", " 've" lose their space (" 't", " 'd", " 'll" keep it).
    let n3 = total;
    total = n3.min(1);
    for i in 1..n3 {
        let x = text[i];
        if text[i - 1] == b' ' && x == b'\'' && i + 1 < n3 {
            let x1 = text[i + 1];
            if matches!(x1, b's' | b'm') {
                total -= 1;
            } else if !matches!(x1, b't' | b'd') && i + 2 < n3 {
                let x2 = text[i + 2];
                if (x1 == b'r' || x1 == b'v') && x2 == b'e' {
                    total -= 1;
                }
            }
        }
        text[total] = x;
        total += 1;
    }
    text.truncate(total);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cleaned(s: &str) -> String {
        let mut v = s.as_bytes().to_vec();
        clean_spaces(&mut v);
        String::from_utf8(v).unwrap()
    }

    #[test]
    fn clean_up_removes_spaces_before_punctuation_and_some_contractions() {
        assert_eq!(cleaned("Hi , you . ok ?"), "Hi, you. ok?");
        assert_eq!(
            cleaned("it 's I 'm we 're they 've"),
            "it's I'm we're they've"
        );
        assert_eq!(cleaned("don 't I 'd we 'll"), "don 't I 'd we 'll");
        assert_eq!(cleaned("a ' b"), "a'b");
        assert_eq!(cleaned(""), "");
        assert_eq!(cleaned(" ."), ".");
    }

    #[test]
    fn byte_tokens_parse_like_strtol() {
        assert_eq!(byte_token_value(b"<0x0A>"), 0x0A);
        assert_eq!(byte_token_value(b"<0xfF>"), 0xFF);
        assert_eq!(byte_token_value(b"<0x"), 0);
        assert_eq!(byte_token_value(b"<0xG1>"), 0);
    }

    #[test]
    fn gpt2_pieces_map_back_to_raw_bytes() {
        assert_eq!(gpt2_text_to_bytes("Ġworld".as_bytes()), b" world");
        assert_eq!(gpt2_text_to_bytes("ä½".as_bytes()), [0xE4, 0xBD]);
        assert_eq!(
            gpt2_text_to_bytes("你".as_bytes()),
            b"[UNK_BYTE_0xe4bda0\xe4\xbd\xa0]"
        );
    }
}
