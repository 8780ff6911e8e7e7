//! [`FrameCore`]: the frame mode's state machine over [`codec`].
//!
//! Three things are kept, each bounded:
//! - the decoder's receive buffer: one frame at most, whatever arrives;
//! - the answer being computed (`live`) and the last [`CACHE`] finished answers, each with the
//!   request it answers (sequence number and a CRC-32 of the payload), so that a request the
//!   master sends again — its ACK was lost, or the answer's frames — is answered from here and
//!   never handed to the service twice. Their size is the answers' own, bounded by the
//!   requests' `max_tokens`; bytes from the line alone never add to them;
//! - the one answer frame in flight (`tx`), sent again after `ack_timeout` up to `retries`
//!   times, then given up: the answer stays in the cache for the master's retry of the
//!   request.

use super::codec::{self, Decoded, Decoder, FrameBuf};
use super::{
    FLAG_FORMAT, FLAG_HISTORY, FLAG_RAW, FLAG_RESET, FLAG_SESSION, FrameConfig, FrameError,
    MIN_PAYLOAD, REFUSAL_INDEX, kind, nak,
};
use crate::engine::store::SessionId;
use crate::serial::core::{Core, Env};
use crate::serial::stats::Count;
use crate::service::{
    ErrorCode, Event, FinishReason, Format, Prompt, Request, ServiceError, valid_format_name,
};
use crate::tokenizer::ChatMessage;
use crc::{CRC_32_ISO_HDLC, Crc};
use std::time::Instant;

/// Finished answers kept for repeated requests.
pub const CACHE: usize = 4;

const KEY: Crc<u32> = Crc::<u32>::new(&CRC_32_ISO_HDLC);

/// The frame mode of one port.
pub struct FrameCore {
    cfg: FrameConfig,
    dec: Decoder,
    /// When the last byte arrived (the partial-frame gap timer).
    rx_at: Option<Instant>,
    /// Bytes are being dropped: the run is counted once, when it begins.
    in_garbage: bool,
    live: Option<Answer>,
    cache: heapless::Deque<Answer, CACHE>,
    tx: Option<Tx>,
    next_id: u64,
}

/// One request's answer, as far as it has come.
struct Answer {
    id: u64,
    seq: u8,
    /// CRC-32 of the request's payload: the same sequence number with another prompt is a new
    /// request (the master restarted), not a repeat.
    key: u32,
    text: String,
    end: Option<Ending>,
}

enum Ending {
    Done {
        finish: FinishReason,
        prompt_tokens: usize,
        completion_tokens: usize,
        /// Whether the answer has the asked format's shape; `None`: no format was asked.
        valid: Option<bool>,
    },
    Error {
        code: ErrorCode,
        message: String,
    },
}

/// The answer being sent.
struct Tx {
    answer: u64,
    seq: u8,
    /// Bytes of the answer's text already put in frames.
    off: usize,
    /// Index of the next frame.
    index: u16,
    end_sent: bool,
    out: Option<Outstanding>,
}

/// The frame waiting for its ACK.
struct Outstanding {
    index: u16,
    frame: FrameBuf,
    sent_at: Instant,
    tries: u8,
    last: bool,
}

impl FrameCore {
    pub fn new(cfg: FrameConfig) -> Result<FrameCore, FrameError> {
        if !(MIN_PAYLOAD..=codec::MAX_PAYLOAD).contains(&cfg.max_payload) {
            return Err(FrameError::PayloadBound {
                got: cfg.max_payload,
            });
        }
        Ok(FrameCore {
            dec: Decoder::new(cfg.max_payload),
            cfg,
            rx_at: None,
            in_garbage: false,
            live: None,
            cache: heapless::Deque::new(),
            tx: None,
            next_id: 0,
        })
    }

    /// Bytes held by the receive buffer, and its fixed size (tests: garbage never grows it).
    pub fn rx_buffer(&self) -> (usize, usize) {
        (self.dec.buffered(), self.dec.capacity())
    }

