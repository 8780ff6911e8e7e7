//! The line protocol (mode `line`): one command per line, for a PLC's serial port or a script.
//! `docs/serial.md` documents it byte by byte; in short:
//!
//! ```text
//! → PING                         ← OK PONG
//! → GEN Once upon a time         ← OK there was a little girl…   (stream off: one line)
//! → SET stream=on                ← OK stream=on
//! → CHAT session=pump3 Why?      ← DATA Because\n… / END eog 12 40
//! → STATUS                       ← OK state=online queue=0 …
//! → PING*1C                      ← OK PONG*4D                     (NMEA-style checksum)
//! ```
//!
//! Lines end with CR, LF or CRLF and are held in one buffer of a fixed size: a longer line is
//! discarded to its end and answered `ERR too_long`, so garbage never grows memory. One
//! request at a time per port; commands that only read (PING, STATUS, HELP, SET, CANCEL) are
//! answered at once even while an answer runs, each on its own line.

use super::core::{Core, Env};
use super::stats::Count;
use crate::engine::store::SessionId;
use crate::service::{Event, FinishReason, Format, Prompt, Request, ServiceError, Shape};
use crate::tokenizer::ChatMessage;
use std::sync::Arc;
use std::time::Duration;

/// How a line port is bounded.
#[derive(Clone, Debug)]
pub struct LineConfig {
    /// Longest line, terminator excluded.
    pub max_line: usize,
    /// Most tokens a request may ask for (the daemon's `limits.max_tokens`).
    pub max_tokens: usize,
    /// Tokens of an answer when `SET max_tokens` was never sent.
    pub default_tokens: usize,
    /// Per-request deadline.
    pub timeout: Option<Duration>,
}

/// Longest `SET system=` text: a system prompt, kept per port.
const MAX_SYSTEM: usize = 4096;

/// The settings a port's `SET` commands change.
#[derive(Clone, Debug)]
struct Settings {
    max_tokens: usize,
    temperature: f32,
    seed: u64,
    stream: bool,
    system: Option<String>,
    /// The shape answers must have (`SET format=NAME`, `SET choice=a|b|c`).
    format: Option<Format>,
}

/// The request this port is answering.
struct Running {
    /// Reply with a checksum: the request line had one.
    checksum: bool,
    /// Non-streamed answers are gathered here (bounded by the request's tokens).
    text: String,
    /// A reset is answered `OK RESET <id>`, not with text.
    reset: Option<String>,
}

pub struct LineCore {
    cfg: LineConfig,
    buf: Vec<u8>,
    /// The line outgrew the buffer: drop bytes to its end, then answer `ERR too_long`.
    overflow: bool,
    set: Settings,
    running: Option<Running>,
}

impl LineCore {
    pub fn new(cfg: LineConfig) -> LineCore {
        let set = Settings {
            max_tokens: cfg.default_tokens.min(cfg.max_tokens).max(1),
            temperature: 0.0,
            seed: 0,
            stream: false,
            system: None,
            format: None,
        };
        LineCore {
            // Sized once: `push` below never lets it grow past this.
            buf: Vec::with_capacity(cfg.max_line),
            cfg,
            overflow: false,
            set,
            running: None,
        }
    }

    /// The line buffer's capacity (tests check that garbage never grows it).
    pub fn capacity(&self) -> usize {
        self.buf.capacity()
    }

    fn end_of_line(&mut self, env: &mut dyn Env) {
        if self.overflow {
            self.overflow = false;
            self.buf.clear();
            env.count(Count::BadInput);
            let msg = format!("line longer than {} bytes, discarded", self.cfg.max_line);
            reply(env, false, "ERR too_long ", &msg);
            return;
        }
        let line = std::mem::take(&mut self.buf);
        self.command(&line, env);
        // Give the allocation back for the next line (`take` left an empty Vec).
        self.buf = line;
        self.buf.clear();
    }

