//! Streaming detokenization: byte-level pieces can split a UTF-8 character across tokens
//! (`你` is two tokens in SmolLM2), so a stream of pieces is turned into text only up to the
//! last complete character; the incomplete tail waits for the next piece.

/// Accumulates piece bytes and hands out complete UTF-8 text.
///
/// ```
/// use edgellm::tokenizer::StreamDecoder;
/// let mut d = StreamDecoder::new();
/// assert_eq!(d.push(&[0xE4, 0xBD]), "");
/// assert_eq!(d.push(&[0xA0, b'!']), "你!");
/// assert_eq!(d.finish(), "");
/// ```
#[derive(Clone, Debug, Default)]
pub struct StreamDecoder {
    pending: Vec<u8>,
}

impl StreamDecoder {
    pub fn new() -> StreamDecoder {
        StreamDecoder::default()
    }

    /// Adds a piece; returns the text that is now complete. Bytes that can never become valid
    /// UTF-8 are emitted as U+FFFD right away, so the stream never stalls; at most 3 bytes of
    /// an unfinished character are held back.
    pub fn push(&mut self, piece: &[u8]) -> String {
        let mut out = String::new();
        self.push_into(piece, &mut out);
        out
    }

    /// Like [`Self::push`], appending to `out`.
    pub fn push_into(&mut self, piece: &[u8], out: &mut String) {
        self.pending.extend_from_slice(piece);
        let mut start = 0;
        loop {
            match std::str::from_utf8(&self.pending[start..]) {
                Ok(s) => {
                    out.push_str(s);
                    start = self.pending.len();
                    break;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    // Safe: from_utf8 just validated these bytes.
                    out.push_str(
                        std::str::from_utf8(&self.pending[start..start + valid])
                            .unwrap_or_default(),
                    );
                    start += valid;
                    match e.error_len() {
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            start += bad;
                        }
                        None => break, // an incomplete character at the end: keep it
                    }
                }
            }
        }
        self.pending.drain(..start);
    }

    /// Ends the stream: whatever is held back is emitted (as U+FFFD if incomplete).
    pub fn finish(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        out
    }

    /// Bytes held back, waiting for the rest of a character.
    pub fn pending(&self) -> &[u8] {
        &self.pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partial_characters_are_held_back_until_complete() {
        let mut d = StreamDecoder::new();
        let text = "你好，世界 😀";
        let mut got = String::new();
        for b in text.as_bytes() {
            got += &d.push(&[*b]);
            assert!(d.pending().len() <= 3);
        }
        assert_eq!(got, text);
        assert_eq!(d.finish(), "");
    }

    #[test]
    fn invalid_bytes_become_replacement_characters_without_stalling() {
        let mut d = StreamDecoder::new();
        assert_eq!(d.push(b"a\xFFb"), "a\u{FFFD}b");
        assert_eq!(d.push(b"\xE4\xBD"), "");
        assert_eq!(d.push(b"x"), "\u{FFFD}x");
        assert_eq!(d.push(b"\xF0\x9F"), "");
        assert_eq!(d.finish(), "\u{FFFD}");
    }
}
