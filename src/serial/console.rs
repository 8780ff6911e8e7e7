//! Console mode: a technician's terminal (picocom, minicom, screen) on the port.
//!
//! A line editor with echo — Backspace (0x08 or 0x7F) erases a character with `\b \b`,
//! Ctrl-U the whole line, Ctrl-C clears it; Enter (CR, LF or CR LF, counted once) submits —
//! under an `edgellm> ` prompt. A line that is exactly `help`, `status`, `sessions`,
//! `log [N]`, `/session [NAME]`, `/reset` or `/history` is a command; any other line is a chat
//! message to the model (the next turn of the chosen session's conversation, if any), whose
//! answer streams as it is generated, then a line with its finish reason, token counts and
//! speed.
//!
//! While an answer streams, only Ctrl-C is read (it cancels the answer); everything else typed
//! is dropped, so that keys pressed while reading do not turn into a half-typed line behind
//! the answer. Escape sequences (arrow and function keys) are swallowed whole, never echoed.
//! Invalid UTF-8 and a line over its bound ring the bell (0x07) and are not taken: the line
//! buffer is fixed and never grows. The terminal is in raw mode, so every line this core
//! writes ends in CR LF, the answer's `\n` included; control characters in the answer or in
//! log lines (an escape sequence a model or a log line might hold) are not passed to the
//! terminal.

use crate::engine::store::SessionId;
use crate::serial::core::{Core, Env};
use crate::serial::stats::Count;
use crate::service::{ErrorCode, Event, Format, Prompt, Request, ServiceError, Shape};
use crate::tokenizer::ChatMessage;
use std::sync::Arc;
use std::time::Duration;

/// The largest configurable line, in bytes.
pub const MAX_LINE: usize = 1024;
pub const PROMPT: &str = "edgellm> ";
const BELL: &[u8] = b"\x07";
/// Lines `log` shows without a number, and at most.
const LOG_LINES: usize = 20;
const LOG_MAX: usize = 200;
/// A CSI sequence longer than this is not one: stop swallowing bytes.
const CSI_MAX: u8 = 16;

const HELP: &str = "Type a question and press Enter: the answer streams here, Ctrl-C stops it.
Commands (alone on the line; any other line goes to the model):
  help       this text
  status     the appliance's state and counters
  sessions   the saved sessions
  /session NAME  messages continue the named session's conversation (/session: which)
  /reset     forget this console's session (its conversation)
  /history   show this console's session's conversation
  /format NAME   answers in the configured format NAME (/format off: free text)
  /choice a|b|c  answers are exactly one of a, b, c (/choice off: free text)
  log [N]    the daemon's last N log lines (20, at most 200)
Editing: Backspace erases a character, Ctrl-U the line, Ctrl-C clears it.
";

/// A console configuration that cannot be served.
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum ConsoleError {
    #[error("console line bound {got} is out of range 1..={MAX_LINE}")]
    LineBound { got: usize },
}

/// Where in an escape sequence the input is.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Esc {
    None,
    /// After ESC.
    Start,
    /// After ESC [, with this many parameter bytes.
    Csi(u8),
    /// After ESC O: one more byte.
    Ss3,
}

/// The answer being streamed.
struct Running {
    /// The cursor is at the start of a line (the summary line needs no CR LF first).
    at_line_start: bool,
    kind: Kind,
}

/// What the running request is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Chat,
    Reset,
    History,
}

/// How a console port behaves.
#[derive(Clone, Debug, PartialEq)]
pub struct ConsoleConfig {
    /// Longest line in bytes, 1 to [`MAX_LINE`].
    pub max_line: usize,
    /// Tokens of an answer.
    pub max_tokens: usize,
    /// Per-request deadline.
    pub timeout: Option<Duration>,
}

impl Default for ConsoleConfig {
    fn default() -> Self {
        ConsoleConfig {
            max_line: 256,
            max_tokens: 256,
            timeout: None,
        }
    }
}

/// The console mode of one port.
pub struct ConsoleCore {
    max_line: usize,
    max_tokens: usize,
    timeout: Option<Duration>,
    line: heapless::String<MAX_LINE>,
    /// A UTF-8 sequence being typed, and its length.
    utf8: heapless::Vec<u8, 4>,
    utf8_len: usize,
    esc: Esc,
    /// The last byte was CR: an LF right after it is the same Enter.
    after_cr: bool,
    /// This line went over its bound (counted once).
    overlong: bool,
    running: Option<Running>,
    /// The named session this console's chat messages continue (`/session NAME`).
    session: Option<SessionId>,
    /// The shape answers must have (`/format NAME`, `/choice a|b|c`).
    format: Option<Format>,
}