    fn command(&mut self, raw: &[u8], env: &mut dyn Env) {
        let (body, checksum) = match split_checksum(raw) {
            Checksum::None => (raw, false),
            Checksum::Good(body) => (body, true),
            Checksum::Bad { want, got } => {
                env.count(Count::Checksum);
                let msg = format!("line checksum is {got:02X}, the bytes give {want:02X}");
                return reply(env, true, "ERR checksum ", &msg);
            }
        };
        let Ok(text) = std::str::from_utf8(body) else {
            env.count(Count::BadInput);
            return reply(
                env,
                checksum,
                "ERR bad_utf8 ",
                "the line is not valid UTF-8",
            );
        };
        let text = text.trim_matches(|c| c == ' ' || c == '\t');
        if text.is_empty() {
            // PLCs pad with empty lines (CR LF LF): nothing to answer.
            return;
        }
        let (word, rest) = match text.split_once([' ', '\t']) {
            Some((w, r)) => (w, r.trim_start_matches([' ', '\t'])),
            None => (text, ""),
        };
        match word.to_ascii_uppercase().as_str() {
            "PING" => reply(env, checksum, "OK ", "PONG"),
            "HELP" => reply(env, checksum, "OK ", HELP),
            "STATUS" => {
                let s = env.status();
                let mut line = format!(
                    "state={} model={} queue={} running={}",
                    s.state,
                    s.model,
                    s.queue,
                    yes_no(s.running),
                );
                for (name, n) in s.counters() {
                    line.push_str(&format!(" {name}={n}"));
                }
                let this = if self.running.is_some() {
                    "running"
                } else {
                    "idle"
                };
                line.push_str(&format!(" this_port={this}"));
                reply(env, checksum, "OK ", &line)
            }
            "CANCEL" => {
                if self.running.is_some() {
                    env.cancel();
                    reply(env, checksum, "OK ", "CANCELLING")
                } else {
                    reply(
                        env,
                        checksum,
                        "ERR idle ",
                        "no request of this port is running",
                    )
                }
            }
            "SET" => self.set(rest, checksum, env),
            "GEN" => {
                let p = Prompt::Text {
                    text: rest.to_owned(),
                    special: false,
                };
                self.submit(p, None, None, checksum, env)
            }
            "CHAT" => {
                let (session, msg) = match rest.strip_prefix("session=") {
                    Some(r) => match r.split_once([' ', '\t']) {
                        Some((id, m)) => (Some(id), m.trim_start_matches([' ', '\t'])),
                        None => (Some(r), ""),
                    },
                    None => (None, rest),
                };
                let session = match session {
                    None => None,
                    Some(name) => match session_id(name, checksum, env) {
                        Some(id) => Some(id),
                        None => return,
                    },
                };
                let p = Prompt::Chat(vec![ChatMessage::new("user", msg)]);
                self.submit(p, session, None, checksum, env)
            }
            // `RESET pump-3` or, as CHAT names it, `RESET session=pump-3` (HISTORY alike).
            "RESET" => {
                if let Some(id) =
                    session_id(rest.strip_prefix("session=").unwrap_or(rest), checksum, env)
                {
                    let name = id.as_str().to_owned();
                    self.submit(Prompt::Forget, Some(id), Some(name), checksum, env)
                }
            }
            "HISTORY" => {
                if let Some(id) =
                    session_id(rest.strip_prefix("session=").unwrap_or(rest), checksum, env)
                {
                    self.submit(Prompt::History, Some(id), None, checksum, env)
                }
            }
            _ => {
                env.count(Count::BadInput);
                let w: String = word.chars().take(32).collect();
                reply(
                    env,
                    checksum,
                    "ERR unknown_command ",
                    &format!("{w}: the commands are {COMMANDS}"),
                )
            }
        }
    }

