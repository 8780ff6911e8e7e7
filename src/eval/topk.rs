//! The file of a reference model's logits that `perplexity --save-logits` writes and
//! `--kl-divergence` reads: per scored position, the reference's top-k tokens' log-probabilities
//! and the rest of its mass as one bucket ([`RefPoint`]).
//!
//! llama.cpp saves every logit (as 16-bit quantized log-probabilities): 98 KB a position for a
//! 49k-token vocabulary, 300 KB for a 150k one. The top-k bounds the file by `k`, not the
//! vocabulary: 524 bytes a position at k = 64 (see [`TOP_K`]).
//!
//! Layout, little-endian:
//! ```text
//! header, 68 bytes:
//!    0  magic        b"EDGTOPK\0"
//!    8  u32 version  1
//!   12  u32 n_vocab  the reference's vocabulary
//!   16  u32 n_ctx    window length (3 ..= 131072)
//!   20  u32 top_k    tokens per position (1 ..= 256, ≤ n_vocab)
//!   24  u32 n_windows
//!   28  u32 0        reserved
//!   32  [u8; 32]     SHA-256 of the tokens fed (n_windows × n_ctx ids as u32 LE, BOS in place)
//!   64  u32          CRC-32 (ISO-HDLC) of bytes 0..64
//! then per window, scored_per_window(n_ctx) records and the CRC-32 of their bytes (u32):
//!   record:  f32 target_lp, f32 lse, f32 rest_lp, [u32; top_k] ids, [f32; top_k] log-probs
//! ```
//! The file is untrusted: every header field is checked against its bound, the file's length
//! against the one the header implies (a truncated or padded file is refused before anything is
//! read), each window's CRC before its records are used, and every id against the vocabulary
//! (so no record can index out of the logits). A file made from another text, window length or
//! tokenizer is refused by the checksum of its tokens.

use super::score::RefPoint;
use super::scored_per_window;
use crc::{CRC_32_ISO_HDLC, Crc};
use std::io::{Read, Write};

/// The top-k saved per position by default. The one-bucket tail makes the KL divergence a lower
/// bound (see [`super::score`]), and on a small model the tail holds real divergence: on
/// SmolLM2-135M over `tests/data/perplexity/text.txt`, against llama-perplexity's full-vocabulary
/// figure (Q8_0 reference), k = 32 gives 72-76 %, 64 gives 79-82 %, 256 gives 89-92 % (Q4_1,
/// Q4_0), each doubling adding a few percent for twice the bytes. 64 is the default: most of
/// the divergence, and still ~190× smaller than llama.cpp's file for that vocabulary.
pub const TOP_K: usize = 64;

pub const MAGIC: [u8; 8] = *b"EDGTOPK\0";
pub const VERSION: u32 = 1;
pub const HEADER_LEN: usize = 68;
/// Bounds of the header's fields.
pub const MAX_VOCAB: u32 = 1 << 24;
pub const MAX_CTX: u32 = 1 << 17;
pub const MAX_TOP_K: u32 = 256;

const CRC: Crc<u32> = Crc::<u32>::new(&CRC_32_ISO_HDLC);

/// Errors of a saved-logits file; each names what is wrong with it.
#[derive(Debug, thiserror::Error)]
pub enum TopKError {
    #[error("not a saved-logits file (bad magic)")]
    Magic,
    #[error("saved-logits format version {0}; this build reads version {VERSION}")]
    Version(u32),
    #[error("corrupt header: {0}")]
    Header(String),
    #[error("truncated: {got} bytes, its header says {want}")]
    Truncated { got: u64, want: u64 },
    #[error("{extra} bytes past the end its header gives")]
    Trailing { extra: u64 },
    #[error("window {0}: checksum mismatch (the file is corrupt)")]
    WindowCrc(usize),
    #[error("window {window}, position {pos}: {what}")]
    Record {
        window: usize,
        pos: usize,
        what: String,
    },
    #[error("{0}")]
    Mismatch(String),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// What a saved-logits file describes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    pub n_vocab: u32,
    pub n_ctx: u32,
    pub top_k: u32,
    pub n_windows: u32,
    /// [`super::tokens_checksum`] of the tokens fed.
    pub tokens_sha256: [u8; 32],
}

