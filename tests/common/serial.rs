//! Real ttys for the serial tests: a pseudo-terminal pair whose slave path the daemon opens as
//! its port, and whose master the test reads and writes as the PLC would its UART.
#![allow(dead_code)]

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

/// The PLC's end of a pty pair; the daemon opens `path`.
pub struct Pty {
    master: std::fs::File,
    /// Held open so that the slave stays usable when the daemon closes and reopens it.
    _slave: OwnedFd,
    pub path: String,
    /// Bytes read but not yet returned by `line`.
    pending: Vec<u8>,
}

impl Pty {
    pub fn open() -> Pty {
        let p = nix::pty::openpty(None, None).unwrap();
        let path = nix::unistd::ttyname(p.slave.as_fd())
            .unwrap()
            .to_string_lossy()
            .into_owned();
        // Raw at once: until the daemon sets the line, the slave would echo what we write.
        let mut t = nix::sys::termios::tcgetattr(p.slave.as_fd()).unwrap();
        nix::sys::termios::cfmakeraw(&mut t);
        nix::sys::termios::tcsetattr(p.slave.as_fd(), nix::sys::termios::SetArg::TCSANOW, &t)
            .unwrap();
        Pty {
            master: std::fs::File::from(p.master),
            _slave: p.slave,
            path,
            pending: Vec::new(),
        }
    }

    /// The line settings of the tty now (as the daemon set them).
    pub fn termios(&self) -> nix::sys::termios::Termios {
        nix::sys::termios::tcgetattr(self._slave.as_fd()).unwrap()
    }

    pub fn send(&mut self, bytes: &[u8]) {
        self.master.write_all(bytes).unwrap();
    }

    /// Writes all of `bytes` while reading what comes back (kept for `line`/`drain`): for a
    /// mode that echoes, a plain write of a megabyte would wait on a full pty forever.
    pub fn pump(&mut self, mut bytes: &[u8], within: Duration) {
        use nix::fcntl::{FcntlArg, OFlag, fcntl};
        use std::os::fd::AsRawFd;
        let fd = self.master.as_raw_fd();
        let old = OFlag::from_bits_truncate(fcntl(fd, FcntlArg::F_GETFL).unwrap());
        fcntl(fd, FcntlArg::F_SETFL(old | OFlag::O_NONBLOCK)).unwrap();
        let until = Instant::now() + within;
        while !bytes.is_empty() {
            assert!(
                Instant::now() < until,
                "{} bytes not taken in time",
                bytes.len()
            );
            let mut fds = [PollFd::new(
                self.master.as_fd(),
                PollFlags::POLLIN | PollFlags::POLLOUT,
            )];
            let _ = poll(&mut fds, PollTimeout::from(100u16));
            let ev = fds[0].revents().unwrap_or(PollFlags::empty());
            if ev.contains(PollFlags::POLLIN) {
                let mut buf = [0u8; 4096];
                if let Ok(n) = self.master.read(&mut buf) {
                    self.pending.extend_from_slice(&buf[..n]);
                    // Only the end matters to a test that pumps a megabyte.
                    if self.pending.len() > 1 << 16 {
                        self.pending.drain(..self.pending.len() - 4096);
                    }
                }
            }
            if ev.contains(PollFlags::POLLOUT) {
                if let Ok(n) = self.master.write(bytes) {
                    bytes = &bytes[n..];
                }
            }
        }
        fcntl(fd, FcntlArg::F_SETFL(old)).unwrap();
    }

    /// Reads what comes within `within` (all of it, until nothing more arrives for 200 ms
    /// after `want` bytes were seen).
    fn fill(&mut self, within: Duration) -> bool {
        let mut fds = [PollFd::new(self.master.as_fd(), PollFlags::POLLIN)];
        let ms = within.as_millis().min(60_000) as u16;
        match poll(&mut fds, PollTimeout::from(ms)) {
            Ok(n) if n > 0 => {
                let mut buf = [0u8; 4096];
                match self.master.read(&mut buf) {
                    Ok(n) if n > 0 => {
                        self.pending.extend_from_slice(&buf[..n]);
                        true
                    }
                    _ => false,
                }
            }
            _ => false,
        }
    }

