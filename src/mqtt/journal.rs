//! The answer journal: the last answers published, kept in a file of the state directory, so
//! that a request the broker delivers again (its acknowledgement was lost when the daemon or
//! the connection died) is answered with the stored answer instead of being computed twice.
//!
//! A request is acknowledged to the broker only after its answer is published, and its answer
//! is written here (and synced) before it is published. So after any crash a redelivered
//! request either finds its answer here, and that answer is sent again, or was never answered
//! and is answered now. Nothing is computed twice, and a session turn is never applied twice.
//!
//! The file is append-only: `MAGIC`, then records `len:u32le crc32:u32le body`, body =
//! `key[32] topic_len:u16le topic flags:u8 corr_len:u16le corr payload_len:u32le payload`.
//! A torn or corrupt tail (power lost mid-write) is cut off at the last good record. When it
//! holds twice the entries kept, it is rewritten with the newest ones (temporary file, sync,
//! rename), so it stays bounded.

use crate::service::Health;
use bytes::Bytes;
use sha2::{Digest, Sha256};
use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::{self, BufReader, Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The file's first bytes (format version 1).
const MAGIC: &[u8; 8] = b"EDGLJNL1";
/// Answers kept for redeliveries (in memory and, at most twice that, in the file).
pub const KEPT: usize = 64;
/// A bigger answer is published but not journaled (it would be computed again if redelivered).
pub const MAX_ANSWER: usize = 1 << 20;
const CRC: crc::Crc<u32> = crc::Crc::<u32>::new(&crc::CRC_32_ISO_HDLC);

/// The identity of one delivery: its topic, payload and reply address. The broker redelivers
/// a message byte for byte, so this recognises it whether or not the request had an `id` (an
/// id the daemon generated differs on every delivery).
pub type Key = [u8; 32];

pub fn delivery_key(topic: &[u8], payload: &[u8], reply: Option<&str>, corr: Option<&[u8]>) -> Key {
    let mut h = Sha256::new();
    for part in [
        topic,
        payload,
        reply.map_or(&[][..], str::as_bytes),
        corr.unwrap_or(&[]),
    ] {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part);
    }
    // Absent and empty reply addresses differ.
    h.update([u8::from(reply.is_some()), u8::from(corr.is_some())]);
    h.finalize().into()
}

/// A final answer as it was published.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    pub topic: String,
    /// Published with MQTT 5 properties (the request named a response topic).
    pub properties: bool,
    pub correlation: Option<Bytes>,
    pub payload: Vec<u8>,
}

#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error("answer journal {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
}

/// The answers, newest last; written through to the file when there is one.
pub struct Journal {
    entries: VecDeque<(Key, Answer)>,
    file: Option<(PathBuf, File)>,
    /// Records in the file (compacted past `2 * KEPT`).
    records: usize,
    /// Whether writes work, for the daemon's status.
    health: Arc<Health>,
}

impl Journal {
    /// A journal that lives in memory only (no state directory): it covers a lost
    /// acknowledgement while the daemon runs, not a restart.
    pub fn memory() -> Journal {
        Journal {
            entries: VecDeque::new(),
            file: None,
            records: 0,
            health: Arc::default(),
        }
    }

    /// Opens (or creates) the journal at `path` and reads what it holds. A corrupt tail is cut
    /// off; a file that is not a journal is set aside as `path.bad` and a new one started.
    pub fn open(path: &Path) -> Result<Journal, JournalError> {
        let io = |source| JournalError::Io {
            path: path.to_owned(),
            source,
        };
        let mut entries = VecDeque::new();
        let mut records = 0;
        let mut good = 0u64;
        match File::open(path) {
            Ok(f) => {
                let mut r = BufReader::new(f);
                let mut magic = [0u8; 8];
                if r.read_exact(&mut magic).is_ok() && &magic == MAGIC {
                    good = MAGIC.len() as u64;
                    while let Some((len, key, answer)) = read_record(&mut r) {
                        good += len;
                        records += 1;
                        if entries.len() == KEPT {
                            entries.pop_front();
                        }
                        entries.push_back((key, answer));
                    }
                } else {
                    let bad = path.with_extension("bad");
                    tracing::warn!(path = %path.display(), "not an answer journal: set aside as {}", bad.display());
                    std::fs::rename(path, &bad).map_err(io)?;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(e)),
        }
        let mut file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        if good == 0 {
            file.set_len(0).map_err(io)?;
            file.write_all(MAGIC).map_err(io)?;
            file.sync_data().map_err(io)?;
        } else if len > good {
            tracing::warn!(path = %path.display(), cut_bytes = len - good, "answer journal: a torn or corrupt tail was cut off");
            file.set_len(good).map_err(io)?;
            file.sync_data().map_err(io)?;
        }
        // Appends go after the last good record.
        file.seek(io::SeekFrom::End(0)).map_err(io)?;
        Ok(Journal {
            entries,
            file: Some((path.to_owned(), file)),
            records,
            health: Arc::default(),
        })
    }

    /// Whether the journal's writes work (a full or read-only disk shows here).
    pub fn health(&self) -> Arc<Health> {
        Arc::clone(&self.health)
    }

    pub fn get(&self, key: &Key) -> Option<&Answer> {
        self.entries
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, a)| a)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Keeps `answer` for `key`, on disk (synced) before it returns. An answer over
    /// [`MAX_ANSWER`] is not kept.
    pub fn record(&mut self, key: Key, answer: Answer) -> Result<(), JournalError> {
        let res = self.write(key, answer);
        match &res {
            Ok(()) => {
                if self.health.ok() {
                    tracing::info!("answer journal: written again");
                }
            }
            Err(e) => {
                self.health.failed(e.to_string());
            }
        }
        res
    }

