//! A conversation log on flash: open it (cutting a torn or corrupt tail back to the last
//! whole record), append a record and sync it, or rewrite it whole as one record (a temporary
//! file, `fsync`, `rename`, `fsync` of the directory). Once [`ConversationFile::append`]
//! returns, a power cut keeps the record: a turn is acknowledged only after that.

use super::{Conversation, MAGIC, Record, Tail, decode, encode, header};
use crate::engine::store::StoreError;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

/// The longest log read: a longer file is no log this build wrote (the store compacts far
/// below it), and is set aside rather than read into memory.
pub const MAX_FILE: u64 = 64 << 20;

/// The conversation logged at `path`, read without changing the file (a torn tail is left for
/// the daemon's next open to cut): `None` when there is no log, or the file is no log this
/// build wrote (as opening would treat it). For reading beside a daemon that appends to it.
pub fn read(path: &Path) -> Result<Option<Conversation>, StoreError> {
    match std::fs::metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(path)(e)),
        Ok(m) if m.len() > MAX_FILE => return Ok(None),
        Ok(_) => {}
    }
    let bytes = std::fs::read(path).map_err(io(path))?;
    Ok(decode(&bytes).ok().map(|d| d.conversation))
}

/// What opening found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Opened {
    /// The tail cut back to the last whole record, if it was not clean.
    pub cut: Option<Tail>,
    /// Where a file that was no conversation log went (`<file>.bad`).
    pub set_aside: Option<PathBuf>,
}

/// One session's conversation log, open for appending.
#[derive(Debug)]
pub struct ConversationFile {
    path: PathBuf,
    file: File,
    len: u64,
    conversation: Conversation,
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> StoreError + '_ {
    move |source| StoreError::File {
        file: path.to_owned(),
        source,
    }
}

