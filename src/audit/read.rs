//! Reading the trail back: its segments, its entries, and the check of its chain.

use super::{AuditError, Entry, GENESIS, MAX_LINE};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// One file of the trail: `audit/<number, 8 digits>.jsonl`.
#[derive(Clone, Debug)]
pub struct Segment {
    pub number: u64,
    pub path: PathBuf,
    /// Bytes (up to its last whole line, once opened for writing).
    pub len: u64,
}

pub fn segment_name(n: u64) -> String {
    format!("{n:08}.jsonl")
}

/// The segments of `dir`, oldest first (other files are not the trail's and are left alone).
pub fn segments(dir: &Path) -> Result<Vec<Segment>, AuditError> {
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(AuditError::io(dir, e)),
    };
    let mut out = Vec::new();
    for ent in rd {
        let ent = ent.map_err(|e| AuditError::io(dir, e))?;
        let name = ent.file_name();
        let Some(stem) = name.to_str().and_then(|n| n.strip_suffix(".jsonl")) else {
            continue;
        };
        if stem.len() != 8 || !stem.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let len = ent
            .metadata()
            .map_err(|e| AuditError::io(&ent.path(), e))?
            .len();
        out.push(Segment {
            number: stem.parse().unwrap_or(0),
            path: ent.path(),
            len,
        });
    }
    out.sort_by_key(|s| s.number);
    Ok(out)
}

/// The end of the newest segment, as the writer needs it.
pub struct Tail {
    /// Bytes up to the end of the last whole line.
    pub good_len: u64,
    /// Bytes after it (a line cut short).
    pub torn: u64,
    /// The last whole line's sequence number and stated hash, when it has them.
    pub last: Option<(u64, String)>,
}

/// Reads the end of `path`: where its last whole line ends and what it says.
pub fn last_entry(path: &Path) -> Result<Tail, AuditError> {
    let mut f = std::fs::File::open(path).map_err(|e| AuditError::io(path, e))?;
    let len = f.metadata().map_err(|e| AuditError::io(path, e))?.len();
    // The last line is at most MAX_LINE: read no more than that from the end.
    let from = len.saturating_sub(MAX_LINE as u64 + 1);
    f.seek(SeekFrom::Start(from))
        .map_err(|e| AuditError::io(path, e))?;
    let mut buf = Vec::new();
    f.read_to_end(&mut buf)
        .map_err(|e| AuditError::io(path, e))?;
    let Some(nl) = buf.iter().rposition(|&b| b == b'\n') else {
        return Ok(Tail {
            good_len: from,
            torn: len - from,
            last: None,
        });
    };
    let good_len = from + nl as u64 + 1;
    let start = buf[..nl]
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(0, |p| p + 1);
    Ok(Tail {
        good_len,
        torn: len - good_len,
        last: stated(&buf[start..nl]),
    })
}

/// A line's `seq` and stated `hash`, read without checking it (to continue a chain after a
/// damaged entry: `verify` names that one).
fn stated(line: &[u8]) -> Option<(u64, String)> {
    #[derive(serde::Deserialize)]
    struct SeqHash {
        seq: u64,
        hash: String,
    }
    let v: SeqHash = serde_json::from_slice(line).ok()?;
    Some((v.seq, v.hash))
}

/// One line of the trail as read: where it is, and its entry or why it is none.
pub struct Line {
    pub file: PathBuf,
    /// 1-based line number in `file`.
    pub line: usize,
    pub entry: Result<(Entry, String), String>,
}

