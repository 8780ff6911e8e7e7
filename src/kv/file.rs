//! A session's KV snapshot on flash: restore from it, append a turn (only the new positions,
//! then `fdatasync`), or rewrite it whole (a temporary file, `fsync`, `rename`, `fsync` of the
//! directory) when the session was rewound. See `docs/kv-format.md` for the crash-safety
//! argument.

use super::KvCache;
use super::snapshot::{self, Fault, Geometry, HEADER_LEN, KvError, Parsed, TornTail};
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// Largest file a snapshot of `g` can be: every position in its own record, plus one torn
/// record's worth of trailing bytes.
fn max_file_len(g: &Geometry) -> u64 {
    let n = g.n_ctx as u64;
    let per_record = snapshot::record_len(g, 1, 1).unwrap_or(u64::MAX);
    g.kv_bytes(n)
        .and_then(|kv| kv.checked_add(n.checked_mul(per_record - g.kv_bytes(1)?)?))
        .and_then(|x| x.checked_mul(2))
        .and_then(|x| x.checked_add(HEADER_LEN as u64))
        .unwrap_or(u64::MAX)
}

/// Most positions in one record we write: a restore reads one record at a time, so this bounds
/// its memory (SmolLM2-135M, f16: 256 × 23 KiB = 5.6 MiB).
pub const MAX_RECORD_POSITIONS: usize = 256;

fn too_long(len: u64, max: u64) -> KvError {
    KvError::Invalid {
        section: "file",
        offset: max,
        why: format!("{len} bytes is more than any snapshot of this shape can hold ({max})"),
    }
}

/// Opens the snapshot at `path` and reads its header: the file (positioned after the header),
/// its length, the header's bytes and the geometry they give.
fn open_header(path: &Path) -> Result<(File, u64, Vec<u8>, Geometry), KvError> {
    let io = |e| KvError::io(path, e);
    let mut f = File::open(path).map_err(io)?;
    let len = f.metadata().map_err(io)?.len();
    let mut head = vec![0u8; HEADER_LEN.min(len as usize)];
    f.read_exact(&mut head).map_err(io)?;
    let g = snapshot::decode_header(&head)?;
    Ok((f, len, head, g))
}

/// Reads and parses a snapshot file (checks everything but which model it belongs to).
pub fn read(path: &Path) -> Result<(Vec<u8>, Parsed), KvError> {
    let io = |e| KvError::io(path, e);
    let (mut f, len, head, g) = open_header(path)?;
    let max = max_file_len(&g);
    if len > max {
        return Err(too_long(len, max));
    }
    let mut bytes = head;
    bytes.reserve_exact((len as usize).saturating_sub(HEADER_LEN));
    f.read_to_end(&mut bytes).map_err(io)?;
    let parsed = snapshot::parse(&bytes)?;
    Ok((bytes, parsed))
}

/// The tokens of a snapshot that cannot be restored (see [`snapshot::salvage_tokens`]), if it
/// was made for `want`: feed them to recompute the conversation. Empty when nothing is
/// salvageable or the file belongs to another model or shape.
pub fn salvage_tokens(path: &Path, want: &Geometry) -> Vec<u32> {
    let fits = std::fs::metadata(path).is_ok_and(|m| m.len() <= max_file_len(want));
    let Some(bytes) = fits.then(|| std::fs::read(path).ok()).flatten() else {
        return Vec::new();
    };
    match snapshot::salvage_tokens(&bytes) {
        Some((g, tokens)) if g.check_matches(want).is_ok() => tokens,
        _ => Vec::new(),
    }
}

/// What [`SnapshotFile::save`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case", tag = "write")]
pub enum SaveKind {
    /// The file already held these tokens.
    Unchanged,
    /// One record of the new positions was appended.
    Appended {
        #[serde(rename = "positions_written")]
        positions: usize,
        #[serde(rename = "bytes_written")]
        bytes: u64,
    },
    /// The file was rewritten whole (new file, or the session no longer extends it).
    Rewritten {
        #[serde(rename = "positions_written")]
        positions: usize,
        #[serde(rename = "bytes_written")]
        bytes: u64,
    },
}

/// The snapshot file of one session: the tokens it holds and where its next record goes.
#[derive(Debug)]
pub struct SnapshotFile {
    path: PathBuf,
    geometry: Geometry,
    /// Tokens the file holds (positions `0..tokens.len()`).
    tokens: Vec<u32>,
    /// End of the last complete record, when the file exists with our header.
    valid_len: Option<u64>,
}