    fn on_decoded(&mut self, d: Decoded, env: &mut dyn Env) {
        match d {
            Decoded::Frame { seq, kind, payload } => {
                self.in_garbage = false;
                self.on_frame(seq, kind, &payload, env);
            }
            Decoded::BadCrc { seq, .. } => {
                self.in_garbage = true;
                env.count(Count::Checksum);
                send(env, seq, kind::R_NAK, &[nak::CRC]);
            }
            // A master's type with a length over the bound: most likely a master configured
            // for longer frames, so tell it. Any other type is noise that happens to hold a
            // start byte, and answering noise would jam a half-duplex bus.
            Decoded::TooLong { seq, kind, .. } if kind::is_master(kind) => {
                self.in_garbage = true;
                env.count(Count::BadInput);
                send(env, seq, kind::R_NAK, &[nak::TOO_LONG]);
            }
            Decoded::TooLong { .. } | Decoded::Skipped(_) => {
                if !self.in_garbage {
                    self.in_garbage = true;
                    env.count(Count::BadInput);
                }
            }
        }
    }

    fn on_frame(&mut self, seq: u8, k: u8, payload: &[u8], env: &mut dyn Env) {
        match k {
            kind::REQUEST => self.on_request(seq, payload, env),
            kind::ACK | kind::NAK => {
                let [lo, hi] = payload else {
                    env.count(Count::BadInput);
                    send(env, seq, kind::R_NAK, &[nak::MALFORMED]);
                    return;
                };
                let index = u16::from_le_bytes([*lo, *hi]);
                if k == kind::ACK {
                    self.on_ack(seq, index, env);
                } else {
                    self.resend_now(seq, index, env);
                }
            }
            kind::CANCEL => {
                if self.live.is_some() {
                    env.cancel();
                }
                send(env, seq, kind::R_ACK, &[]);
            }
            kind::PING => send(env, seq, kind::PONG, payload),
            kind::STATUS => {
                let p = self.status_payload(env);
                send(env, seq, kind::STATUS_REPLY, &p);
            }
            _ => {
                env.count(Count::BadInput);
                send(env, seq, kind::R_NAK, &[nak::UNKNOWN_TYPE]);
            }
        }
    }

    fn on_request(&mut self, seq: u8, payload: &[u8], env: &mut dyn Env) {
        let key = KEY.checksum(payload);
        let same = |a: &Answer| a.seq == seq && a.key == key;
        // A repeat: acknowledge again and send the answer again from its first frame,
        // whatever the master already has of it. Never submitted a second time.
        let repeat = match &self.live {
            Some(a) if same(a) => Some(a.id),
            _ => self.cache.iter().find(|a| same(a)).map(|a| a.id),
        };
        if let Some(id) = repeat {
            // An older answer while another request runs: sending it would stop the running
            // answer's frames, so it waits like any other request.
            if self.live.as_ref().is_some_and(|a| a.id != id) {
                return refuse(env, seq, ErrorCode::Busy, "a request is being answered");
            }
            env.count(Count::Duplicate);
            send(env, seq, kind::R_ACK, &[]);
            let running_and_sending = self.live.as_ref().is_some_and(|a| a.id == id)
                && self.tx.as_ref().is_some_and(|t| t.answer == id);
            if !running_and_sending {
                self.start_tx(id, seq);
                self.pump(env);
            }
            return;
        }
        if self.live.is_some() {
            return refuse(env, seq, ErrorCode::Busy, "a request is being answered");
        }
        let req = match parse_request(payload) {
            Ok(Parsed {
                flags,
                max_tokens,
                session,
                format,
                text,
            }) => {
                let prompt = if flags & FLAG_RESET != 0 {
                    Prompt::Forget
                } else if flags & FLAG_HISTORY != 0 {
                    Prompt::History
                } else if flags & FLAG_RAW != 0 {
                    Prompt::Text {
                        text: text.to_owned(),
                        special: false,
                    }
                } else {
                    Prompt::Chat(vec![ChatMessage::new("user", text)])
                };
                let max_tokens = match max_tokens as usize {
                    0 => self.cfg.default_tokens.min(self.cfg.max_tokens).max(1),
                    n if n > self.cfg.max_tokens => {
                        env.count(Count::BadInput);
                        let why = format!("max_tokens is at most {}", self.cfg.max_tokens);
                        return refused(env, seq, ErrorCode::TooLarge, &why, session);
                    }
                    n => n,
                };
                let session = match session.map(SessionId::parse).transpose() {
                    Ok(s) => s,
                    Err(_) => {
                        env.count(Count::BadInput);
                        let why = "the session name is not a valid name";
                        return refused(env, seq, ErrorCode::BadRequest, why, session);
                    }
                };
                let mut req = Request::new(env.new_id(), env.source(), prompt);
                req.session = session;
                // A name the configuration lacks is the service's to refuse, with the names
                // it has.
                req.format = format.map(|f| Format::Named(f.to_owned()));
                req.max_tokens = max_tokens;
                req.deadline = self.cfg.timeout.map(|t| env.now() + t);
                req
            }
            Err(why) => {
                env.count(Count::BadInput);
                return refused(env, seq, ErrorCode::BadRequest, why, None);
            }
        };
        if let Err(e) = env.submit(req) {
            return refuse(env, seq, e.code, &e.message);
        }
        env.count(Count::Requests);
        send(env, seq, kind::R_ACK, &[]);
        self.next_id += 1;
        self.live = Some(Answer {
            id: self.next_id,
            seq,
            key,
            text: String::new(),
            end: None,
        });
        self.start_tx(self.next_id, seq);
    }