impl Header {
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[..8].copy_from_slice(&MAGIC);
        let fields = [
            VERSION,
            self.n_vocab,
            self.n_ctx,
            self.top_k,
            self.n_windows,
            0,
        ];
        for (i, v) in fields.iter().enumerate() {
            b[8 + 4 * i..12 + 4 * i].copy_from_slice(&v.to_le_bytes());
        }
        b[32..64].copy_from_slice(&self.tokens_sha256);
        let crc = CRC.checksum(&b[..64]);
        b[64..].copy_from_slice(&crc.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8; HEADER_LEN]) -> Result<Header, TopKError> {
        if b[..8] != MAGIC {
            return Err(TopKError::Magic);
        }
        let u32_at = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"));
        let version = u32_at(8);
        if version != VERSION {
            return Err(TopKError::Version(version));
        }
        if CRC.checksum(&b[..64]) != u32_at(64) {
            return Err(TopKError::Header("checksum mismatch".into()));
        }
        let h = Header {
            n_vocab: u32_at(12),
            n_ctx: u32_at(16),
            top_k: u32_at(20),
            n_windows: u32_at(24),
            tokens_sha256: b[32..64].try_into().expect("32 bytes"),
        };
        let bad = |what: String| Err(TopKError::Header(what));
        if !(1..=MAX_VOCAB).contains(&h.n_vocab) {
            return bad(format!(
                "vocabulary of {} tokens (1..={MAX_VOCAB})",
                h.n_vocab
            ));
        }
        if !(3..=MAX_CTX).contains(&h.n_ctx) {
            return bad(format!("window of {} tokens (3..={MAX_CTX})", h.n_ctx));
        }
        if !(1..=MAX_TOP_K.min(h.n_vocab)).contains(&h.top_k) {
            return bad(format!("top-k {} (1..={MAX_TOP_K}, ≤ vocabulary)", h.top_k));
        }
        if h.n_windows == 0 {
            return bad("no windows".into());
        }
        Ok(h)
    }

    /// Refuses to compare a model of `n_vocab` tokens, over windows of `n_ctx` whose fed tokens
    /// have the checksum `tokens_sha256`, with this file: the positions would not be the same.
    pub fn check_matches(
        &self,
        n_vocab: usize,
        n_ctx: usize,
        tokens_sha256: &[u8; 32],
    ) -> Result<(), TopKError> {
        let no = |s: String| Err(TopKError::Mismatch(s));
        if self.n_vocab as usize != n_vocab {
            return no(format!(
                "saved from a model with a vocabulary of {} tokens, this one has {n_vocab}: \
                 the two cannot be compared",
                self.n_vocab
            ));
        }
        if self.n_ctx as usize != n_ctx {
            return no(format!(
                "saved with windows of {} tokens, this run uses {n_ctx} (give --ctx {})",
                self.n_ctx, self.n_ctx
            ));
        }
        if &self.tokens_sha256 != tokens_sha256 {
            return no(
                "saved from other tokens: another text, or a tokenizer that splits it \
                 differently (the checksum of the tokens fed differs)"
                    .into(),
            );
        }
        Ok(())
    }

    /// Scored positions per window.
    pub fn per_window(&self) -> usize {
        scored_per_window(self.n_ctx as usize)
    }

    /// Bytes of one record.
    pub fn record_len(&self) -> usize {
        12 + 8 * self.top_k as usize
    }

    /// Bytes of one window's records and CRC.
    pub fn window_len(&self) -> u64 {
        (self.per_window() * self.record_len() + 4) as u64
    }

    /// Bytes of the whole file (the fields' bounds keep this within u64).
    pub fn file_len(&self) -> u64 {
        HEADER_LEN as u64 + u64::from(self.n_windows) * self.window_len()
    }
}