impl SnapshotFile {
    /// A snapshot at `path` for a cache of shape `geometry`; nothing is read or written yet.
    pub fn new(path: impl Into<PathBuf>, geometry: Geometry) -> SnapshotFile {
        SnapshotFile {
            path: path.into(),
            geometry,
            tokens: Vec::new(),
            valid_len: None,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
    /// The cache shape this snapshot is for.
    pub fn geometry(&self) -> &Geometry {
        &self.geometry
    }
    /// Tokens the file holds.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Restores the file's positions into `kv` (which must have this snapshot's layers, width
    /// and type, and a context no longer than the file's) and
    /// returns the torn tail that was dropped, if any. A missing file restores nothing. The file
    /// is streamed one record at a time (at most [`MAX_RECORD_POSITIONS`] positions for the
    /// files we write), so a restore needs little memory beyond the cache. On error `kv` may
    /// hold some rows but no tokens are claimed: the caller starts empty.
    pub fn load(&mut self, kv: &mut KvCache) -> Result<Option<TornTail>, KvError> {
        self.tokens.clear();
        self.valid_len = None;
        if !self.path.exists() {
            return Ok(None);
        }
        // The cache may be shorter than the file's context (a cached prefix holds only its
        // own positions); rows past its end are refused below. A version 1 file holds every
        // row: it fits a cache with any window.
        let (cache_shape, cache_ctx) = ((kv.n_layer(), kv.kv_dim(), kv.ty()), kv.n_ctx());
        let cache_window = kv.window();
        let mut version = 0;
        let cache_fits = |g: &Geometry| {
            version = g.version;
            if cache_shape != (g.n_layer as usize, g.kv_dim as usize, g.dtype)
                || cache_ctx > g.n_ctx as usize
                || (g.version > 1 && g.window != cache_window)
            {
                return Err(KvError::Mismatch {
                    field: "cache shape",
                    file: format!("{:?}", (g.n_layer, g.kv_dim, g.dtype, g.n_ctx)),
                    expected: format!("{:?}", (cache_shape, cache_ctx)),
                });
            }
            Ok(())
        };
        let mut tokens = Vec::new();
        let walked = walk(&self.path, &self.geometry, cache_fits, |rec, bytes| {
            let (first, n) = (rec.info.first as usize, rec.info.count as usize);
            let rows = &bytes[rec.info.kv.clone()];
            if !kv.read_rows(first, n, rec.info.window_rows as usize, rows) {
                return Err(KvError::Invalid {
                    section: "record K/V rows",
                    offset: rec.info.offset,
                    why: "rows do not fit the cache".into(),
                });
            }
            tokens.extend_from_slice(&rec.tokens);
            Ok(())
        })?;
        if !kv.can_keep(tokens.len()) {
            // `walk` refuses such a file unless its last record was torn off: a turn of
            // several records, cut after some, whose sliding-window rows were in the records
            // lost. Nothing can be restored; the caller recomputes from the salvaged tokens
            // and the next save rewrites the file.
            return Ok(walked.torn);
        }
        self.tokens = tokens;
        // A file of an older version is rewritten whole at the next save, not appended to.
        self.valid_len = (version == snapshot::VERSION).then_some(walked.valid_len);
        Ok(walked.torn)
    }

    /// Saves `tokens` (whose K/V rows `kv` holds at positions `0..tokens.len()`): appends the
    /// positions the file lacks when it holds a prefix of `tokens`, else rewrites it whole. On
    /// error the file still holds its previous state (a partly written record is cut off, or
    /// at worst dropped as a torn tail on the next load).
    pub fn save(&mut self, kv: &KvCache, tokens: &[u32]) -> Result<SaveKind, KvError> {
        if tokens.len() > kv.n_ctx() {
            return Err(KvError::Invalid {
                section: "session",
                offset: 0,
                why: format!(
                    "{} tokens exceed the context of {}",
                    tokens.len(),
                    kv.n_ctx()
                ),
            });
        }
        match self.valid_len {
            // A file without positions is rewritten, not appended to: the record of position 0
            // is always written whole (a reader takes a fault in it for corruption, never for
            // a torn append).
            Some(end) if !self.tokens.is_empty() && tokens.starts_with(&self.tokens) => {
                if tokens.len() == self.tokens.len() {
                    return Ok(SaveKind::Unchanged);
                }
                self.append(kv, tokens, end)
            }
            _ => self.rewrite(kv, tokens),
        }
    }

    /// Writes the records of positions `first..tokens.len()` to `w`, at most
    /// [`MAX_RECORD_POSITIONS`] each (bounded memory, and bounded records to read back);
    /// returns the bytes written.
    fn write_records(
        &self,
        kv: &KvCache,
        tokens: &[u32],
        first: usize,
        w: &mut impl Write,
    ) -> std::io::Result<u64> {
        let (mut rows, mut rec) = (Vec::new(), Vec::new());
        let mut bytes = 0;
        let mut a = first;
        while a < tokens.len() {
            let b = (a + MAX_RECORD_POSITIONS).min(tokens.len());
            rows.clear();
            rec.clear();
            let window_rows = kv.write_rows(a..b, &mut rows) as u32;
            let t = &tokens[a..b];
            snapshot::encode_record(&self.geometry, a as u32, t, window_rows, &rows, &mut rec);
            w.write_all(&rec)?;
            bytes += rec.len() as u64;
            a = b;
        }
        Ok(bytes)
    }

    fn append(&mut self, kv: &KvCache, tokens: &[u32], end: u64) -> Result<SaveKind, KvError> {
        let first = self.tokens.len();
        let io = |e| KvError::io(&self.path, e);
        let mut f = OpenOptions::new()
            .write(true)
            .open(&self.path)
            .map_err(io)?;
        let written = (|| {
            // Cut off a torn tail left by an earlier interrupted append.
            if f.metadata()?.len() != end {
                f.set_len(end)?;
            }
            f.seek(SeekFrom::Start(end))?;
            let n = self.write_records(kv, tokens, first, &mut f)?;
            f.sync_data()?;
            Ok(n)
        })();
        let bytes = match written {
            Ok(n) => n,
            Err(e) => {
                // Best effort: leave the file at its last complete record.
                let _ = f.set_len(end).and_then(|_| f.sync_data());
                return Err(io(e));
            }
        };
        self.tokens.extend_from_slice(&tokens[first..]);
        self.valid_len = Some(end + bytes);
        Ok(SaveKind::Appended {
            positions: tokens.len() - first,
            bytes,
        })
    }

    fn rewrite(&mut self, kv: &KvCache, tokens: &[u32]) -> Result<SaveKind, KvError> {
        let header = snapshot::encode_header(&self.geometry);
        let bytes = replace_file_with(&self.path, |f| {
            f.write_all(&header)?;
            Ok(HEADER_LEN as u64 + self.write_records(kv, tokens, 0, f)?)
        })?;
        self.tokens = tokens.to_vec();
        self.valid_len = Some(bytes);
        Ok(SaveKind::Rewritten {
            positions: tokens.len(),
            bytes,
        })
    }
}

/// Replaces `path` by `bytes` atomically: a temporary file in the same directory, `fsync`,
/// `rename` over `path`, `fsync` of the directory. A crash leaves the old or the new file.
pub fn replace_file(path: &Path, bytes: &[u8]) -> Result<(), KvError> {
    replace_file_with(path, |f| f.write_all(bytes).map(|_| bytes.len() as u64)).map(|_| ())
}

/// As [`replace_file`], with the contents written by `write` (which returns their length).
pub fn replace_file_with(
    path: &Path,
    write: impl FnOnce(&mut File) -> std::io::Result<u64>,
) -> Result<u64, KvError> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = path.file_name().ok_or_else(|| KvError::Invalid {
        section: "path",
        offset: 0,
        why: format!("{} names no file", path.display()),
    })?;
    let mut tmp_name = name.to_os_string();
    tmp_name.push(format!(".tmp-{}", std::process::id()));
    let tmp = dir.join(tmp_name);
    let result = (|| {
        let mut f = File::create(&tmp).map_err(|e| KvError::io(&tmp, e))?;
        let n = write(&mut f)
            .and_then(|n| f.sync_all().map(|_| n))
            .map_err(|e| KvError::io(&tmp, e))?;
        drop(f);
        std::fs::rename(&tmp, path).map_err(|e| KvError::io(path, e))?;
        sync_dir(&dir)?;
        Ok(n)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

fn sync_dir(dir: &Path) -> Result<(), KvError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| KvError::io(dir, e))
}

/// Where [`walk`] stopped.
struct Walked {
    /// End of the last complete record.
    valid_len: u64,
    torn: Option<TornTail>,
}

/// Reads the snapshot at `path` (made for `want`) one record at a time, checking each, and
/// hands each complete record and its bytes to `on_record` (after `on_header` has accepted the
/// file's header); stops at a torn tail. Memory is one record (at most
/// [`MAX_RECORD_POSITIONS`] positions for the files we write), never the file.
fn walk(
    path: &Path,
    want: &Geometry,
    on_header: impl FnOnce(&Geometry) -> Result<(), KvError>,
    mut on_record: impl FnMut(&snapshot::Rec, &[u8]) -> Result<(), KvError>,
) -> Result<Walked, KvError> {
    let io = |e| KvError::io(path, e);
    let (mut f, len, mut buf, g) = open_header(path)?;
    g.check_matches(want)?;
    on_header(&g)?;
    let max = max_file_len(&g);
    if len > max {
        return Err(too_long(len, max));
    }
    let mut have = 0usize;
    let mut at = g.header_len() as u64;
    // A version 1 header is shorter than what `open_header` read.
    f.seek(SeekFrom::Start(at)).map_err(io)?;
    let mut window_from = 0;
    let mut torn = None;
    while at < len {
        let rest = len - at;
        let head = (g.record_header_len() as u64).min(rest) as usize;
        buf.clear();
        buf.resize(head, 0);
        f.read_exact(&mut buf).map_err(io)?;
        let extent = snapshot::record_extent(&g, &buf, rest) as usize;
        // Read the rest into spare capacity (no zero-fill of megabytes first).
        let want = extent.max(head) - head;
        buf.reserve(want);
        let got = (&mut f)
            .take(want as u64)
            .read_to_end(&mut buf)
            .map_err(io)?;
        if got != want {
            return Err(io(std::io::ErrorKind::UnexpectedEof.into()));
        }
        match snapshot::check_record(&g, &buf, at, rest, have) {
            Ok(mut rec) => {
                rec.info.offset = at;
                on_record(&rec, &buf)?;
                have += rec.tokens.len();
                at += rec.end as u64;
                window_from = snapshot::window_from_after(window_from, &rec.info);
            }
            Err(Fault::Torn(reason)) => {
                torn = Some(TornTail {
                    offset: at,
                    bytes: rest,
                    reason,
                });
                break;
            }
            Err(Fault::Corrupt(e)) => return Err(e),
        }
    }
    // As `snapshot::parse`: a short window is damage unless a torn tail explains it.
    if torn.is_none() && !g.window_covers(window_from, have) {
        return Err(snapshot::window_short(&g, window_from, have));
    }
    Ok(Walked {
        valid_len: at,
        torn,
    })
}

/// Checks the snapshot at `path` (made for `want`: every checksum, one record in memory at a
/// time) and cuts a torn tail off, so that the file ends at its last complete record: a turn
/// whose save a power cut interrupted was never acknowledged, and the file is left as
/// `edgellm kv verify` passes it. Returns the tail cut, if any. A file for another shape, or
/// damaged before its end, is left as it is and the error says why (loading it moves it aside
/// and salvages its tokens).
pub fn cut_torn_tail(path: &Path, want: &Geometry) -> Result<Option<TornTail>, KvError> {
    let walked = walk(path, want, |_| Ok(()), |_, _| Ok(()))?;
    if walked.torn.is_some() {
        let io = |e| KvError::io(path, e);
        let f = OpenOptions::new().write(true).open(path).map_err(io)?;
        f.set_len(walked.valid_len).map_err(io)?;
        f.sync_data().map_err(io)?;
    }
    Ok(walked.torn)
}

/// Moves a bad snapshot aside to `<path>.corrupt-<unix seconds>[-n]` (keeping it for a post-mortem
/// without loading it again) and returns the new name.
pub fn move_aside(path: &Path) -> Result<PathBuf, KvError> {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    // Never overwrite an earlier bad file: `.corrupt-<secs>`, else `.corrupt-<secs>-<n>`.
    let name = |n: u32| {
        let mut s = path.as_os_str().to_os_string();
        s.push(match n {
            0 => format!(".corrupt-{secs}"),
            n => format!(".corrupt-{secs}-{n}"),
        });
        PathBuf::from(s)
    };
    let to = (0..1000)
        .map(name)
        .find(|p| !p.exists())
        .unwrap_or_else(|| name(1000));
    std::fs::rename(path, &to).map_err(|e| KvError::io(path, e))?;
    if let Some(d) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        sync_dir(d)?;
    }
    Ok(to)
}

/// Takes an exclusive advisory lock (`flock`) on `path`, creating it if needed, without
/// waiting: `Ok(Some)` holds it until dropped; `Ok(None)` when the file can be neither created
/// nor opened (a read-only directory: nothing will be written there anyway); an error of kind
/// `WouldBlock` when another process holds it.
pub fn try_lock(path: &Path) -> std::io::Result<Option<nix::fcntl::Flock<File>>> {
    use nix::fcntl::{Flock, FlockArg};
    let f = match OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
    {
        Ok(f) => f,
        Err(_) => match File::open(path) {
            Ok(f) => f,
            Err(_) => return Ok(None),
        },
    };
    Flock::lock(f, FlockArg::LockExclusiveNonblock)
        .map(Some)
        .map_err(|(_, e)| std::io::Error::from(e))
}