    /// Starts sending an answer from its first frame; an answer still being sent is dropped
    /// (the master has moved on to another request).
    fn start_tx(&mut self, answer: u64, seq: u8) {
        self.tx = Some(Tx {
            answer,
            seq,
            off: 0,
            index: 0,
            end_sent: false,
            out: None,
        });
    }

    fn on_ack(&mut self, seq: u8, index: u16, env: &mut dyn Env) {
        let Some(tx) = &mut self.tx else { return };
        // A late ACK of a frame already acknowledged, or of another answer: nothing to do.
        let Some(out) = &tx.out else { return };
        if tx.seq != seq || out.index != index {
            return;
        }
        if out.last {
            self.tx = None;
        } else {
            tx.out = None;
            self.pump(env);
        }
    }

    fn resend_now(&mut self, seq: u8, index: u16, env: &mut dyn Env) {
        let Some(tx) = &self.tx else { return };
        if tx.seq != seq || tx.out.as_ref().is_none_or(|o| o.index != index) {
            return;
        }
        self.retransmit(env);
    }

    /// Sends the in-flight frame again, or gives up on it after `retries`.
    fn retransmit(&mut self, env: &mut dyn Env) {
        let Some(tx) = &mut self.tx else { return };
        let Some(out) = &mut tx.out else { return };
        if out.tries >= self.cfg.retries {
            tracing::warn!(
                seq = tx.seq,
                index = out.index,
                tries = out.tries,
                "frame: no ACK from the master, giving up on the answer (kept for a repeat of the request)"
            );
            self.tx = None;
            return;
        }
        out.tries += 1;
        out.sent_at = env.now();
        env.count(Count::Retransmit);
        env.write(&out.frame);
    }

    /// Sends the answer's next frame when none is waiting for its ACK and there is something
    /// to send.
    fn pump(&mut self, env: &mut dyn Env) {
        let Some(tx) = &mut self.tx else { return };
        if tx.out.is_some() {
            return;
        }
        let answer = match &self.live {
            Some(a) if a.id == tx.answer => Some(a),
            _ => self.cache.iter().find(|a| a.id == tx.answer),
        };
        let Some(answer) = answer else {
            self.tx = None;
            return;
        };
        let mut p = heapless::Vec::<u8, { codec::MAX_PAYLOAD }>::new();
        let _ = p.extend_from_slice(&tx.index.to_le_bytes());
        let (k, last) = if tx.off < answer.text.len() {
            let room = self.cfg.max_payload - 2;
            let end = floor_char_boundary(&answer.text, tx.off + room);
            let _ = p.extend_from_slice(&answer.text.as_bytes()[tx.off..end]);
            tx.off = end;
            (kind::DATA, false)
        } else if let (false, Some(end)) = (tx.end_sent, &answer.end) {
            tx.end_sent = true;
            match end {
                Ending::Done {
                    finish,
                    prompt_tokens,
                    completion_tokens,
                    valid,
                } => {
                    let _ = p.push(finish_byte(*finish));
                    let _ = p.extend_from_slice(&clamp32(*prompt_tokens).to_le_bytes());
                    let _ = p.extend_from_slice(&clamp32(*completion_tokens).to_le_bytes());
                    // Last, so that a master reading only the fields before it still works.
                    let _ = p.push(validity_byte(*valid));
                    (kind::END, true)
                }
                Ending::Error { code, message } => {
                    let _ = p.push(code_byte(*code));
                    let room = self.cfg.max_payload - p.len();
                    let m = &message[..floor_char_boundary(message, room)];
                    let _ = p.extend_from_slice(m.as_bytes());
                    (kind::ERROR, true)
                }
            }
        } else {
            return;
        };
        let frame = codec::encode(tx.seq, k, &p);
        env.write(&frame);
        tx.out = Some(Outstanding {
            index: tx.index,
            frame,
            sent_at: env.now(),
            tries: 0,
            last,
        });
        tx.index = tx.index.wrapping_add(1);
    }

