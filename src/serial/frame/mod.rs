//! Frame mode: binary frames for noisy RS-485 links, with acknowledgements, retransmission of
//! unacknowledged answer frames and duplicate requests answered from a cache.
//!
//! [`codec`] is the byte format (start byte, length, sequence number, type, payload,
//! CRC-16/MODBUS) and the resynchronising decoder; [`core`] is [`FrameCore`], the protocol
//! state machine. `docs/serial.md` (“Frame mode”) documents every byte.
//!
//! The link is half duplex and the master (the PLC) leads: it sends a request, then listens.
//! The appliance acknowledges the request, then sends the answer one frame at a time and waits
//! for each frame's acknowledgement before the next (stop and wait): the master only speaks
//! to acknowledge, to cancel or to start, so the two never talk over each other.

pub mod codec;
pub mod core;

pub use self::core::FrameCore;

use std::time::Duration;

/// Frame types. The master's have the high bit clear, the appliance's set.
pub mod kind {
    /// Master: a prompt (payload: flags, max_tokens, [session], [format], UTF-8 text).
    pub const REQUEST: u8 = 0x01;
    /// Master: an answer frame arrived (payload: its index).
    pub const ACK: u8 = 0x02;
    /// Master: cancel the running request.
    pub const CANCEL: u8 = 0x03;
    /// Master: are you there (payload echoed).
    pub const PING: u8 = 0x04;
    /// Master: the appliance's status.
    pub const STATUS: u8 = 0x05;
    /// Master: an answer frame arrived damaged: send it again now (payload: its index).
    pub const NAK: u8 = 0x06;

    /// Appliance: a REQUEST or CANCEL was taken.
    pub const R_ACK: u8 = 0x81;
    /// Appliance: a frame was refused (payload: a reason byte, [`super::nak`]).
    pub const R_NAK: u8 = 0x82;
    /// Appliance: a piece of the answer (payload: index, UTF-8 text).
    pub const DATA: u8 = 0x83;
    /// Appliance: the answer ended (payload: index, finish reason, token counts, validity).
    pub const END: u8 = 0x84;
    /// Appliance: the request failed (payload: index, error code, message).
    pub const ERROR: u8 = 0x85;
    /// Appliance: the answer to PING.
    pub const PONG: u8 = 0x86;
    /// Appliance: the answer to STATUS.
    pub const STATUS_REPLY: u8 = 0x87;

    /// A type the master may send.
    pub fn is_master(k: u8) -> bool {
        (REQUEST..=NAK).contains(&k)
    }
}

/// The reason byte of the appliance's NAK.
pub mod nak {
    /// The CRC did not hold.
    pub const CRC: u8 = 0x01;
    /// The length is over the configured payload bound.
    pub const TOO_LONG: u8 = 0x02;
    /// No such frame type.
    pub const UNKNOWN_TYPE: u8 = 0x03;
    /// The payload does not have the shape its type needs.
    pub const MALFORMED: u8 = 0x04;
}

/// The index an ERROR frame carries when it refuses a request at once (busy, malformed): it
/// is no part of an answer, is never sent again and needs no ACK.
pub const REFUSAL_INDEX: u16 = 0xFFFF;

/// REQUEST flag: the prompt is raw text to continue, not a chat message.
pub const FLAG_RAW: u8 = 0x01;
/// REQUEST flag: a session name (its length in one byte, then the name) comes before the
/// prompt; a chat message is then the next turn of that session's conversation.
pub const FLAG_SESSION: u8 = 0x02;
/// REQUEST flag (with [`FLAG_SESSION`], no prompt): forget the session.
pub const FLAG_RESET: u8 = 0x04;
/// REQUEST flag (with [`FLAG_SESSION`], no prompt): answer the session's conversation.
pub const FLAG_HISTORY: u8 = 0x08;
/// REQUEST flag: the name of one of the configuration's answer formats (its length in one
/// byte, then the name) comes after the session name, or after the header without one; END
/// then says whether the answer has the format's shape.
pub const FLAG_FORMAT: u8 = 0x10;

/// Smallest configurable payload: a STATUS reply's fixed part and an ERROR's header fit.
pub const MIN_PAYLOAD: usize = 64;

/// How a frame port behaves.
#[derive(Clone, Debug, PartialEq)]
pub struct FrameConfig {
    /// Longest payload, either way ([`MIN_PAYLOAD`] to [`codec::MAX_PAYLOAD`]).
    pub max_payload: usize,
    /// An answer frame not acknowledged after this is sent again.
    pub ack_timeout: Duration,
    /// Times an answer frame is sent again before the appliance gives up on the master.
    pub retries: u8,
    /// A frame whose next byte does not come within this is given up (its length was
    /// corrupted, or the master stopped mid-frame) and the bytes after its start are searched
    /// again.
    pub gap: Duration,
    /// Most tokens a REQUEST may ask for (the daemon's `limits.max_tokens`); more is refused
    /// `too_large`.
    pub max_tokens: usize,
    /// Tokens of an answer whose REQUEST asks for 0.
    pub default_tokens: usize,
    /// Per-request deadline.
    pub timeout: Option<Duration>,
}

impl Default for FrameConfig {
    fn default() -> Self {
        FrameConfig {
            max_payload: 256,
            ack_timeout: Duration::from_millis(300),
            retries: 3,
            gap: Duration::from_millis(500),
            max_tokens: 4096,
            default_tokens: 128,
            timeout: None,
        }
    }
}

/// A frame configuration that cannot be served.
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum FrameError {
    #[error("frame payload bound {got} is out of range {MIN_PAYLOAD}..={max}", max = codec::MAX_PAYLOAD)]
    PayloadBound { got: usize },
}

#[cfg(test)]
mod tests;