impl ConsoleCore {
    pub fn new(cfg: ConsoleConfig) -> Result<ConsoleCore, ConsoleError> {
        if !(1..=MAX_LINE).contains(&cfg.max_line) {
            return Err(ConsoleError::LineBound { got: cfg.max_line });
        }
        Ok(ConsoleCore {
            max_line: cfg.max_line,
            max_tokens: cfg.max_tokens.max(1),
            timeout: cfg.timeout,
            line: heapless::String::new(),
            utf8: heapless::Vec::new(),
            utf8_len: 0,
            esc: Esc::None,
            after_cr: false,
            overlong: false,
            running: None,
            session: None,
            format: None,
        })
    }

    /// The line being edited (tests).
    pub fn line(&self) -> &str {
        &self.line
    }

    /// The line buffer's fixed size in bytes (tests: input never grows it).
    pub fn line_capacity(&self) -> usize {
        self.line.capacity()
    }

    /// Writes a fresh prompt (what [`Core::on_open`] does each time the port opens).
    pub fn greet(&mut self, env: &mut dyn Env) {
        env.write(b"\r\n");
        env.write(PROMPT.as_bytes());
    }

    fn on_byte(&mut self, b: u8, env: &mut dyn Env) {
        if let Some(r) = &mut self.running {
            if b == 0x03 {
                env.cancel();
                env.write(b"^C");
                r.at_line_start = false;
            }
            return;
        }
        match self.esc {
            Esc::None => {}
            Esc::Start => {
                self.esc = match b {
                    b'[' => Esc::Csi(0),
                    b'O' => Esc::Ss3,
                    _ => Esc::None,
                };
                return;
            }
            Esc::Csi(n) => {
                // Parameter and intermediate bytes, then a final byte 0x40..=0x7E. A control
                // byte is not part of it: the sequence was cut, take the byte as typed.
                if b >= 0x20 {
                    self.esc = if (0x40..=0x7E).contains(&b) || n >= CSI_MAX {
                        Esc::None
                    } else {
                        Esc::Csi(n + 1)
                    };
                    return;
                }
                self.esc = Esc::None;
            }
            Esc::Ss3 => {
                self.esc = Esc::None;
                return;
            }
        }
        if self.utf8_len > 0 {
            if b & 0xC0 == 0x80 {
                let _ = self.utf8.push(b);
                if self.utf8.len() == self.utf8_len {
                    let bytes = std::mem::take(&mut self.utf8);
                    self.utf8_len = 0;
                    // A C1 control (U+0080..U+009F, such as U+009B, the one-byte CSI) typed as
                    // UTF-8 would be echoed for the terminal to act on: refused like bad UTF-8.
                    match std::str::from_utf8(&bytes) {
                        Ok(s) if !s.chars().any(char::is_control) => self.insert(s, env),
                        _ => self.invalid(env),
                    }
                }
                return;
            }
            // The sequence stopped short: refuse it, then take this byte as typed.
            self.utf8.clear();
            self.utf8_len = 0;
            self.invalid(env);
        }
        let after_cr = std::mem::replace(&mut self.after_cr, false);
        match b {
            b'\r' => {
                self.after_cr = true;
                self.submit(env);
            }
            b'\n' if after_cr => {}
            b'\n' => self.submit(env),
            0x08 | 0x7F => {
                if let Some(_c) = self.line.pop() {
                    env.write(b"\x08 \x08");
                }
            }
            0x15 => {
                for _ in 0..self.line.chars().count() {
                    env.write(b"\x08 \x08");
                }
                self.clear_line();
            }
            0x03 => {
                env.write(b"^C\r\n");
                self.clear_line();
                env.write(PROMPT.as_bytes());
            }
            0x1B => self.esc = Esc::Start,
            0x20..=0x7E => {
                let c = [b];
                // ASCII is UTF-8.
                self.insert(std::str::from_utf8(&c).unwrap_or(" "), env);
            }
            0xC2..=0xDF => self.start_utf8(b, 2),
            0xE0..=0xEF => self.start_utf8(b, 3),
            0xF0..=0xF4 => self.start_utf8(b, 4),
            // Other control keys (Tab, Ctrl-D, NUL after CR from telnet) edit nothing.
            0x00..=0x1F => {}
            _ => self.invalid(env),
        }
    }