    fn status_payload(&self, env: &dyn Env) -> heapless::Vec<u8, { codec::MAX_PAYLOAD }> {
        let s = env.status();
        let mut p = heapless::Vec::new();
        let state = match s.state {
            "online" => 0,
            "busy" => 1,
            _ => 2,
        };
        let _ = p.push(state);
        let _ = p.push(s.running as u8);
        let _ = p.extend_from_slice(&(s.queue.min(u16::MAX as usize) as u16).to_le_bytes());
        for (_, n) in s.counters() {
            let _ = p.extend_from_slice(&(n.min(u32::MAX as u64) as u32).to_le_bytes());
        }
        let room = self.cfg.max_payload - p.len();
        let _ = p.extend_from_slice(&s.model.as_bytes()[..floor_char_boundary(&s.model, room)]);
        p
    }
}

impl Core for FrameCore {
    fn on_bytes(&mut self, bytes: &[u8], env: &mut dyn Env) {
        if !bytes.is_empty() {
            self.rx_at = Some(env.now());
        }
        let mut rest = bytes;
        loop {
            let n = self.dec.feed(rest);
            rest = &rest[n..];
            while let Some(d) = self.dec.pop() {
                self.on_decoded(d, env);
            }
            // `next` returned None: the buffer holds less than a frame, so the next feed
            // takes at least one byte.
            if rest.is_empty() {
                break;
            }
        }
    }

    fn on_event(&mut self, ev: Event, env: &mut dyn Env) {
        let Some(live) = &mut self.live else { return };
        let end = match ev {
            Event::Text(c) => {
                live.text.push_str(&c);
                None
            }
            Event::Done(d) => Some(Ending::Done {
                finish: d.finish_reason,
                prompt_tokens: d.usage.prompt_tokens,
                completion_tokens: d.usage.completion_tokens,
                valid: d.valid,
            }),
            Event::Error(e) => Some(Ending::Error {
                code: e.code,
                message: e.message,
            }),
        };
        if let Some(end) = end {
            live.end = Some(end);
            if let Some(done) = self.live.take() {
                if self.cache.is_full() {
                    self.cache.pop_front();
                }
                // Room was made just above.
                let _ = self.cache.push_back(done);
            }
        }
        self.pump(env);
    }

    fn deadline(&self) -> Option<Instant> {
        let rx = match (self.dec.buffered(), self.rx_at) {
            (n, Some(at)) if n > 0 => Some(at + self.cfg.gap),
            _ => None,
        };
        let tx = self
            .tx
            .as_ref()
            .and_then(|t| t.out.as_ref())
            .map(|o| o.sent_at + self.cfg.ack_timeout);
        match (rx, tx) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn on_tick(&mut self, env: &mut dyn Env) {
        let now = env.now();
        if let Some(at) = self.rx_at
            && self.dec.buffered() > 0
            && now >= at + self.cfg.gap
        {
            // The frame at the front will not be completed: search what follows its start.
            if !self.in_garbage {
                self.in_garbage = true;
                env.count(Count::BadInput);
            }
            while self.dec.buffered() > 0 {
                self.dec.abandon();
                while let Some(d) = self.dec.pop() {
                    self.on_decoded(d, env);
                }
            }
        }
        let due = self
            .tx
            .as_ref()
            .and_then(|t| t.out.as_ref())
            .is_some_and(|o| now >= o.sent_at + self.cfg.ack_timeout);
        if due {
            self.retransmit(env);
        }
    }

    fn on_open(&mut self, _env: &mut dyn Env) {
        self.dec.clear();
        self.rx_at = None;
    }
}

fn send(env: &mut dyn Env, seq: u8, k: u8, payload: &[u8]) {
    env.write(&codec::encode(seq, k, payload));
}

/// Refuses a REQUEST frame the master sent whole (its CRC good): answered as [`refuse`], and
/// told to the audit trail with the session it named.
fn refused(env: &mut dyn Env, seq: u8, code: ErrorCode, message: &str, session: Option<&str>) {
    env.refused_here(ServiceError::new(code, message), session);
    refuse(env, seq, code, message);
}

/// An ERROR frame refusing a request at once: not part of any answer, not kept.
fn refuse(env: &mut dyn Env, seq: u8, code: ErrorCode, message: &str) {
    let mut p = heapless::Vec::<u8, MIN_PAYLOAD>::new();
    let _ = p.extend_from_slice(&REFUSAL_INDEX.to_le_bytes());
    let _ = p.push(code_byte(code));
    let room = MIN_PAYLOAD - p.len();
    let _ = p.extend_from_slice(&message.as_bytes()[..floor_char_boundary(message, room)]);
    send(env, seq, kind::ERROR, &p);
}

/// A REQUEST's fields.
struct Parsed<'a> {
    flags: u8,
    max_tokens: u16,
    /// As sent: the caller checks it, so that a refusal can name it.
    session: Option<&'a str>,
    format: Option<&'a str>,
    text: &'a str,
}

