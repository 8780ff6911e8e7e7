//! A named session's conversation on flash: the format, pure (bytes in, bytes out, no I/O),
//! in the manner of the KV snapshot (`kv::snapshot`). The session store will keep one such
//! log beside each session's KV snapshot, the KV cache being a cache of it.
//!
//! ```text
//! file    = MAGIC ("EDGLCNV1") record*
//! record  = len:u32le crc32c:u32le body[len]          crc32c of body
//! body    = kind:u8 ...
//!   1 turn     user_len:u32le user answer             one finished turn: appended when the
//!                                                     answer is given, never before
//!   2 replace  turns:u64le system_len:u32le system (0xFFFFFFFF: none) count:u32le
//!              count × (role_len:u16le role content_len:u32le content)
//!                                                     the whole conversation (a client that
//!                                                     sends `messages`, or a compaction), and
//!                                                     the turn count it goes on from
//!   3 drop     n:u32le                                the oldest n messages left the context
//! ```
//!
//! Append-only, one record per change, each checksummed: a power cut while a record is
//! written costs that record only, so the last complete turn survives, and a turn whose
//! record is whole was acknowledged after it was synced. Reading stops at the first record
//! that is not whole: [`Tail::Torn`] when the file ends inside it (the write that was cut),
//! [`Tail::Corrupt`] when a whole record fails its checksum or does not parse (the bytes
//! changed after they were written). Either way what precedes it is the conversation. Every
//! length is checked against the bytes left and a cap before it is used: no input panics or
//! allocates more than its own size.

use crate::kv::snapshot::crc32c;
use crate::tokenizer::ChatMessage;

pub mod file;

pub use file::{ConversationFile, Opened, read};

/// The file's first bytes (format version 1).
pub const MAGIC: [u8; 8] = *b"EDGLCNV1";
/// Bytes of a record's header (its length and checksum).
pub const RECORD_HEADER_LEN: usize = 8;
/// The longest record read: a longer one is corrupt (no conversation needs it).
pub const MAX_RECORD: usize = 16 << 20;

const KIND_TURN: u8 = 1;
const KIND_REPLACE: u8 = 2;
const KIND_DROP: u8 = 3;
const NO_SYSTEM: u32 = u32::MAX;

/// A conversation: its system prompt and its messages, oldest first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Conversation {
    pub system: Option<String>,
    pub messages: Vec<ChatMessage>,
    /// Turns appended since the log began (the audit trail's turn number).
    pub turns: u64,
}

/// One change to a conversation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    /// A finished turn: the user's message and the answer.
    Turn { user: String, answer: String },
    /// The whole conversation, replacing what was there; the turn count goes on from `turns`
    /// (a turn number is never reused, whatever replaced the messages).
    Replace {
        system: Option<String>,
        messages: Vec<ChatMessage>,
        turns: u64,
    },
    /// The oldest `n` messages left (the context was full; the system prompt stays).
    Drop(u32),
}

impl Conversation {
    /// As text, one message a paragraph: `system: …`, then `user: …` and `assistant: …`.
    pub fn transcript(&self) -> String {
        let system = self.system.iter().map(|s| ("system", s.as_str()));
        let messages = self
            .messages
            .iter()
            .map(|m| (m.role.as_str(), m.content.as_str()));
        let paragraphs: Vec<String> = system
            .chain(messages)
            .map(|(role, content)| format!("{role}: {content}"))
            .collect();
        paragraphs.join("\n\n")
    }

    pub fn apply(&mut self, r: Record) {
        match r {
            Record::Turn { user, answer } => {
                self.messages.push(ChatMessage::new("user", user));
                self.messages.push(ChatMessage::new("assistant", answer));
                self.turns += 1;
            }
            Record::Replace {
                system,
                messages,
                turns,
            } => {
                self.system = system;
                self.messages = messages;
                self.turns = turns;
            }
            Record::Drop(n) => {
                let n = (n as usize).min(self.messages.len());
                self.messages.drain(..n);
            }
        }
    }
}

/// How a log ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tail {
    /// At a record's end.
    Clean,
    /// Inside a record (a write that was cut): `bytes` after the last whole record.
    Torn { bytes: usize },
    /// A whole record at offset `at` fails its checksum or does not parse; `bytes` from there
    /// to the end are not read.
    Corrupt { at: usize, bytes: usize },
}

/// What a log holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decoded {
    pub conversation: Conversation,
    pub records: usize,
    /// Bytes up to the end of the last whole record: where the next record is appended once
    /// the rest is cut.
    pub good_len: usize,
    pub tail: Tail,
}