    fn write(&mut self, key: Key, answer: Answer) -> Result<(), JournalError> {
        if answer.payload.len() > MAX_ANSWER {
            return Ok(());
        }
        if self.entries.len() == KEPT {
            self.entries.pop_front();
        }
        self.entries.push_back((key, answer));
        let Some((path, file)) = &mut self.file else {
            return Ok(());
        };
        let io = |source| JournalError::Io {
            path: path.clone(),
            source,
        };
        if self.records + 1 >= 2 * KEPT {
            let fresh = rewrite(path, &self.entries).map_err(io)?;
            *file = fresh;
            self.records = self.entries.len();
            return Ok(());
        }
        let (key, answer) = self.entries.back().expect("just pushed");
        let end = file.stream_position().map_err(io)?;
        let written = file
            .write_all(&encode(key, answer))
            .and_then(|()| file.sync_data());
        if let Err(e) = written {
            // Part of the record may be in the file (the disk filled up mid-write): take it
            // back, or every record after it would be cut off as a corrupt tail at the next
            // start. The answer stays in memory.
            let _ = file
                .set_len(end)
                .and_then(|()| file.seek(io::SeekFrom::Start(end)));
            return Err(io(e));
        }
        self.records += 1;
        Ok(())
    }
}

fn encode(key: &Key, a: &Answer) -> Vec<u8> {
    let corr = a.correlation.as_deref().unwrap_or(&[]);
    // Lengths fit: topics are bounded by MQTT (u16), correlation data too, payloads by MAX_ANSWER.
    let mut body = Vec::with_capacity(48 + a.topic.len() + corr.len() + a.payload.len());
    body.extend_from_slice(key);
    body.extend_from_slice(&(a.topic.len().min(u16::MAX as usize) as u16).to_le_bytes());
    body.extend_from_slice(&a.topic.as_bytes()[..a.topic.len().min(u16::MAX as usize)]);
    body.push(u8::from(a.properties) | (u8::from(a.correlation.is_some()) << 1));
    let corr = &corr[..corr.len().min(u16::MAX as usize)];
    body.extend_from_slice(&(corr.len() as u16).to_le_bytes());
    body.extend_from_slice(corr);
    body.extend_from_slice(&(a.payload.len() as u32).to_le_bytes());
    body.extend_from_slice(&a.payload);
    let mut rec = Vec::with_capacity(8 + body.len());
    rec.extend_from_slice(&(body.len() as u32).to_le_bytes());
    rec.extend_from_slice(&CRC.checksum(&body).to_le_bytes());
    rec.extend_from_slice(&body);
    rec
}

/// The next record, with its length in the file; `None` at the end or at a bad record.
fn read_record(r: &mut impl Read) -> Option<(u64, Key, Answer)> {
    let mut head = [0u8; 8];
    r.read_exact(&mut head).ok()?;
    let len = u32::from_le_bytes(head[..4].try_into().ok()?) as usize;
    let crc = u32::from_le_bytes(head[4..].try_into().ok()?);
    // The largest body `record` writes: key, both u16-bounded strings, the payload bound.
    if len > 32 + 2 + 65_535 + 1 + 2 + 65_535 + 4 + MAX_ANSWER {
        return None;
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).ok()?;
    if CRC.checksum(&body) != crc {
        return None;
    }
    let answer = decode(&body)?;
    Some(((8 + len) as u64, answer.0, answer.1))
}

fn decode(b: &[u8]) -> Option<(Key, Answer)> {
    let mut at = 0usize;
    let mut take = |n: usize| {
        let s = b.get(at..at.checked_add(n)?)?;
        at += n;
        Some(s)
    };
    let key: Key = take(32)?.try_into().ok()?;
    let tl = u16::from_le_bytes(take(2)?.try_into().ok()?) as usize;
    let topic = String::from_utf8(take(tl)?.to_vec()).ok()?;
    let flags = take(1)?[0];
    let cl = u16::from_le_bytes(take(2)?.try_into().ok()?) as usize;
    let corr = take(cl)?;
    let correlation = (flags & 2 != 0).then(|| Bytes::copy_from_slice(corr));
    let pl = u32::from_le_bytes(take(4)?.try_into().ok()?) as usize;
    let payload = take(pl)?.to_vec();
    if at != b.len() {
        return None;
    }
    Some((
        key,
        Answer {
            topic,
            properties: flags & 1 != 0,
            correlation,
            payload,
        },
    ))
}