impl ConversationFile {
    /// Opens the log at `path`, or begins one. A torn or corrupt tail is cut off (and synced)
    /// so that the next record follows the last whole one; a file that is not a log is set
    /// aside as `<file>.bad`.
    pub fn open(path: &Path) -> Result<(ConversationFile, Opened), StoreError> {
        let mut opened = Opened::default();
        let mut found = None;
        match File::open(path) {
            Ok(mut f) => {
                let len = f.metadata().map_err(io(path))?.len();
                let mut bytes = Vec::new();
                if len <= MAX_FILE {
                    f.read_to_end(&mut bytes).map_err(io(path))?;
                }
                match decode(&bytes) {
                    Ok(d) if len <= MAX_FILE => found = Some(d),
                    _ => {
                        let mut bad = path.as_os_str().to_owned();
                        bad.push(".bad");
                        let bad = PathBuf::from(bad);
                        std::fs::rename(path, &bad).map_err(io(path))?;
                        tracing::warn!(file = %path.display(), "not a conversation log: set aside as {}", bad.display());
                        opened.set_aside = Some(bad);
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(path)(e)),
        }
        let Some(d) = found else {
            // Whole or not there at all: a crash mid-way leaves no file, or a file without
            // records, both of which read as an empty conversation.
            crate::kv::file::replace_file(path, &header()).map_err(|e| StoreError::File {
                file: path.to_owned(),
                source: std::io::Error::other(e),
            })?;
            let file = OpenOptions::new()
                .append(true)
                .open(path)
                .map_err(io(path))?;
            let c = ConversationFile {
                path: path.to_owned(),
                file,
                len: MAGIC.len() as u64,
                conversation: Conversation::default(),
            };
            return Ok((c, opened));
        };
        let file = OpenOptions::new()
            .append(true)
            .open(path)
            .map_err(io(path))?;
        if d.tail != Tail::Clean {
            tracing::warn!(file = %path.display(), tail = ?d.tail, "conversation log: cut back to its last whole record");
            file.set_len(d.good_len as u64).map_err(io(path))?;
            file.sync_data().map_err(io(path))?;
            opened.cut = Some(d.tail);
        }
        let c = ConversationFile {
            path: path.to_owned(),
            file,
            len: d.good_len as u64,
            conversation: d.conversation,
        };
        Ok((c, opened))
    }

    pub fn conversation(&self) -> &Conversation {
        &self.conversation
    }

    /// Bytes of the log.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len <= MAGIC.len() as u64
    }

    /// Appends `r` and syncs it; then applies it. On an error the conversation is as before
    /// (a partial write is cut at the next open).
    pub fn append(&mut self, r: Record) -> Result<(), StoreError> {
        let bytes = encode(&r);
        let path = &self.path;
        self.file
            .write_all(&bytes)
            .and_then(|_| self.file.sync_data())
            .map_err(io(path))?;
        self.len += bytes.len() as u64;
        self.conversation.apply(r);
        Ok(())
    }

    /// Rewrites the log as one record holding the conversation, atomically: the file's size
    /// becomes the conversation's own. A crash leaves the old log or the new one.
    pub fn compact(&mut self) -> Result<(), StoreError> {
        let c = &self.conversation;
        let mut bytes = header().to_vec();
        bytes.extend_from_slice(&encode(&Record::Replace {
            system: c.system.clone(),
            messages: c.messages.clone(),
            turns: c.turns,
        }));
        let path = &self.path;
        crate::kv::file::replace_file(path, &bytes).map_err(|e| StoreError::File {
            file: path.clone(),
            source: std::io::Error::other(e),
        })?;
        self.file = OpenOptions::new()
            .append(true)
            .open(path)
            .map_err(io(path))?;
        self.len = bytes.len() as u64;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn turn(n: usize) -> Record {
        Record::Turn {
            user: format!("question {n}"),
            answer: format!("answer {n}"),
        }
    }

    #[test]
    fn appended_turns_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.conv");
        let (mut f, opened) = ConversationFile::open(&path).unwrap();
        assert_eq!(opened, Opened::default());
        assert!(f.is_empty());
        for n in 0..3 {
            f.append(turn(n)).unwrap();
        }
        let want = f.conversation().clone();
        drop(f);
        let (f, opened) = ConversationFile::open(&path).unwrap();
        assert_eq!((f.conversation(), opened), (&want, Opened::default()));
        assert_eq!(f.conversation().turns, 3);
    }

    #[test]
    fn a_file_cut_at_every_byte_of_its_last_record_keeps_the_turns_before_and_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.conv");
        let (mut f, _) = ConversationFile::open(&path).unwrap();
        f.append(turn(1)).unwrap();
        let (before, one_turn) = (f.len(), f.conversation().clone());
        f.append(turn(2)).unwrap();
        drop(f);
        let whole = std::fs::read(&path).unwrap();
        for cut in before as usize..whole.len() {
            std::fs::write(&path, &whole[..cut]).unwrap();
            let (mut f, opened) = ConversationFile::open(&path).unwrap();
            assert_eq!(f.conversation(), &one_turn, "cut at {cut}");
            let torn = cut - before as usize;
            let want = (torn > 0).then_some(Tail::Torn { bytes: torn });
            assert_eq!(opened.cut, want, "cut at {cut}");
            assert_eq!(std::fs::metadata(&path).unwrap().len(), before);
            // The next turn follows the last whole one.
            f.append(turn(3)).unwrap();
            drop(f);
            let (f, opened) = ConversationFile::open(&path).unwrap();
            assert_eq!(
                (f.conversation().turns, opened.cut),
                (2, None),
                "cut at {cut}"
            );
            assert_eq!(f.conversation().messages[3].content, "answer 3");
        }
    }

    #[test]
    fn a_file_that_is_not_a_log_is_set_aside_and_a_new_one_begun() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.conv");
        std::fs::write(&path, b"EDGEKV\0\0 not a conversation").unwrap();
        let (f, opened) = ConversationFile::open(&path).unwrap();
        assert!(f.is_empty());
        let bad = opened.set_aside.expect("set aside");
        assert_eq!(
            std::fs::read(bad).unwrap(),
            b"EDGEKV\0\0 not a conversation"
        );
        assert_eq!(std::fs::read(&path).unwrap(), MAGIC);
    }

    #[test]
    fn compaction_keeps_the_conversation_in_one_record_and_appends_go_on_after_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.conv");
        let (mut f, _) = ConversationFile::open(&path).unwrap();
        f.append(Record::Replace {
            system: Some("Be brief.".into()),
            messages: vec![],
            turns: 0,
        })
        .unwrap();
        for n in 0..20 {
            f.append(turn(n)).unwrap();
        }
        f.append(Record::Drop(30)).unwrap();
        let (long, want) = (f.len(), f.conversation().clone());
        f.compact().unwrap();
        assert!(f.len() < long, "{} !< {long}", f.len());
        assert_eq!(std::fs::metadata(&path).unwrap().len(), f.len());
        f.append(turn(20)).unwrap();
        drop(f);
        let (f, _) = ConversationFile::open(&path).unwrap();
        let c = f.conversation();
        assert_eq!(c.system, want.system);
        assert_eq!(c.messages[..10], want.messages[..]);
        assert_eq!(c.messages.len(), 12);
        assert_eq!(c.turns, 21, "turn numbers go on across a compaction");
        // No temporary file is left behind.
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["s.conv"]);
    }
}