    fn set(&mut self, arg: &str, checksum: bool, env: &mut dyn Env) {
        let Some((key, value)) = arg.split_once('=') else {
            return reply(env, checksum, "ERR bad_request ", "SET takes key=value");
        };
        let key = key.trim().to_ascii_lowercase();
        let value = value.trim();
        let bad = |env: &mut dyn Env, why: String| {
            reply(env, checksum, "ERR bad_value ", &format!("{key}: {why}"))
        };
        match key.as_str() {
            "max_tokens" => match value.parse::<usize>() {
                Ok(n) if (1..=self.cfg.max_tokens).contains(&n) => self.set.max_tokens = n,
                _ => {
                    let max = self.cfg.max_tokens;
                    return bad(env, format!("{value:?} is not a number from 1 to {max}"));
                }
            },
            "temperature" => match value.parse::<f32>() {
                Ok(t) if (0.0..=2.0).contains(&t) => self.set.temperature = t,
                _ => return bad(env, format!("{value:?} is not a number from 0 to 2")),
            },
            "seed" => match value.parse::<u64>() {
                Ok(s) => self.set.seed = s,
                Err(_) => return bad(env, format!("{value:?} is not a whole number")),
            },
            "stream" => match value.to_ascii_lowercase().as_str() {
                "on" | "1" | "true" | "yes" => self.set.stream = true,
                "off" | "0" | "false" | "no" => self.set.stream = false,
                _ => return bad(env, format!("{value:?} is not on or off")),
            },
            "system" if value.len() > MAX_SYSTEM => {
                return bad(env, format!("longer than {MAX_SYSTEM} bytes"));
            }
            "system" => self.set.system = (!value.is_empty()).then(|| value.to_owned()),
            // Empty or `off` ends it; a name is looked up by the service when a request uses it.
            "format" if value.is_empty() || value.eq_ignore_ascii_case("off") => {
                self.set.format = None
            }
            "format" => self.set.format = Some(Format::Named(value.to_owned())),
            "choice" if value.is_empty() || value.eq_ignore_ascii_case("off") => {
                self.set.format = None
            }
            "choice" => {
                let options: Vec<String> = value.split('|').map(str::to_owned).collect();
                if options.iter().any(String::is_empty) {
                    return bad(env, "an option is empty: write a|b|c".into());
                }
                self.set.format = Some(Format::Shape(Arc::new(Shape::Choice(options))));
            }
            _ => {
                return reply(
                    env,
                    checksum,
                    "ERR bad_request ",
                    &format!(
                        "unknown setting {key:?}: max_tokens, temperature, seed, stream, system, \
                         format, choice"
                    ),
                );
            }
        }
        reply(env, checksum, "OK ", &format!("{key}={value}"))
    }

    fn submit(
        &mut self,
        prompt: Prompt,
        session: Option<SessionId>,
        reset: Option<String>,
        checksum: bool,
        env: &mut dyn Env,
    ) {
        if self.running.is_some() {
            return reply(
                env,
                checksum,
                "ERR busy ",
                "a request of this port is running: wait for its answer or CANCEL it",
            );
        }
        let mut req = Request::new(env.new_id(), env.source(), prompt);
        req.session = session;
        req.system = if matches!(req.prompt, Prompt::Chat(_)) {
            self.set.system.clone()
        } else {
            None
        };
        req.max_tokens = self.set.max_tokens;
        req.sampling.temperature = self.set.temperature;
        req.sampling.seed = self.set.seed;
        req.deadline = self.cfg.timeout.map(|t| env.now() + t);
        if matches!(req.prompt, Prompt::Chat(_) | Prompt::Text { .. }) {
            req.format = self.set.format.clone();
        }
        match env.submit(req) {
            Ok(()) => {
                env.count(Count::Requests);
                self.running = Some(Running {
                    checksum,
                    text: String::new(),
                    reset,
                });
            }
            Err(e) => error(env, checksum, &e),
        }
    }
}

impl Core for LineCore {
    fn on_bytes(&mut self, bytes: &[u8], env: &mut dyn Env) {
        for &b in bytes {
            match b {
                // CR LF ends a line and then an empty one, which is ignored.
                b'\r' | b'\n' => self.end_of_line(env),
                _ if self.overflow => {}
                _ if self.buf.len() == self.cfg.max_line => self.overflow = true,
                _ => self.buf.push(b),
            }
        }
    }

    fn on_event(&mut self, ev: Event, env: &mut dyn Env) {
        let Some(run) = self.running.as_mut() else {
            return;
        };
        let cs = run.checksum;
        match ev {
            Event::Text(t) if self.set.stream && run.reset.is_none() => reply(env, cs, "DATA ", &t),
            Event::Text(t) => run.text.push_str(&t),
            Event::Done(d) => {
                let run = self.running.take().unwrap_or_else(|| unreachable!());
                if let Some(id) = run.reset {
                    return reply(env, cs, "OK RESET ", &id);
                }
                if self.set.stream {
                    let mut end = format!(
                        "{} {} {}",
                        d.finish_reason.as_str(),
                        d.usage.prompt_tokens,
                        d.usage.completion_tokens
                    );
                    if let Some(v) = d.valid {
                        end.push_str(if v { " valid" } else { " invalid" });
                    }
                    return reply_raw(env, cs, "END ", &end);
                }
                if d.valid == Some(false)
                    && !matches!(
                        d.finish_reason,
                        FinishReason::Cancelled | FinishReason::Timeout
                    )
                {
                    // Never an answer that lacks its shape on an `OK` line.
                    let why = format!(
                        "the answer ended ({}) before it had the format's shape: {}",
                        d.finish_reason.as_str(),
                        run.text
                    );
                    return reply(env, cs, "ERR invalid ", &why);
                }
                match d.finish_reason {
                    FinishReason::Cancelled => {
                        reply(env, cs, "ERR cancelled ", "the answer was cancelled")
                    }
                    FinishReason::Timeout => reply(
                        env,
                        cs,
                        "ERR timeout ",
                        &format!(
                            "the answer did not finish in time ({} tokens generated)",
                            d.usage.completion_tokens
                        ),
                    ),
                    _ => reply(env, cs, "OK ", &run.text),
                }
            }
            Event::Error(e) => {
                self.running = None;
                error(env, cs, &e)
            }
        }
    }