/// Writes a saved-logits file window by window.
pub struct Writer<W: Write> {
    w: W,
    header: Header,
    /// The current window's records.
    buf: Vec<u8>,
    in_window: usize,
    windows: u32,
}

impl<W: Write> Writer<W> {
    /// Writes the header.
    pub fn new(mut w: W, header: Header) -> Result<Writer<W>, TopKError> {
        w.write_all(&header.encode())?;
        let cap = header.per_window() * header.record_len();
        Ok(Writer {
            w,
            header,
            buf: Vec::with_capacity(cap),
            in_window: 0,
            windows: 0,
        })
    }

    pub fn header(&self) -> &Header {
        &self.header
    }

    /// Appends the next scored position; the window is written when its last position is in.
    /// Panics if `r` does not hold exactly `top_k` tokens or the file already holds its windows:
    /// the caller builds the records with the header's `top_k` and counts.
    pub fn push(&mut self, r: &RefPoint) -> Result<(), TopKError> {
        let h = &self.header;
        assert!(r.top.len() == h.top_k as usize && self.windows < h.n_windows);
        for v in [r.target_lp, r.lse, r.rest_lp] {
            self.buf.extend_from_slice(&v.to_le_bytes());
        }
        for &(id, _) in &r.top {
            self.buf.extend_from_slice(&id.to_le_bytes());
        }
        for &(_, lp) in &r.top {
            self.buf.extend_from_slice(&lp.to_le_bytes());
        }
        self.in_window += 1;
        if self.in_window == h.per_window() {
            self.w.write_all(&self.buf)?;
            self.w.write_all(&CRC.checksum(&self.buf).to_le_bytes())?;
            self.buf.clear();
            self.in_window = 0;
            self.windows += 1;
        }
        Ok(())
    }

    /// Checks that every window was written and flushes; returns the writer.
    pub fn finish(mut self) -> Result<W, TopKError> {
        if self.windows != self.header.n_windows || self.in_window != 0 {
            return Err(TopKError::Header(format!(
                "{} of {} windows written",
                self.windows, self.header.n_windows
            )));
        }
        self.w.flush()?;
        Ok(self.w)
    }
}

/// Reads a saved-logits file window by window, checking each before handing out its records.
pub struct Reader<R: Read> {
    r: R,
    header: Header,
    /// The current window's bytes (records and CRC).
    buf: Vec<u8>,
    window: usize,
}

impl<R: Read> Reader<R> {
    /// Reads and checks the header of a file of `len` bytes (its length on disk) and that the
    /// length is the one the header implies.
    pub fn new(mut r: R, len: u64) -> Result<Reader<R>, TopKError> {
        let mut b = [0u8; HEADER_LEN];
        if len < HEADER_LEN as u64 {
            // Too short for a header: a foreign file unless it starts as ours.
            let mut head = vec![0u8; len as usize];
            r.read_exact(&mut head)?;
            if head.len() >= 8 && head[..8] == MAGIC {
                return Err(TopKError::Truncated {
                    got: len,
                    want: HEADER_LEN as u64,
                });
            }
            return Err(TopKError::Magic);
        }
        r.read_exact(&mut b)?;
        let header = Header::decode(&b)?;
        let want = header.file_len();
        if len < want {
            return Err(TopKError::Truncated { got: len, want });
        }
        if len > want {
            return Err(TopKError::Trailing { extra: len - want });
        }
        Ok(Reader {
            r,
            buf: Vec::with_capacity(header.window_len() as usize),
            header,
            window: 0,
        })
    }

    pub fn header(&self) -> &Header {
        &self.header
    }

