//! The Modbus register map: a mailbox a PLC writes a prompt into and reads the answer out of.
//!
//! Pure: registers in, registers out, the service's events in; no I/O, no clock (the server
//! calls [`Mailbox::tick`] once a second). The tokio-modbus server in `server.rs` only
//! translates function codes to these calls and exceptions back.
//!
//! # The map
//!
//! One address space, 0-based (a master that counts from 1, like `mbpoll` by default, adds
//! one). FC03 (read holding registers) and FC04 (read input registers) read the same table;
//! FC06, FC16 and FC23 write its writable part. Every register is 16 bits; a 32-bit value is
//! two registers, high word first.
//!
//! | address | name | access | meaning |
//! |---|---|---|---|
//! | 0 | `STATUS` | r | 0 idle, 1 queued, 2 running, 3 done, 4 error |
//! | 1 | `ERROR_CODE` | r | with status 4: 1 bad_request, 2 too_large, 3 context_full, 4 busy, 5 timeout, 6 cancelled, 7 internal; else 0 |
//! | 2 | `RESPONSE_SEQ` | r | the `REQUEST_SEQ` of the request the status is about |
//! | 3 | `HEARTBEAT` | r | +1 every second while the appliance works (wraps) |
//! | 4–5 | `ANSWER_LEN` | r | bytes of answer so far (u32) |
//! | 6 | `PAGE_COUNT` | r | pages of 250 bytes the answer fills |
//! | 7 | `PAGE_SHOWN` | r | the page the window (32–156) shows |
//! | 8 | `FINISH_REASON` | r | with status 3: 1 eog, 2 length, 3 context_full, 4 cancelled, 5 timeout |
//! | 9 | `TOKENS` | r | tokens generated (saturates at 65535) |
//! | 10 | `MAP_VERSION` | r | 2 (1: without 26–28 and the typed block) |
//! | 11 | `PROMPT_CAPACITY` | r | most bytes of prompt |
//! | 12 | `MAX_TOKENS_LIMIT` | r | largest `MAX_TOKENS` accepted |
//! | 13–15 | reserved | r | 0 |
//! | 16 | `REQUEST_SEQ` | rw | written **last**: a value other than the last accepted one submits the request |
//! | 17 | `PROMPT_LEN` | rw | bytes of prompt; 0: up to the first NUL |
//! | 18 | `MAX_TOKENS` | rw | 0: the appliance's limit |
//! | 19 | `TEMPERATURE` | rw | hundredths, 0–200; 0 is greedy |
//! | 20–21 | `SEED` | rw | u32, reset value 0x5EED |
//! | 22 | `SESSION` | rw | 0: none; 1–9999: the named session `modbus-N` (needs a state directory) |
//! | 23 | `MODE` | rw | 0: raw text, continued as is (as `edgellm run`); 1: chat, the user's message in the model's template (with `SESSION`: the next turn of its conversation); 2: reset `SESSION` (no prompt); 3: `SESSION`'s conversation as the answer (no prompt) |
//! | 24 | `PAGE_SELECT` | rw | the answer page the window shows |
//! | 25 | `CANCEL` | w (reads 0) | non-zero: cancel the request in progress |
//! | 26 | `FORMAT` | rw | 0: free text; n: the answer has the shape of the n-th of the configuration's `modbus.formats` (a schema or a choice list) |
//! | 27 | `VALID` | r | with status 3: 0 no format asked, 1 the answer has the format's shape, 2 it does not (cut short) |
//! | 28 | `CHOICE` | r | with a choice format and a valid answer: the option's index (0 the first); else 0xFFFF |
//! | 32–156 | `ANSWER_PAGE` | r | 125 registers: bytes `250·PAGE_SELECT …` of the answer |
//! | 160–255 | `TYPED` | r | a schema format's numbers, booleans and enums, each at its place ([`typed`](super::typed)); 0 where no property is |
//! | 256– | `PROMPT` | rw | `PROMPT_CAPACITY / 2` registers of prompt |
//!
//! Anything else (29–31, 157–159, past the prompt) is unmapped: a read or write touching it is
//! refused with exception 0x02, as is a read spanning two of the blocks (0–28, 32–156,
//! 160–255, the prompt).
//!
//! Text (prompt and answer) is UTF-8, two bytes a register, high byte first, NUL-padded, as
//! SunSpec strings are.
//!
//! # A request
//!
//! 1. Write the prompt into `PROMPT` (FC16, at most 123 registers a write) and its length into
//!    `PROMPT_LEN`; the parameters if they are not the defaults.
//! 2. Write `REQUEST_SEQ` with a new value (last, or as the last register of a write
//!    starting at 17 or lower): the request is submitted, `STATUS` becomes 1 (queued),
//!    `RESPONSE_SEQ` this value, the old answer is cleared.
//! 3. Poll `STATUS` and `RESPONSE_SEQ` (FC03/FC04 at 0): 2 running, then 3 done or 4 error.
//! 4. Read `ANSWER_LEN`, then the pages: write `PAGE_SELECT` and read 32–156, or both in one
//!    FC23 (write 24, read 32). A page may be read while the answer grows.
//!
//! With `FORMAT` set, the answer has that shape or `VALID` says it has not; a choice's index is
//! in `CHOICE`, a schema's typed properties in `TYPED`, both set when the answer is done (and
//! "no value" until then, or when it is not valid). The text pages hold the answer as always.
//!
//! Writing `REQUEST_SEQ` again with the value just accepted does nothing (a master's retry of
//! a write whose reply was lost must not run the prompt twice).
//!
//! # Exceptions
//!
//! | code | when |
//! |---|---|
//! | 0x01 illegal function | coils, discrete inputs, any function code but 3, 4, 6, 16, 23 and 43/14 |
//! | 0x02 illegal data address | a range touching an unmapped address; a write touching a read-only register; FC43/14 individual access to an unknown object |
//! | 0x03 illegal data value | a quantity of 0 or above 125 (read), 123 (FC16), 121 (FC23 write); `PROMPT_LEN` above capacity; `MAX_TOKENS` above the limit; `TEMPERATURE` above 200; `SESSION` above 9999; `MODE` above 3; `FORMAT` above the number of formats; `PAGE_SELECT` past the answer; a request whose prompt is not UTF-8 |
//! | 0x06 server device busy | `REQUEST_SEQ` written while a request is queued or running; the appliance's queue is full |
//!
//! A refused write changes nothing. A request the service refuses for another reason (an
//! empty or blank prompt, a full context, …) is accepted and ends at once in status 4 with its
//! error code.