    fn on_open(&mut self, _env: &mut dyn Env) {
        // A half-received line is gone with the old link; a running answer goes on and is
        // written to the port once it is back.
        self.buf.clear();
        self.overflow = false;
    }
}

const COMMANDS: &str = "PING GEN CHAT STATUS CANCEL RESET HISTORY SET HELP";
const HELP: &str = "PING | GEN <text> | CHAT [session=<id>] <message> | STATUS | CANCEL | \
                    RESET <session> | HISTORY <session> | \
                    SET max_tokens|temperature|seed|stream|system|format|choice=<value> | \
                    HELP; end lines with CR or LF; optional *HH checksum (XOR of the bytes)";

fn yes_no(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}

fn error(env: &mut dyn Env, checksum: bool, e: &ServiceError) {
    reply_raw(
        env,
        checksum,
        &format!("ERR {} ", e.code.as_str()),
        &escape(&e.message),
    );
}

/// The session `name` names; `None` when it cannot be one, refused on the port and told to
/// the audit trail.
fn session_id(name: &str, checksum: bool, env: &mut dyn Env) -> Option<SessionId> {
    match SessionId::parse(name) {
        Ok(id) => Some(id),
        Err(e) => {
            let e = ServiceError::new(crate::service::ErrorCode::BadRequest, e.to_string());
            env.refused_here(e.clone(), Some(name));
            reply(env, checksum, "ERR bad_request ", &e.message);
            None
        }
    }
}

/// Writes `head` + `text` escaped, the checksum when asked, and CR LF.
fn reply(env: &mut dyn Env, checksum: bool, head: &str, text: &str) {
    reply_raw(env, checksum, head, &escape(text));
}

fn reply_raw(env: &mut dyn Env, checksum: bool, head: &str, body: &str) {
    let mut line = String::with_capacity(head.len() + body.len() + 5);
    line.push_str(head);
    if body.is_empty() {
        // `OK` alone, not `OK ` (an empty answer).
        line.pop();
    }
    line.push_str(body);
    if checksum {
        let x = xor(line.as_bytes());
        line.push_str(&format!("*{x:02X}"));
    }
    line.push_str("\r\n");
    env.write(line.as_bytes());
}

/// The answer on one line: newline, CR and backslash escaped (`\n`, `\r`, `\\`), and other
/// control characters as `\xHH` so that nothing in an answer can end or corrupt a line.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c if (c as u32) < 0x20 || c == '\x7f' => out.push_str(&format!("\\x{:02X}", c as u32)),
            c => out.push(c),
        }
    }
    out
}

/// The NMEA-style checksum: XOR of the bytes.
pub fn xor(b: &[u8]) -> u8 {
    b.iter().fold(0, |a, &x| a ^ x)
}

enum Checksum<'a> {
    None,
    Good(&'a [u8]),
    Bad { want: u8, got: u8 },
}

/// A line that ends in `*` and two hex digits carries a checksum of the bytes before the `*`.
fn split_checksum(line: &[u8]) -> Checksum<'_> {
    let n = line.len();
    if n < 3 || line[n - 3] != b'*' {
        return Checksum::None;
    }
    let hex = |b: u8| (b as char).to_digit(16);
    let (Some(hi), Some(lo)) = (hex(line[n - 2]), hex(line[n - 1])) else {
        return Checksum::None;
    };
    let got = (hi * 16 + lo) as u8;
    let body = &line[..n - 3];
    let want = xor(body);
    if want == got {
        Checksum::Good(body)
    } else {
        Checksum::Bad { want, got }
    }
}

#[cfg(test)]
mod tests;