    /// Reads the next window and checks its CRC and records; then
    /// [`Reader::record`] gives its positions. Errors after the last window.
    pub fn next_window(&mut self) -> Result<(), TopKError> {
        let h = &self.header;
        if self.window >= h.n_windows as usize {
            return Err(TopKError::Header(format!("only {} windows", h.n_windows)));
        }
        self.buf.resize(h.window_len() as usize, 0);
        self.r.read_exact(&mut self.buf)?;
        let (records, crc) = self.buf.split_at(self.buf.len() - 4);
        if CRC.checksum(records) != u32::from_le_bytes(crc.try_into().expect("4 bytes")) {
            return Err(TopKError::WindowCrc(self.window));
        }
        self.window += 1;
        let mut r = RefPoint::default();
        for pos in 0..h.per_window() {
            self.decode(pos, &mut r);
            self.check(pos, &r)?;
        }
        Ok(())
    }

    /// Position `pos` (`0..per_window`) of the window last read into `out`.
    pub fn record(&self, pos: usize, out: &mut RefPoint) {
        self.decode(pos, out);
    }

    fn decode(&self, pos: usize, out: &mut RefPoint) {
        let k = self.header.top_k as usize;
        let rec = &self.buf[pos * self.header.record_len()..][..self.header.record_len()];
        let word = |i: usize| <[u8; 4]>::try_from(&rec[4 * i..4 * i + 4]).expect("4 bytes");
        let f = |i: usize| f32::from_le_bytes(word(i));
        out.target_lp = f(0);
        out.lse = f(1);
        out.rest_lp = f(2);
        out.top.clear();
        out.top
            .extend((0..k).map(|j| (u32::from_le_bytes(word(3 + j)), f(3 + k + j))));
    }

