//! The daemon's last log lines in memory, for a technician's serial console (`log`): the
//! writer of the logs copies each line here on its way to stderr (journald under systemd).

use std::collections::VecDeque;
use std::io::Write;
use std::sync::{Arc, Mutex};

/// Lines kept, and the longest kept of each (the rest is cut: a console shows a summary).
const LINES: usize = 200;
const LINE_BYTES: usize = 300;

#[derive(Default)]
pub struct LogRing {
    lines: Mutex<VecDeque<String>>,
}

impl LogRing {
    /// The last `n` lines, oldest first.
    pub fn tail(&self, n: usize) -> Vec<String> {
        let g = self.lines.lock().unwrap_or_else(|p| p.into_inner());
        g.iter().skip(g.len().saturating_sub(n)).cloned().collect()
    }

    fn push(&self, bytes: &[u8]) {
        let mut g = self.lines.lock().unwrap_or_else(|p| p.into_inner());
        for line in bytes.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
            let mut s = String::from_utf8_lossy(line).into_owned();
            if s.len() > LINE_BYTES {
                let mut cut = LINE_BYTES;
                while !s.is_char_boundary(cut) {
                    cut -= 1;
                }
                s.truncate(cut);
                s.push('…');
            }
            if g.len() == LINES {
                g.pop_front();
            }
            g.push_back(s);
        }
    }
}

/// stderr, with a copy of each line in the ring when there is one (`serve` only: the other
/// commands keep no log in memory).
pub struct Tee(pub Option<Arc<LogRing>>);

impl Write for Tee {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        // The formatter writes one whole event per call.
        if let Some(r) = &self.0 {
            r.push(buf);
        }
        std::io::stderr().write_all(buf)?;
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Tee {
    type Writer = Tee;
    fn make_writer(&'a self) -> Tee {
        Tee(self.0.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ring_keeps_the_last_lines_cut_to_their_bound() {
        let r = LogRing::default();
        for i in 0..(LINES + 5) {
            r.push(format!("line {i}\n").as_bytes());
        }
        let t = r.tail(3);
        assert_eq!(t, ["line 202", "line 203", "line 204"]);
        assert_eq!(r.tail(10_000).len(), LINES);
        r.push("é".repeat(400).as_bytes());
        let last = r.tail(1).pop().unwrap();
        assert!(last.len() <= LINE_BYTES + '…'.len_utf8() && last.ends_with('…'));
    }
}