/// flags, max_tokens (u16 LE, 0: the default), [session name], [format name], UTF-8 prompt;
/// each name is its length in one byte, then its bytes.
fn parse_request(p: &[u8]) -> Result<Parsed<'_>, &'static str> {
    let [flags, lo, hi, rest @ ..] = p else {
        return Err("request payload shorter than its 3-byte header");
    };
    let flags = *flags;
    if flags & !(FLAG_RAW | FLAG_SESSION | FLAG_RESET | FLAG_HISTORY | FLAG_FORMAT) != 0 {
        return Err("unknown request flags");
    }
    let (session, rest) = if flags & FLAG_SESSION != 0 {
        let (name, rest) =
            counted(rest).ok_or("the session name is missing or past the payload")?;
        let name = std::str::from_utf8(name).map_err(|_| "the session name is not valid UTF-8")?;
        (Some(name), rest)
    } else {
        (None, rest)
    };
    let (format, text) = if flags & FLAG_FORMAT != 0 {
        let (name, rest) = counted(rest).ok_or("the format name is missing or past the payload")?;
        let name = std::str::from_utf8(name)
            .ok()
            .filter(|n| valid_format_name(n))
            .ok_or("a format name has 1 to 64 of A-Z a-z 0-9 _ -")?;
        (Some(name), rest)
    } else {
        (None, rest)
    };
    let acts = flags & (FLAG_RESET | FLAG_HISTORY);
    if acts != 0 && format.is_some() {
        return Err("reset and history take no format");
    }
    if acts != 0 && (session.is_none() || acts == FLAG_RESET | FLAG_HISTORY || !text.is_empty()) {
        return Err("reset and history need a session, no prompt, not both");
    }
    // A blank prompt is the service's to refuse, as for every front end.
    let text = std::str::from_utf8(text).map_err(|_| "prompt is not valid UTF-8")?;
    Ok(Parsed {
        flags,
        max_tokens: u16::from_le_bytes([*lo, *hi]),
        session,
        format,
        text,
    })
}

/// A length byte and that many bytes, then the rest; `None` when the payload ends first.
fn counted(b: &[u8]) -> Option<(&[u8], &[u8])> {
    let (len, rest) = b.split_first()?;
    rest.split_at_checked(*len as usize)
}

/// The largest char boundary of `s` at or below `i`.
fn floor_char_boundary(s: &str, i: usize) -> usize {
    let mut i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

fn clamp32(n: usize) -> u32 {
    n.min(u32::MAX as usize) as u32
}

pub fn finish_byte(f: FinishReason) -> u8 {
    match f {
        FinishReason::Eog => 0,
        FinishReason::Length => 1,
        FinishReason::ContextFull => 2,
        FinishReason::Cancelled => 3,
        FinishReason::Timeout => 4,
    }
}

/// END's last byte: 0 no format was asked, 1 the answer has its shape, 2 it has not.
pub fn validity_byte(valid: Option<bool>) -> u8 {
    match valid {
        None => 0,
        Some(true) => 1,
        Some(false) => 2,
    }
}

pub fn code_byte(c: ErrorCode) -> u8 {
    c.number()
}