    /// The next line the daemon wrote (without its CR LF), or `None` after `within`.
    pub fn line(&mut self, within: Duration) -> Option<String> {
        let until = Instant::now() + within;
        loop {
            if let Some(i) = self.pending.windows(2).position(|w| w == b"\r\n") {
                let line: Vec<u8> = self.pending.drain(..i + 2).take(i).collect();
                return Some(String::from_utf8_lossy(&line).into_owned());
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            self.fill(left);
        }
    }

    /// Sends `cmd` + CR LF and returns the next line of the answer.
    pub fn ask(&mut self, cmd: &str, within: Duration) -> String {
        self.send(format!("{cmd}\r\n").as_bytes());
        self.line(within)
            .unwrap_or_else(|| panic!("no answer to {cmd:?} within {within:?}"))
    }

    /// Everything that arrives within `within` (for the bytes of modes without lines).
    pub fn drain(&mut self, within: Duration) -> Vec<u8> {
        let until = Instant::now() + within;
        while Instant::now() < until {
            self.fill(Duration::from_millis(50));
        }
        std::mem::take(&mut self.pending)
    }
}

/// The text of a line-mode reply (`OK …`, `DATA …`) with its escapes (`\n \r \\ \xHH`) undone.
pub fn unescape(s: &str) -> String {
    let mut out = String::new();
    let mut it = s.chars();
    while let Some(c) = it.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match it.next() {
            Some('n') => out.push('\n'),
            Some('r') => out.push('\r'),
            Some('\\') => out.push('\\'),
            Some('x') => {
                let h: String = it.by_ref().take(2).collect();
                out.push(char::from(u8::from_str_radix(&h, 16).unwrap()));
            }
            o => panic!("bad escape {o:?} in {s}"),
        }
    }
    out
}

/// A process's resident memory in KiB (`VmRSS`).
pub fn rss_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// What `edgellm run` answers for the same greedy raw prompt: the text a serial answer must
/// equal (`ctx` as the daemon under test has it).
pub fn run_text(prompt: &str, n: usize, ctx: usize) -> String {
    let m = super::mqtt::model_arg(&super::model_path("q4_0"));
    let (n, ctx) = (n.to_string(), ctx.to_string());
    let out = super::mqtt::edgellm(&[
        "run", "-m", &m, "--prompt", prompt, "-n", &n, "-c", &ctx, "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["text"].as_str().unwrap().to_owned()
}

/// The same random bytes every run (xorshift64), for the megabyte-of-garbage tests.
pub struct Noise(pub u64);

impl Noise {
    /// Fills `buf`; a byte in `avoid` (a line end, Ctrl-C) becomes `instead`.
    pub fn fill(&mut self, buf: &mut [u8], avoid: &[u8], instead: u8) {
        for b in buf.iter_mut() {
            let x = &mut self.0;
            *x ^= *x << 13;
            *x ^= *x >> 7;
            *x ^= *x << 17;
            let v = *x as u8;
            *b = if avoid.contains(&v) { instead } else { v };
        }
    }
}

/// Reads `p` until `want` has arrived (or fails after `within`): everything read (for the
/// console, whose prompt ends no line).
pub fn until(p: &mut Pty, want: &str, within: Duration) -> String {
    let end = Instant::now() + within;
    let mut got = Vec::new();
    while Instant::now() < end {
        got.extend(p.drain(Duration::from_millis(20)));
        if String::from_utf8_lossy(&got).contains(want) {
            return String::from_utf8_lossy(&got).into_owned();
        }
    }
    panic!(
        "{want:?} not seen within {within:?}; got {:?}",
        String::from_utf8_lossy(&got)
    );
}