use super::typed::{TYPED_REGS, Typed};
use crate::service::{ErrorCode, Event, FinishReason, Format, Prompt, Request, ServiceError};
use crate::tokenizer::ChatMessage;
use std::sync::Arc;

/// Registers of the status block (read-only).
pub const STATUS: u16 = 0;
pub const ERROR_CODE: u16 = 1;
pub const RESPONSE_SEQ: u16 = 2;
pub const HEARTBEAT: u16 = 3;
pub const ANSWER_LEN: u16 = 4;
pub const PAGE_COUNT: u16 = 6;
pub const PAGE_SHOWN: u16 = 7;
pub const FINISH_REASON: u16 = 8;
pub const TOKENS: u16 = 9;
pub const MAP_VERSION: u16 = 10;
pub const PROMPT_CAPACITY: u16 = 11;
pub const MAX_TOKENS_LIMIT: u16 = 12;
/// Registers of the control block (read/write).
pub const REQUEST_SEQ: u16 = 16;
pub const PROMPT_LEN: u16 = 17;
pub const MAX_TOKENS: u16 = 18;
pub const TEMPERATURE: u16 = 19;
pub const SEED: u16 = 20;
pub const SESSION: u16 = 22;
pub const MODE: u16 = 23;
pub const PAGE_SELECT: u16 = 24;
pub const CANCEL: u16 = 25;
pub const FORMAT: u16 = 26;
/// Registers of the typed answer (read-only).
pub const VALID: u16 = 27;
pub const CHOICE: u16 = 28;
/// The window on the answer.
pub const ANSWER_PAGE: u16 = 32;
/// Registers in a page: the most one FC03/FC04 may read.
pub const PAGE_REGS: u16 = 125;
pub const PAGE_BYTES: usize = 2 * PAGE_REGS as usize;
/// The typed block: a schema answer's numbers, booleans and enums.
pub const TYPED: u16 = 160;
/// The prompt area.
pub const PROMPT: u16 = 256;

