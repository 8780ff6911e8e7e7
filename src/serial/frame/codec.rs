//! The frame format over bytes, with no state but the receive buffer: encode one frame, and a
//! [`Decoder`] that finds frames in a byte stream of any split and resynchronises on garbage.
//!
//! ```text
//! 0xA5 | len lo | len hi | seq | type | payload (len bytes) | crc lo | crc hi
//! ```
//!
//! The CRC is CRC-16/MODBUS over every byte before it, start byte included, sent low byte
//! first as Modbus RTU sends its own. `docs/serial.md` has the tables.
//!
//! Resynchronisation: a frame is only taken when its CRC holds. A candidate that fails (bad
//! CRC, a length over the bound) costs its start byte alone, and the hunt for the next start
//! byte begins again at the byte after it — not after the length it claims, which may be the
//! corrupted byte. So a noise burst in front of a good frame, or a frame cut short by a
//! corrupted length, never hides the frames behind it that are already buffered.

use crc::{CRC_16_MODBUS, Crc};

/// The first byte of every frame.
pub const START: u8 = 0xA5;
/// Start byte, length (2), sequence number, type.
pub const HEADER: usize = 5;
pub const CRC_LEN: usize = 2;
/// The largest payload any configuration may allow; the receive buffer is sized for it.
pub const MAX_PAYLOAD: usize = 1024;
/// The largest frame on the wire.
pub const MAX_FRAME: usize = HEADER + MAX_PAYLOAD + CRC_LEN;

/// One encoded frame, inline.
pub type FrameBuf = heapless::Vec<u8, MAX_FRAME>;
/// One received payload, inline.
pub type Payload = heapless::Vec<u8, MAX_PAYLOAD>;

const MODBUS: Crc<u16> = Crc::<u16>::new(&CRC_16_MODBUS);

pub fn crc16(bytes: &[u8]) -> u16 {
    MODBUS.checksum(bytes)
}

/// Encodes one frame. A payload over [`MAX_PAYLOAD`] is cut there: callers size their
/// payloads (the core never builds a longer one; this keeps a bug from becoming a panic).
pub fn encode(seq: u8, kind: u8, payload: &[u8]) -> FrameBuf {
    let payload = &payload[..payload.len().min(MAX_PAYLOAD)];
    let mut f = FrameBuf::new();
    let len = payload.len() as u16;
    // Capacity is HEADER + MAX_PAYLOAD + CRC_LEN, exactly what is pushed: cannot fail.
    let _ = f.extend_from_slice(&[START, len as u8, (len >> 8) as u8, seq, kind]);
    let _ = f.extend_from_slice(payload);
    let crc = crc16(&f);
    let _ = f.extend_from_slice(&crc.to_le_bytes());
    f
}

/// What the decoder found. Inline on purpose, like [`crate::service::Chunk`]: decoding a frame
/// allocates nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, PartialEq)]
pub enum Decoded {
    /// A frame whose CRC holds.
    Frame { seq: u8, kind: u8, payload: Payload },
    /// A whole candidate frame whose CRC does not hold (`seq` and `kind` as read: they may be
    /// the corrupted bytes).
    BadCrc { seq: u8, kind: u8 },
    /// A header whose length is over the bound.
    TooLong { seq: u8, kind: u8, len: usize },
    /// Bytes dropped while hunting for a start byte.
    Skipped(usize),
}

/// Finds frames in a byte stream. Holds at most one frame's bytes ([`MAX_FRAME`]), whatever
/// it is fed.
pub struct Decoder {
    buf: heapless::Vec<u8, MAX_FRAME>,
    max_payload: usize,
}

impl Decoder {
    /// `max_payload` is at most [`MAX_PAYLOAD`] (larger is taken as that).
    pub fn new(max_payload: usize) -> Decoder {
        Decoder {
            buf: heapless::Vec::new(),
            max_payload: max_payload.min(MAX_PAYLOAD),
        }
    }

    /// Takes as many of `bytes` as fit and returns how many. Call [`Decoder::pop`] until it
    /// returns `None` before feeding the rest: that always makes room.
    pub fn feed(&mut self, bytes: &[u8]) -> usize {
        let n = bytes.len().min(MAX_FRAME - self.buf.len());
        // n fits by construction.
        let _ = self.buf.extend_from_slice(&bytes[..n]);
        n
    }

    /// Bytes held (a partial frame, or garbage not yet looked at).
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// The buffer's fixed size.
    pub fn capacity(&self) -> usize {
        self.buf.capacity()
    }

    /// Forgets everything held (the port was reopened).
    pub fn clear(&mut self) {
        self.buf.clear();
    }

    /// Gives up the partial frame at the front (its remaining bytes never came): drops its
    /// start byte so that the bytes after it are searched again.
    pub fn abandon(&mut self) {
        if !self.buf.is_empty() {
            self.drop_front(1);
        }
    }

    /// The next thing found in the buffered bytes, or `None` when they hold no complete
    /// candidate yet.
    pub fn pop(&mut self) -> Option<Decoded> {
        if self.buf.is_empty() {
            return None;
        }
        let skip = self
            .buf
            .iter()
            .position(|&b| b == START)
            .unwrap_or(self.buf.len());
        if skip > 0 {
            self.drop_front(skip);
            return Some(Decoded::Skipped(skip));
        }
        if self.buf.len() < HEADER {
            return None;
        }
        let len = u16::from_le_bytes([self.buf[1], self.buf[2]]) as usize;
        let (seq, kind) = (self.buf[3], self.buf[4]);
        if len > self.max_payload {
            self.drop_front(1);
            return Some(Decoded::TooLong { seq, kind, len });
        }
        let end = HEADER + len;
        if self.buf.len() < end + CRC_LEN {
            return None;
        }
        let want = u16::from_le_bytes([self.buf[end], self.buf[end + 1]]);
        if crc16(&self.buf[..end]) != want {
            self.drop_front(1);
            return Some(Decoded::BadCrc { seq, kind });
        }
        let mut payload = Payload::new();
        // len <= max_payload <= MAX_PAYLOAD.
        let _ = payload.extend_from_slice(&self.buf[HEADER..end]);
        self.drop_front(end + CRC_LEN);
        Some(Decoded::Frame { seq, kind, payload })
    }

    fn drop_front(&mut self, n: usize) {
        let len = self.buf.len();
        let n = n.min(len);
        self.buf.copy_within(n..len, 0);
        self.buf.truncate(len - n);
    }
}