    fn start_utf8(&mut self, b: u8, len: usize) {
        self.utf8.clear();
        let _ = self.utf8.push(b);
        self.utf8_len = len;
    }

    fn invalid(&mut self, env: &mut dyn Env) {
        env.count(Count::BadInput);
        env.write(BELL);
    }

    fn insert(&mut self, s: &str, env: &mut dyn Env) {
        if self.line.len() + s.len() > self.max_line {
            if !self.overlong {
                self.overlong = true;
                env.count(Count::BadInput);
            }
            env.write(BELL);
            return;
        }
        // Fits: max_line <= MAX_LINE.
        let _ = self.line.push_str(s);
        env.write(s.as_bytes());
    }

    fn clear_line(&mut self) {
        self.line.clear();
        self.overlong = false;
    }

    fn submit(&mut self, env: &mut dyn Env) {
        env.write(b"\r\n");
        let text = self.line.trim().to_owned();
        self.clear_line();
        let mut words = text.split_whitespace();
        match (words.next(), words.next(), words.next()) {
            (None, _, _) => {}
            (Some("help"), None, _) => write_text(env, HELP),
            (Some("status"), None, _) => self.status(env),
            (Some("sessions"), None, _) => {
                let s = env.sessions();
                if s.is_empty() {
                    write_text(env, "no sessions\n");
                }
                for name in s {
                    write_text(env, &name);
                    env.write(b"\r\n");
                }
            }
            (Some("/session"), None, _) => write_text(
                env,
                &match &self.session {
                    Some(s) => format!("session {s}\n"),
                    None => "no session: each message stands alone\n".to_owned(),
                },
            ),
            (Some("/session"), Some(name), None) => match SessionId::parse(name) {
                Ok(id) => {
                    write_text(
                        env,
                        &format!("session {id}: messages continue its conversation\n"),
                    );
                    self.session = Some(id);
                }
                Err(e) => {
                    // On the record as any refusal: a name a technician could not use.
                    let e = ServiceError::new(ErrorCode::BadRequest, e.to_string());
                    env.refused_here(e.clone(), Some(name));
                    write_text(env, &format!("error: {e}\n"));
                }
            },
            (Some(cmd @ ("/reset" | "/history")), None, _) => {
                let Some(id) = self.session.clone() else {
                    write_text(env, "no session: choose one with /session NAME\n");
                    env.write(PROMPT.as_bytes());
                    return;
                };
                let (prompt, kind) = if cmd == "/reset" {
                    (Prompt::Forget, Kind::Reset)
                } else {
                    (Prompt::History, Kind::History)
                };
                return self.send(prompt, kind, Some(id), env);
            }
            (Some(cmd @ ("/format" | "/choice")), None, _) => write_text(
                env,
                &match (&self.format, cmd) {
                    (Some(Format::Named(n)), _) => format!("format {n}\n"),
                    (Some(Format::Shape(s)), _) => format!("format: a {}\n", s.kind()),
                    (None, _) => "no format: answers are free text\n".to_owned(),
                },
            ),
            (Some("/format" | "/choice"), Some("off"), None) => {
                self.format = None;
                write_text(env, "no format: answers are free text\n");
            }
            (Some("/format"), Some(name), None) => {
                write_text(
                    env,
                    &format!("format {name}: answers must have its shape\n"),
                );
                self.format = Some(Format::Named(name.to_owned()));
            }
            (Some("/choice"), Some(_), _) => {
                // The options are the rest of the line, spaces and all.
                let list = text["/choice".len()..].trim();
                let options: Vec<String> = list.split('|').map(|o| o.trim().to_owned()).collect();
                if options.iter().any(String::is_empty) {
                    write_text(env, "choice: an option is empty; write /choice a|b|c\n");
                } else {
                    write_text(
                        env,
                        &format!("answers are one of: {}\n", options.join(", ")),
                    );
                    self.format = Some(Format::Shape(Arc::new(Shape::Choice(options))));
                }
            }
            (Some("log"), n, None) => match n.map(str::parse::<usize>) {
                None => log(env, LOG_LINES),
                Some(Ok(n)) => log(env, n.min(LOG_MAX)),
                Some(Err(_)) => write_text(env, "log: N is a number of lines\n"),
            },
            _ => return self.chat(text, env),
        }
        env.write(PROMPT.as_bytes());
    }

    fn status(&self, env: &mut dyn Env) {
        let s = env.status();
        let mut text = format!(
            "state      {} (model {})\nqueue      {} waiting, answering: {}\n",
            s.state,
            s.model,
            s.queue,
            if s.running { "yes" } else { "no" },
        );
        for (name, n) in s.counters() {
            text.push_str(&format!("{name:<21}{n}\n"));
        }
        write_text(env, &text);
    }