/// Version of this map, in `MAP_VERSION`: a master can check it knows the layout.
pub const VERSION: u16 = 2;
/// Most registers one read (FC03, FC04, FC23's read) may ask for.
pub const MAX_READ: usize = 125;
/// Most registers one FC16 may write.
pub const MAX_WRITE: usize = 123;
/// Most registers FC23 may write.
pub const MAX_RW_WRITE: usize = 121;
/// The seed's reset value (the CLI's default).
pub const DEFAULT_SEED: u32 = 0x5eed;
const MAX_TEMPERATURE: u16 = 200;
const MAX_SESSION: u16 = 9999;
/// `MODE`: 0 raw text, 1 chat, 2 reset the session, 3 the session's history.
const MAX_MODE: u16 = 3;

/// End of the answer window, exclusive.
const PAGE_END: u16 = ANSWER_PAGE + PAGE_REGS;
/// End of the writable control registers, exclusive.
const CONTROL_END: u16 = FORMAT + 1;
/// End of the status and control block, exclusive.
const HEAD_END: u16 = CHOICE + 1;
const TYPED_END: u16 = TYPED + TYPED_REGS as u16;
/// "No value" in `CHOICE`.
const NO_CHOICE: u16 = 0xFFFF;

/// A Modbus exception, as the map decides it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exception {
    IllegalFunction = 0x01,
    IllegalDataAddress = 0x02,
    IllegalDataValue = 0x03,
    ServerDeviceBusy = 0x06,
}

/// `STATUS` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Idle = 0,
    Queued = 1,
    Running = 2,
    Done = 3,
    Error = 4,
}

/// What a write asks of the server beyond the registers.
#[derive(Debug)]
pub enum Written {
    /// Only registers changed.
    Stored,
    /// `REQUEST_SEQ` was written with a new value: submit this request, then report the
    /// outcome with [`Mailbox::refused`] if the service refuses it.
    Submit(Box<Request>),
    /// `REQUEST_SEQ` was written again with the value just accepted: nothing to do.
    Duplicate,
    /// `CANCEL` was written non-zero: cancel the request in progress.
    Cancel,
}

/// How a mailbox is sized and named.
#[derive(Clone, Debug)]
pub struct MailboxConfig {
    /// Most bytes of prompt (held to 65534: `PROMPT_LEN` is one register).
    pub max_prompt_bytes: usize,
    /// Most tokens a request may ask for, and what `MAX_TOKENS` = 0 means.
    pub max_tokens: usize,
    /// Most bytes of answer kept; the answer is cut there (finish reason `length`).
    pub max_answer_bytes: usize,
    /// Request ids are `<id_prefix>-<n>`: make it unique across restarts.
    pub id_prefix: String,
    /// Vendor, product and version for FC43/14.
    pub vendor: String,
    pub product: String,
    pub version: String,
    /// The formats `FORMAT` selects: 1 is the first.
    pub formats: Arc<[Typed]>,
}

/// The writable control registers, copied so a write is checked whole before it is kept.
#[derive(Clone, Copy, Debug)]
struct Control {
    seq: u16,
    prompt_len: u16,
    max_tokens: u16,
    temperature: u16,
    seed: [u16; 2],
    session: u16,
    mode: u16,
    page: u16,
    format: u16,
}