/// A file that is not a conversation log at all.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("not an edgellm conversation log: {0}")]
pub struct NotALog(&'static str);

/// The bytes a new log starts with.
pub fn header() -> [u8; 8] {
    MAGIC
}

/// One record, with its header, ready to append.
pub fn encode(r: &Record) -> Vec<u8> {
    let mut body = Vec::new();
    match r {
        Record::Turn { user, answer } => {
            body.push(KIND_TURN);
            put_u32(&mut body, user.len());
            body.extend_from_slice(user.as_bytes());
            body.extend_from_slice(answer.as_bytes());
        }
        Record::Replace {
            system,
            messages,
            turns,
        } => {
            body.push(KIND_REPLACE);
            body.extend_from_slice(&turns.to_le_bytes());
            match system {
                Some(s) => {
                    put_u32(&mut body, s.len());
                    body.extend_from_slice(s.as_bytes());
                }
                None => body.extend_from_slice(&NO_SYSTEM.to_le_bytes()),
            }
            put_u32(&mut body, messages.len());
            for m in messages {
                // A role is a word (`user`, `assistant`, `tool`): cut to what a u16 counts.
                let role = &m.role.as_bytes()[..m.role.len().min(u16::MAX as usize)];
                body.extend_from_slice(&(role.len() as u16).to_le_bytes());
                body.extend_from_slice(role);
                put_u32(&mut body, m.content.len());
                body.extend_from_slice(m.content.as_bytes());
            }
        }
        Record::Drop(n) => {
            body.push(KIND_DROP);
            body.extend_from_slice(&n.to_le_bytes());
        }
    }
    let mut out = Vec::with_capacity(RECORD_HEADER_LEN + body.len());
    put_u32(&mut out, body.len());
    out.extend_from_slice(&crc32c(&body).to_le_bytes());
    out.extend_from_slice(&body);
    out
}

fn put_u32(out: &mut Vec<u8>, n: usize) {
    // Lengths past u32 are refused by the store's bounds long before (MAX_RECORD).
    out.extend_from_slice(&(n.min(u32::MAX as usize - 1) as u32).to_le_bytes());
}

/// Reads a whole log: the conversation up to the first record that is not whole.
pub fn decode(bytes: &[u8]) -> Result<Decoded, NotALog> {
    if bytes.len() < MAGIC.len() {
        return Err(NotALog("shorter than its magic"));
    }
    if bytes[..MAGIC.len()] != MAGIC {
        return Err(NotALog("bad magic"));
    }
    let mut at = MAGIC.len();
    let mut conversation = Conversation::default();
    let mut records = 0;
    let tail = loop {
        let rest = &bytes[at..];
        if rest.is_empty() {
            break Tail::Clean;
        }
        if rest.len() < RECORD_HEADER_LEN {
            break Tail::Torn { bytes: rest.len() };
        }
        let len = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        let crc = u32::from_le_bytes([rest[4], rest[5], rest[6], rest[7]]);
        if len > MAX_RECORD {
            break Tail::Corrupt {
                at,
                bytes: rest.len(),
            };
        }
        let Some(body) = rest.get(RECORD_HEADER_LEN..RECORD_HEADER_LEN + len) else {
            break Tail::Torn { bytes: rest.len() };
        };
        let parsed = (crc32c(body) == crc).then(|| parse(body)).flatten();
        let Some(r) = parsed else {
            break Tail::Corrupt {
                at,
                bytes: rest.len(),
            };
        };
        conversation.apply(r);
        records += 1;
        at += RECORD_HEADER_LEN + len;
    };
    Ok(Decoded {
        conversation,
        records,
        good_len: at,
        tail,
    })
}

/// A record's body; `None` when it does not parse.
fn parse(body: &[u8]) -> Option<Record> {
    let mut r = Reader(body.get(1..)?);
    let rec = match *body.first()? {
        KIND_TURN => {
            let n = r.u32()? as usize;
            let user = r.text(n)?;
            let answer = r.text(r.0.len())?;
            Record::Turn { user, answer }
        }
        KIND_REPLACE => {
            let turns = r.u64()?;
            let system = match r.u32()? {
                NO_SYSTEM => None,
                n => Some(r.text(n as usize)?),
            };
            let count = r.u32()? as usize;
            // Each message takes at least 6 bytes: a count past that is a lie.
            if count > r.0.len() / 6 {
                return None;
            }
            let mut messages = Vec::with_capacity(count);
            for _ in 0..count {
                let n = r.u16()? as usize;
                let role = r.text(n)?;
                let n = r.u32()? as usize;
                messages.push(ChatMessage::new(role, r.text(n)?));
            }
            Record::Replace {
                system,
                messages,
                turns,
            }
        }
        KIND_DROP => Record::Drop(r.u32()?),
        _ => return None,
    };
    // Every byte of a body is accounted for.
    r.0.is_empty().then_some(rec)
}

/// Takes from the front of a body, checking each length against what is left.
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        if n > self.0.len() {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }
    fn u16(&mut self) -> Option<u16> {
        let b = self.take(2)?;
        Some(u16::from_le_bytes([b[0], b[1]]))
    }
    fn u32(&mut self) -> Option<u32> {
        let b = self.take(4)?;
        Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self) -> Option<u64> {
        let b: [u8; 8] = self.take(8)?.try_into().ok()?;
        Some(u64::from_le_bytes(b))
    }
    fn text(&mut self, n: usize) -> Option<String> {
        String::from_utf8(self.take(n)?.to_vec()).ok()
    }
}

#[cfg(test)]
#[path = "conversation_tests.rs"]
mod tests;