/// Calls `f` with every line of the trail in `dir`, oldest first; stops early when `f`
/// returns `false`. A line without its newline at the very end is given as an error.
pub fn each_line(dir: &Path, mut f: impl FnMut(Line) -> bool) -> Result<(), AuditError> {
    for seg in segments(dir)? {
        let file = std::fs::File::open(&seg.path).map_err(|e| AuditError::io(&seg.path, e))?;
        let mut r = BufReader::new(file);
        let mut buf = Vec::new();
        let mut n = 0;
        loop {
            buf.clear();
            let got = (&mut r)
                .take(MAX_LINE as u64 + 1)
                .read_until(b'\n', &mut buf)
                .map_err(|e| AuditError::io(&seg.path, e))?;
            if got == 0 {
                break;
            }
            n += 1;
            let entry = if buf.last() != Some(&b'\n') {
                if buf.len() > MAX_LINE {
                    Err(format!("a line longer than {MAX_LINE} bytes"))
                } else {
                    Err(format!(
                        "an incomplete line of {} bytes (a write cut by power loss, or the file \
                         was cut)",
                        buf.len()
                    ))
                }
            } else {
                super::unseal(&buf[..buf.len() - 1])
            };
            let long = buf.len() > MAX_LINE;
            let go_on = f(Line {
                file: seg.path.clone(),
                line: n,
                entry,
            });
            if !go_on {
                return Ok(());
            }
            if long {
                // The rest of an over-long line is not read into memory either.
                break;
            }
        }
    }
    Ok(())
}

/// What `verify` found.
#[derive(Debug, serde::Serialize)]
pub struct Verdict {
    /// Entries whose chain checked.
    pub entries: u64,
    /// The oldest entry kept (entries before it were rotated out).
    pub first_seq: Option<u64>,
    pub last_seq: Option<u64>,
    /// Torn tails cut by the daemon, as its entries note them.
    pub tails_cut: u64,
    /// The first bad entry, when there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bad: Option<Bad>,
}

/// Where the chain breaks.
#[derive(Debug, serde::Serialize)]
pub struct Bad {
    pub file: PathBuf,
    pub line: usize,
    /// The entry's sequence number where it can be read, else the one it should have.
    pub seq: u64,
    pub reason: String,
}

/// Checks every entry's hash, its sequence number and its link to the one before; stops at the
/// first bad one.
pub fn verify(dir: &Path) -> Result<Verdict, AuditError> {
    let mut v = Verdict {
        entries: 0,
        first_seq: None,
        last_seq: None,
        tails_cut: 0,
        bad: None,
    };
    let mut prev: Option<(u64, String)> = None;
    each_line(dir, |l| {
        let expect = prev.as_ref().map_or(1, |(s, _)| s + 1);
        let fail = |reason: String, seq: u64| Bad {
            file: l.file.clone(),
            line: l.line,
            seq,
            reason,
        };
        let (e, hash) = match l.entry {
            Ok(x) => x,
            Err(reason) => {
                v.bad = Some(fail(reason, expect));
                return false;
            }
        };
        let broken = match &prev {
            // The oldest entry kept: its predecessor may have been rotated out, but the very
            // first entry names no predecessor.
            None if e.seq == 1 && e.prev != GENESIS => {
                Some("the first entry names a predecessor".to_owned())
            }
            None => None,
            Some((s, _)) if e.seq != s + 1 => Some(format!(
                "follows entry {s}: {}",
                if e.seq > s + 1 {
                    format!("entries {} to {} are missing", s + 1, e.seq - 1)
                } else {
                    "its sequence number goes back".to_owned()
                }
            )),
            Some((s, h)) if &e.prev != h => Some(format!(
                "its prev is not entry {s}'s hash: an entry before it was replaced"
            )),
            Some(_) => None,
        };
        if let Some(reason) = broken {
            v.bad = Some(fail(reason, e.seq));
            return false;
        }
        v.entries += 1;
        v.first_seq.get_or_insert(e.seq);
        v.last_seq = Some(e.seq);
        v.tails_cut += u64::from(e.tail_cut.is_some());
        prev = Some((e.seq, hash));
        true
    })?;
    Ok(v)
}

/// The entry with sequence number `seq`, and its hash.
pub fn find(dir: &Path, seq: u64) -> Result<(Entry, String), AuditError> {
    let mut found = None;
    let mut damaged = None;
    each_line(dir, |l| match l.entry {
        Ok((e, h)) if e.seq == seq => {
            found = Some((e, h));
            false
        }
        Ok(_) => true,
        Err(reason) => {
            damaged.get_or_insert(format!("{} line {}: {reason}", l.file.display(), l.line));
            true
        }
    })?;
    found.ok_or_else(|| {
        AuditError::Bad(match damaged {
            Some(d) => format!(
                "no readable entry {seq} in {} (damaged: {d})",
                dir.display()
            ),
            None => format!("no entry {seq} in {}", dir.display()),
        })
    })
}