/// One mailbox: the state of one PLC's conversation with the appliance.
#[derive(Clone)]
pub struct Mailbox {
    cfg: MailboxConfig,
    ctl: Control,
    /// Fixed at construction: `prompt_capacity / 2` registers.
    prompt: Vec<u16>,
    status: Status,
    error: u16,
    response_seq: u16,
    /// The `REQUEST_SEQ` last accepted, for telling a retry from a new request.
    accepted: Option<u16>,
    heartbeat: u16,
    /// Fixed capacity `max_answer_bytes`, never grown past it.
    answer: Vec<u8>,
    finish: u16,
    tokens: u16,
    /// The id of the request in progress (queued or running).
    current: Option<String>,
    next_id: u64,
    /// The format of the request the status is about (`FORMAT` may change meanwhile).
    asked: Option<usize>,
    valid: u16,
    choice: u16,
    typed: Box<[u16; TYPED_REGS]>,
}

impl Mailbox {
    pub fn new(cfg: MailboxConfig) -> Mailbox {
        let cap = cfg.max_prompt_bytes.min(65534) & !1;
        let cfg = MailboxConfig {
            max_prompt_bytes: cap,
            max_tokens: cfg.max_tokens.min(u16::MAX as usize),
            ..cfg
        };
        Mailbox {
            prompt: vec![0; cap / 2],
            answer: Vec::with_capacity(cfg.max_answer_bytes),
            cfg,
            ctl: Control {
                seq: 0,
                prompt_len: 0,
                max_tokens: 0,
                temperature: 0,
                seed: [(DEFAULT_SEED >> 16) as u16, DEFAULT_SEED as u16],
                session: 0,
                mode: 0,
                page: 0,
                format: 0,
            },
            status: Status::Idle,
            error: 0,
            response_seq: 0,
            accepted: None,
            heartbeat: 0,
            finish: 0,
            tokens: 0,
            current: None,
            next_id: 0,
            asked: None,
            valid: 0,
            choice: NO_CHOICE,
            typed: Box::new([0; TYPED_REGS]),
        }
    }

    pub fn status(&self) -> Status {
        self.status
    }

    /// The id of the request in progress, if any.
    pub fn current(&self) -> Option<&str> {
        self.current.as_deref()
    }

    fn prompt_end(&self) -> u16 {
        PROMPT + self.prompt.len() as u16
    }

    /// FC03/FC04: `n` registers from `addr`.
    pub fn read(&self, addr: u16, n: u16) -> Result<Vec<u16>, Exception> {
        self.check_read(addr, n)?;
        Ok((addr..addr + n).map(|a| self.register(a)).collect())
    }

    /// Whether `n` registers from `addr` may be read: a quantity of 1 to 125, all in one
    /// block (status and control, the answer window, the typed block, the prompt area).
    fn check_read(&self, addr: u16, n: u16) -> Result<(), Exception> {
        if n == 0 || n as usize > MAX_READ {
            return Err(Exception::IllegalDataValue);
        }
        let (addr, end) = (addr as u32, addr as u32 + n as u32);
        let blocks = [
            (STATUS, HEAD_END),
            (ANSWER_PAGE, PAGE_END),
            (TYPED, TYPED_END),
            (PROMPT, self.prompt_end()),
        ];
        if !blocks
            .iter()
            .any(|&(from, to)| addr >= from as u32 && end <= to as u32)
        {
            return Err(Exception::IllegalDataAddress);
        }
        Ok(())
    }

    /// The value of one mapped register.
    fn register(&self, a: u16) -> u16 {
        let len = self.answer.len() as u32;
        match a {
            STATUS => self.status as u16,
            ERROR_CODE => self.error,
            RESPONSE_SEQ => self.response_seq,
            HEARTBEAT => self.heartbeat,
            ANSWER_LEN => (len >> 16) as u16,
            5 => len as u16,
            PAGE_COUNT => self.page_count(),
            PAGE_SHOWN => self.ctl.page,
            FINISH_REASON => self.finish,
            TOKENS => self.tokens,
            MAP_VERSION => VERSION,
            PROMPT_CAPACITY => self.cfg.max_prompt_bytes as u16,
            MAX_TOKENS_LIMIT => self.cfg.max_tokens as u16,
            REQUEST_SEQ => self.ctl.seq,
            PROMPT_LEN => self.ctl.prompt_len,
            MAX_TOKENS => self.ctl.max_tokens,
            TEMPERATURE => self.ctl.temperature,
            SEED => self.ctl.seed[0],
            21 => self.ctl.seed[1],
            SESSION => self.ctl.session,
            MODE => self.ctl.mode,
            PAGE_SELECT => self.ctl.page,
            FORMAT => self.ctl.format,
            VALID => self.valid,
            CHOICE => self.choice,
            TYPED..TYPED_END => self.typed[(a - TYPED) as usize],
            ANSWER_PAGE..PAGE_END => {
                let at = self.ctl.page as usize * PAGE_BYTES + 2 * (a - ANSWER_PAGE) as usize;
                let byte = |i: usize| *self.answer.get(i).unwrap_or(&0) as u16;
                (byte(at) << 8) | byte(at + 1)
            }
            _ if a >= PROMPT => self.prompt.get((a - PROMPT) as usize).copied().unwrap_or(0),
            // The reserved registers (13–15) and CANCEL read 0; the gaps are refused above.
            _ => 0,
        }
    }