/// Writes `entries` to a new file that replaces `path` (temporary, sync, rename, sync the
/// directory), and returns it open for appends.
fn rewrite(path: &Path, entries: &VecDeque<(Key, Answer)>) -> io::Result<File> {
    let tmp = path.with_extension("tmp");
    let mut f = File::create(&tmp)?;
    let mut all = MAGIC.to_vec();
    for (k, a) in entries {
        all.extend_from_slice(&encode(k, a));
    }
    f.write_all(&all)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        File::open(dir)?.sync_all()?;
    }
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(n: usize) -> Answer {
        Answer {
            topic: format!("edgellm/dev/response/{n}"),
            properties: n.is_multiple_of(2),
            correlation: (!n.is_multiple_of(3)).then(|| Bytes::from(format!("c{n}"))),
            payload: format!("{{\"id\":\"{n}\",\"done\":true}}").into_bytes(),
        }
    }

    fn key(n: usize) -> Key {
        delivery_key(b"t", format!("{n}").as_bytes(), None, None)
    }

    #[test]
    fn answers_survive_a_reopen_and_the_newest_are_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("answers.journal");
        let mut j = Journal::open(&path).unwrap();
        // Past the compaction point, twice.
        for n in 0..(4 * KEPT + 3) {
            j.record(key(n), answer(n)).unwrap();
        }
        drop(j);
        let j = Journal::open(&path).unwrap();
        assert_eq!(j.len(), KEPT);
        let last = 4 * KEPT + 2;
        assert_eq!(j.get(&key(last)), Some(&answer(last)));
        assert_eq!(j.get(&key(last + 1 - KEPT)), Some(&answer(last + 1 - KEPT)));
        assert_eq!(j.get(&key(last - KEPT)), None);
        // Bounded: never more than twice the entries kept.
        let size = std::fs::metadata(&path).unwrap().len() as usize;
        assert!(size < 2 * KEPT * (8 + encode(&key(0), &answer(last)).len()));
    }

    #[test]
    fn a_torn_tail_is_cut_off_and_appends_continue_after_the_last_good_record() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("answers.journal");
        let mut j = Journal::open(&path).unwrap();
        for n in 0..5 {
            j.record(key(n), answer(n)).unwrap();
        }
        drop(j);
        let full = std::fs::read(&path).unwrap();
        for cut in [1, 7, 9, 30] {
            std::fs::write(&path, &full[..full.len() - cut]).unwrap();
            let mut j = Journal::open(&path).unwrap();
            assert_eq!(j.len(), 4, "cut {cut}");
            assert_eq!(j.get(&key(4)), None);
            j.record(key(9), answer(9)).unwrap();
            drop(j);
            let j = Journal::open(&path).unwrap();
            assert_eq!(j.len(), 5, "cut {cut}");
            assert_eq!(j.get(&key(9)), Some(&answer(9)));
            assert_eq!(j.get(&key(3)), Some(&answer(3)));
        }
    }

    #[test]
    fn a_flipped_byte_ends_the_journal_there() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("answers.journal");
        let mut j = Journal::open(&path).unwrap();
        for n in 0..3 {
            j.record(key(n), answer(n)).unwrap();
        }
        drop(j);
        let mut bytes = std::fs::read(&path).unwrap();
        let second = MAGIC.len() + 8 + (encode(&key(0), &answer(0)).len() - 8) + 20;
        bytes[second] ^= 0x40;
        std::fs::write(&path, &bytes).unwrap();
        let j = Journal::open(&path).unwrap();
        assert_eq!(j.len(), 1);
        assert_eq!(j.get(&key(0)), Some(&answer(0)));
    }

    #[test]
    fn a_file_that_is_not_a_journal_is_set_aside() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("answers.journal");
        std::fs::write(&path, b"something else entirely").unwrap();
        let j = Journal::open(&path).unwrap();
        assert!(j.is_empty());
        assert!(path.with_extension("bad").exists());
        // A hostile length does not allocate gigabytes.
        let mut bytes = MAGIC.to_vec();
        bytes.extend_from_slice(&u32::MAX.to_le_bytes());
        bytes.extend_from_slice(&[0; 4]);
        std::fs::write(&path, &bytes).unwrap();
        assert!(Journal::open(&path).unwrap().is_empty());
    }

    #[test]
    fn the_key_tells_deliveries_apart_by_every_part() {
        let base = delivery_key(b"t", b"p", Some("r"), Some(b"c"));
        assert_eq!(base, delivery_key(b"t", b"p", Some("r"), Some(b"c")));
        for other in [
            delivery_key(b"u", b"p", Some("r"), Some(b"c")),
            delivery_key(b"t", b"q", Some("r"), Some(b"c")),
            delivery_key(b"t", b"p", None, Some(b"c")),
            delivery_key(b"t", b"p", Some(""), Some(b"c")),
            delivery_key(b"t", b"p", Some("r"), None),
            delivery_key(b"t", b"p", Some("r"), Some(b"d")),
            // Lengths are part of it: parts cannot shift into each other.
            delivery_key(b"tp", b"", Some("r"), Some(b"c")),
        ] {
            assert_ne!(base, other);
        }
    }
}