    /// What a record must be for the scores to be computed from it without a panic or a NaN.
    fn check(&self, pos: usize, r: &RefPoint) -> Result<(), TopKError> {
        let bad = |what: String| {
            Err(TopKError::Record {
                window: self.window - 1,
                pos,
                what,
            })
        };
        let n_vocab = self.header.n_vocab;
        if !(r.target_lp.is_finite() && r.lse.is_finite()) {
            return bad("a log-probability is not finite".into());
        }
        if r.rest_lp.is_nan() || r.rest_lp == f32::INFINITY {
            return bad("the rest's log-probability is not a number".into());
        }
        for (j, &(id, lp)) in r.top.iter().enumerate() {
            if id >= n_vocab {
                return bad(format!("token {id} outside the vocabulary of {n_vocab}"));
            }
            if !lp.is_finite() {
                return bad(format!("token {id}: log-probability {lp}"));
            }
            if r.top[..j].iter().any(|t| t.0 == id) {
                return bad(format!("token {id} listed twice"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    fn header(n_windows: u32) -> Header {
        Header {
            n_vocab: 100,
            n_ctx: 8,
            top_k: 4,
            n_windows,
            tokens_sha256: [7; 32],
        }
    }

    fn point(i: usize) -> RefPoint {
        RefPoint {
            target_lp: -(i as f32) / 3.0,
            lse: 12.5 + i as f32,
            rest_lp: if i == 0 { f32::NEG_INFINITY } else { -4.0 },
            top: (0..4)
                .map(|j| ((i * 4 + j) as u32, -0.5 * j as f32))
                .collect(),
        }
    }

    fn file(h: &Header) -> Vec<u8> {
        let mut w = Writer::new(Vec::new(), h.clone()).unwrap();
        for i in 0..h.n_windows as usize * h.per_window() {
            w.push(&point(i)).unwrap();
        }
        w.finish().unwrap()
    }

    fn open(bytes: &[u8]) -> Result<Reader<Cursor<&[u8]>>, TopKError> {
        Reader::new(Cursor::new(bytes), bytes.len() as u64)
    }

    #[test]
    fn a_saved_file_reads_back_record_for_record() {
        let h = header(2);
        let bytes = file(&h);
        assert_eq!(bytes.len() as u64, h.file_len());
        assert_eq!(h.per_window(), 3);
        let mut r = open(&bytes).unwrap();
        assert_eq!(r.header(), &h);
        let mut got = RefPoint::default();
        for w in 0..2 {
            r.next_window().unwrap();
            for pos in 0..3 {
                r.record(pos, &mut got);
                assert_eq!(got, point(w * 3 + pos));
            }
        }
        assert!(r.next_window().is_err(), "past the last window");
    }

    #[test]
    fn a_truncated_file_is_refused_before_any_record_is_read() {
        let bytes = file(&header(2));
        for cut in [0, 5, 8, 40, HEADER_LEN, bytes.len() - 1] {
            let e = open(&bytes[..cut]).err().expect("refused");
            match cut {
                0 | 5 => assert!(matches!(e, TopKError::Magic), "{cut}: {e}"),
                _ => assert!(matches!(e, TopKError::Truncated { .. }), "{cut}: {e}"),
            }
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(matches!(
            open(&longer),
            Err(TopKError::Trailing { extra: 1 })
        ));
    }

    #[test]
    fn a_foreign_or_corrupt_file_is_a_clear_error() {
        let bytes = file(&header(1));
        let mut foreign = bytes.clone();
        foreign[..8].copy_from_slice(b"_logits_");
        assert!(matches!(open(&foreign), Err(TopKError::Magic)));
        let mut version = bytes.clone();
        version[8] = 9;
        assert!(matches!(open(&version), Err(TopKError::Version(9))));
        let mut header_bit = bytes.clone();
        header_bit[33] ^= 1;
        let e = open(&header_bit).err().unwrap();
        assert!(e.to_string().contains("checksum"), "{e}");
        let mut record_bit = bytes.clone();
        record_bit[HEADER_LEN + 20] ^= 1;
        let mut r = open(&record_bit).unwrap();
        assert!(matches!(r.next_window(), Err(TopKError::WindowCrc(0))));
    }

    #[test]
    fn a_file_of_another_vocabulary_context_or_text_is_refused() {
        let h = header(1);
        h.check_matches(100, 8, &[7; 32]).unwrap();
        let e = h.check_matches(101, 8, &[7; 32]).unwrap_err().to_string();
        assert!(
            e.contains("vocabulary of 100 tokens, this one has 101"),
            "{e}"
        );
        let e = h.check_matches(100, 16, &[7; 32]).unwrap_err().to_string();
        assert!(e.contains("--ctx 8"), "{e}");
        let e = h.check_matches(100, 8, &[8; 32]).unwrap_err().to_string();
        assert!(e.contains("another text"), "{e}");
    }

    #[test]
    fn header_fields_past_their_bounds_are_refused() {
        for (field, value) in [
            (12, 0),
            (12, MAX_VOCAB + 1),
            (16, 2),
            (16, MAX_CTX + 1),
            (20, 0),
        ]
        .into_iter()
        .chain([(20, 101), (24, 0)])
        {
            let mut b = header(1).encode();
            b[field..field + 4].copy_from_slice(&value.to_le_bytes());
            let crc = CRC.checksum(&b[..64]);
            b[64..].copy_from_slice(&crc.to_le_bytes());
            let e = Header::decode(&b).expect_err("refused");
            assert!(matches!(e, TopKError::Header(_)), "{field}={value}: {e}");
        }
    }

    #[test]
    fn a_record_with_an_id_outside_the_vocabulary_is_refused_even_with_a_valid_crc() {
        let h = header(1);
        let mut w = Writer::new(Vec::new(), h.clone()).unwrap();
        let mut p = point(1);
        p.top[2].0 = 100;
        w.push(&p).unwrap();
        w.push(&point(2)).unwrap();
        let mut p = point(3);
        p.top[3].0 = p.top[0].0;
        w.push(&p).unwrap();
        let bytes = w.finish().unwrap();
        let e = open(&bytes).unwrap().next_window().err().unwrap();
        assert!(e.to_string().contains("outside the vocabulary"), "{e}");
    }
}