    fn page_count(&self) -> u16 {
        self.answer
            .len()
            .div_ceil(PAGE_BYTES)
            .min(u16::MAX as usize) as u16
    }

    /// FC06 (one value) and FC16: `values` from `addr`. Checked whole: a refused write
    /// changes nothing.
    pub fn write(&mut self, addr: u16, values: &[u16]) -> Result<Written, Exception> {
        if values.is_empty() || values.len() > MAX_WRITE {
            return Err(Exception::IllegalDataValue);
        }
        self.write_unchecked_len(addr, values)
    }

    fn write_unchecked_len(&mut self, addr: u16, values: &[u16]) -> Result<Written, Exception> {
        let end = addr as u32 + values.len() as u32;
        if addr >= PROMPT && end <= self.prompt_end() as u32 {
            let at = (addr - PROMPT) as usize;
            self.prompt[at..at + values.len()].copy_from_slice(values);
            return Ok(Written::Stored);
        }
        if addr < REQUEST_SEQ || end > CONTROL_END as u32 {
            return Err(Exception::IllegalDataAddress);
        }
        let mut ctl = self.ctl;
        let mut seq_written = false;
        let mut cancel = false;
        for (a, &v) in (addr..).zip(values) {
            let ok = match a {
                REQUEST_SEQ => {
                    ctl.seq = v;
                    seq_written = true;
                    true
                }
                PROMPT_LEN => {
                    ctl.prompt_len = v;
                    v as usize <= self.cfg.max_prompt_bytes
                }
                MAX_TOKENS => {
                    ctl.max_tokens = v;
                    v as usize <= self.cfg.max_tokens
                }
                TEMPERATURE => {
                    ctl.temperature = v;
                    v <= MAX_TEMPERATURE
                }
                SEED => {
                    ctl.seed[0] = v;
                    true
                }
                21 => {
                    ctl.seed[1] = v;
                    true
                }
                SESSION => {
                    ctl.session = v;
                    v <= MAX_SESSION
                }
                MODE => {
                    ctl.mode = v;
                    v <= MAX_MODE
                }
                PAGE_SELECT => {
                    ctl.page = v;
                    v == 0 || v < self.page_count()
                }
                FORMAT => {
                    ctl.format = v;
                    v as usize <= self.cfg.formats.len()
                }
                _ => {
                    cancel |= v != 0;
                    true
                }
            };
            if !ok {
                return Err(Exception::IllegalDataValue);
            }
        }
        // The request register is written last in a write that holds it: check the whole
        // request before anything is kept.
        let submit = if seq_written && self.accepted != Some(ctl.seq) {
            if self.current.is_some() {
                return Err(Exception::ServerDeviceBusy);
            }
            Some(self.request(&ctl)?)
        } else {
            None
        };
        self.ctl = ctl;
        if let Some(req) = submit {
            self.accepted = Some(ctl.seq);
            self.response_seq = ctl.seq;
            self.current = Some(req.id.clone());
            self.status = Status::Queued;
            self.error = 0;
            self.finish = 0;
            self.tokens = 0;
            self.answer.clear();
            self.ctl.page = 0;
            self.asked = (ctl.format as usize).checked_sub(1);
            self.valid = 0;
            self.choice = NO_CHOICE;
            self.typed_values(None);
            return Ok(Written::Submit(Box::new(req)));
        }
        Ok(if cancel {
            Written::Cancel
        } else if seq_written {
            Written::Duplicate
        } else {
            Written::Stored
        })
    }