    fn chat(&mut self, text: String, env: &mut dyn Env) {
        let prompt = Prompt::Chat(vec![ChatMessage::new("user", text)]);
        let session = self.session.clone();
        self.send(prompt, Kind::Chat, session, env)
    }

    fn send(&mut self, prompt: Prompt, kind: Kind, session: Option<SessionId>, env: &mut dyn Env) {
        let mut req = Request::new(env.new_id(), env.source(), prompt);
        req.session = session;
        req.max_tokens = self.max_tokens;
        req.deadline = self.timeout.map(|t| env.now() + t);
        if kind == Kind::Chat {
            req.format = self.format.clone();
        }
        match env.submit(req) {
            Ok(()) => {
                env.count(Count::Requests);
                self.running = Some(Running {
                    at_line_start: true,
                    kind,
                });
            }
            Err(e) => {
                write_text(env, &format!("error: {}: {}\n", e.code, e.message));
                env.write(PROMPT.as_bytes());
            }
        }
    }

    /// Back to editing after an answer: whatever was half-typed before it is gone.
    fn end_answer(&mut self, summary: &str, env: &mut dyn Env) {
        if let Some(r) = self.running.take()
            && !r.at_line_start
        {
            env.write(b"\r\n");
        }
        write_text(env, summary);
        self.esc = Esc::None;
        self.utf8.clear();
        self.utf8_len = 0;
        self.after_cr = false;
        env.write(PROMPT.as_bytes());
    }
}

impl Core for ConsoleCore {
    fn on_bytes(&mut self, bytes: &[u8], env: &mut dyn Env) {
        for &b in bytes {
            self.on_byte(b, env);
        }
    }

    fn on_event(&mut self, ev: Event, env: &mut dyn Env) {
        let Some(r) = &mut self.running else { return };
        match ev {
            Event::Text(c) => {
                if let Some(last) = c.chars().rev().find(|&ch| ch == '\n' || !ch.is_control()) {
                    r.at_line_start = last == '\n';
                }
                write_text(env, &c);
            }
            Event::Done(_) if r.kind == Kind::Reset => {
                let s = self.session.as_ref().map_or("", |s| s.as_str()).to_owned();
                self.end_answer(&format!("session {s} forgotten\n"), env);
            }
            Event::Done(d) if r.kind == Kind::History => {
                let end = if d.text.is_empty() {
                    "(no conversation yet)\n"
                } else {
                    ""
                };
                self.end_answer(end, env);
            }
            Event::Done(d) => {
                let shape = match d.valid {
                    Some(true) => " · valid",
                    Some(false) => " · NOT VALID: the answer lacks the format's shape",
                    None => "",
                };
                let summary = format!(
                    "[{}{shape} · {} prompt tokens · {} tokens · {:.1} tok/s]\n",
                    d.finish_reason.as_str(),
                    d.usage.prompt_tokens,
                    d.usage.completion_tokens,
                    d.timings.decode_tps,
                );
                self.end_answer(&summary, env);
            }
            Event::Error(e) => {
                self.end_answer(&format!("error: {}: {}\n", e.code, e.message), env);
            }
        }
    }

    fn on_open(&mut self, env: &mut dyn Env) {
        self.clear_line();
        self.esc = Esc::None;
        self.utf8.clear();
        self.utf8_len = 0;
        if self.running.is_none() {
            self.greet(env);
        }
    }
}

/// Writes text for a terminal in raw mode: `\n` becomes CR LF, other control characters
/// (CR, ESC, C1) are dropped so that nothing written can move the cursor or recolour the
/// technician's screen. Tabs pass.
fn write_text(env: &mut dyn Env, s: &str) {
    let mut start = 0;
    for (i, c) in s.char_indices() {
        if c == '\t' || !c.is_control() {
            continue;
        }
        env.write(&s.as_bytes()[start..i]);
        if c == '\n' {
            env.write(b"\r\n");
        }
        start = i + c.len_utf8();
    }
    env.write(&s.as_bytes()[start..]);
}

fn log(env: &mut dyn Env, n: usize) {
    let lines = env.log_tail(n);
    if lines.is_empty() {
        write_text(env, "the log is empty\n");
    }
    for l in lines {
        write_text(env, &l);
        env.write(b"\r\n");
    }
}

#[cfg(test)]
#[path = "console_tests.rs"]
mod tests;