    /// FC23: writes `values` at `write_addr`, then reads `n` from `read_addr`, in one
    /// transaction (select a page and read it). The write is refused whole if the read is.
    pub fn read_write(
        &mut self,
        read_addr: u16,
        n: u16,
        write_addr: u16,
        values: &[u16],
    ) -> Result<(Written, Vec<u16>), Exception> {
        if values.is_empty() || values.len() > MAX_RW_WRITE {
            return Err(Exception::IllegalDataValue);
        }
        // Check the read's range before writing: a refused transaction changes nothing.
        self.check_read(read_addr, n)?;
        let w = self.write_unchecked_len(write_addr, values)?;
        let r = self.read(read_addr, n)?;
        Ok((w, r))
    }

    /// The request the control registers and the prompt area describe.
    fn request(&mut self, ctl: &Control) -> Result<Request, Exception> {
        let bytes: Vec<u8> = self.prompt.iter().flat_map(|r| r.to_be_bytes()).collect();
        let text = match ctl.prompt_len {
            0 => bytes.split(|&b| b == 0).next().unwrap_or(&[]),
            n => &bytes[..n as usize],
        };
        // An empty or blank prompt is the service's to refuse (status 4, `bad_request`), as for
        // every front end.
        let text = std::str::from_utf8(text).map_err(|_| Exception::IllegalDataValue)?;
        let prompt = match ctl.mode {
            1 => Prompt::Chat(vec![ChatMessage::new("user", text)]),
            2 => Prompt::Forget,
            3 => Prompt::History,
            _ => Prompt::Text {
                text: text.to_owned(),
                special: false,
            },
        };
        let session = match ctl.session {
            0 => None,
            n => Some(
                crate::engine::store::SessionId::parse(&format!("modbus-{n}"))
                    .map_err(|_| Exception::IllegalDataValue)?,
            ),
        };
        self.next_id += 1;
        let id = format!("{}-{}", self.cfg.id_prefix, self.next_id);
        let mut req = Request::new(id, String::new(), prompt);
        req.session = session;
        req.max_tokens = match ctl.max_tokens {
            0 => self.cfg.max_tokens,
            n => n as usize,
        };
        req.sampling.temperature = ctl.temperature as f32 / 100.0;
        req.sampling.seed = ((ctl.seed[0] as u64) << 16) | ctl.seed[1] as u64;
        if let Some(t) = (ctl.format as usize)
            .checked_sub(1)
            .and_then(|i| self.cfg.formats.get(i))
        {
            req.format = Some(Format::Named(t.name.clone()));
        }
        Ok(req)
    }

    /// The service refused the request just submitted: it ends in status error. Returns the
    /// exception to answer the write with (`busy` for a full queue: the master retries), or
    /// `None` when the write is acknowledged and the status tells why.
    pub fn refused(&mut self, e: &ServiceError) -> Option<Exception> {
        self.current = None;
        self.status = Status::Error;
        self.error = error_code(e.code);
        if e.code == ErrorCode::Busy {
            // The same sequence value may be written again to retry.
            self.accepted = None;
            return Some(Exception::ServerDeviceBusy);
        }
        None
    }

    /// The worker took request `id`: `STATUS` goes from queued to running.
    pub fn started(&mut self, id: &str) {
        if self.current.as_deref() == Some(id) && self.status == Status::Queued {
            self.status = Status::Running;
        }
    }

    /// An event of request `id`. Returns `false` when nobody waits for it any more (a stale
    /// id, or the answer is cut at `max_answer_bytes`): the worker then stops the answer.
    pub fn on_event(&mut self, id: &str, ev: Event) -> bool {
        if self.current.as_deref() != Some(id) {
            return false;
        }
        match ev {
            Event::Text(chunk) => {
                self.status = Status::Running;
                self.tokens = self.tokens.saturating_add(1);
                if !self.push_answer(&chunk) {
                    self.finish(FinishReason::Length);
                    return false;
                }
            }
            Event::Done(d) => {
                // Done's text is the whole answer: it replaces the streamed one (same bytes).
                self.answer.clear();
                self.push_answer(&d.text);
                self.tokens = d.usage.completion_tokens.min(u16::MAX as usize) as u16;
                self.valid = match d.valid {
                    None => 0,
                    Some(true) => 1,
                    Some(false) => 2,
                };
                if d.valid == Some(true) {
                    if let Some(t) = self.asked.and_then(|i| self.cfg.formats.get(i)) {
                        self.choice = t.choice_index(&d.text);
                    }
                    self.typed_values(d.json.as_ref());
                }
                self.finish(d.finish_reason);
            }
            Event::Error(e) => {
                self.current = None;
                self.status = Status::Error;
                self.error = error_code(e.code);
            }
        }
        true
    }

    fn finish(&mut self, why: FinishReason) {
        self.current = None;
        self.status = Status::Done;
        self.finish = match why {
            FinishReason::Eog => 1,
            FinishReason::Length => 2,
            FinishReason::ContextFull => 3,
            FinishReason::Cancelled => 4,
            FinishReason::Timeout => 5,
        };
    }

    /// The typed block for the asked format's answer (`None`: no value; no format: zeros).
    fn typed_values(&mut self, json: Option<&serde_json::Value>) {
        match self.asked.and_then(|i| self.cfg.formats.get(i)) {
            Some(t) => t.fill(json, &mut self.typed),
            None => self.typed.fill(0),
        }
    }

    /// Appends `s` as far as it fits whole characters; `false` if it did not all fit.
    fn push_answer(&mut self, s: &str) -> bool {
        let room = self.cfg.max_answer_bytes - self.answer.len();
        if s.len() <= room {
            self.answer.extend_from_slice(s.as_bytes());
            return true;
        }
        let mut cut = room;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        self.answer.extend_from_slice(&s.as_bytes()[..cut]);
        false
    }

    /// `secs` seconds passed with the appliance working: `HEARTBEAT` counts up (wrapping).
    pub fn advance(&mut self, secs: u64) {
        self.heartbeat = self.heartbeat.wrapping_add(secs as u16);
    }

    /// FC43/14 (read device identification): `code` 1–3 stream access from `object`, 4 one
    /// object. Objects: 0 vendor, 1 product (the model), 2 version. Returns the objects and
    /// the next object id if more follow (they never do: all three fit one reply).
    pub fn device_id(&self, code: u8, object: u8) -> Result<Vec<(u8, String)>, Exception> {
        let all = [
            (0u8, self.cfg.vendor.clone()),
            (1, self.cfg.product.clone()),
            (2, self.cfg.version.clone()),
        ];
        match code {
            // Stream access: an unknown start object restarts at 0, as the spec says.
            1..=3 => {
                let from = if object <= 2 { object } else { 0 };
                Ok(all.into_iter().filter(|(i, _)| *i >= from).collect())
            }
            4 => all
                .into_iter()
                .find(|(i, _)| *i == object)
                .map(|o| vec![o])
                .ok_or(Exception::IllegalDataAddress),
            _ => Err(Exception::IllegalDataValue),
        }
    }
}

/// The `ERROR_CODE` value of a service error.
pub fn error_code(c: ErrorCode) -> u16 {
    c.number().into()
}

/// Text as registers: two bytes a register, high byte first, the last one NUL-padded.
pub fn text_to_registers(s: &str) -> Vec<u16> {
    s.as_bytes()
        .chunks(2)
        .map(|c| u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]))
        .collect()
}

/// Registers as bytes, high byte first (the reverse of [`text_to_registers`], NULs kept).
pub fn registers_to_bytes(regs: &[u16]) -> Vec<u8> {
    regs.iter().flat_map(|r| r.to_be_bytes()).collect()
}

#[cfg(test)]
#[path = "map_tests.rs"]
mod tests;
