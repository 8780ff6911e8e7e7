//! A session's KV snapshot on flash: restore from it, append a turn (only the new positions,
//! then `fdatasync`), or rewrite it whole (a temporary file, `fsync`, `rename`, `fsync` of the
//! directory) when the session was rewound. See `docs/kv-format.md` for the crash-safety
//! argument.

use super::KvCache;
use super::snapshot::{self, Geometry, HEADER_LEN, KvError, Parsed, TornTail};
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// Largest file a snapshot of `g` can be: every position in its own record, plus one torn
/// record's worth of trailing bytes.
fn max_file_len(g: &Geometry) -> u64 {
    let n = g.n_ctx as u64;
    let per_record = snapshot::record_len(g, 1).unwrap_or(u64::MAX);
    g.kv_bytes(n)
        .and_then(|kv| kv.checked_add(n.checked_mul(per_record - g.kv_bytes(1)?)?))
        .and_then(|x| x.checked_mul(2))
        .and_then(|x| x.checked_add(HEADER_LEN as u64))
        .unwrap_or(u64::MAX)
}

/// Reads and parses a snapshot file (checks everything but which model it belongs to).
pub fn read(path: &Path) -> Result<(Vec<u8>, Parsed), KvError> {
    let io = |e| KvError::io(path, e);
    let mut f = File::open(path).map_err(io)?;
    let len = f.metadata().map_err(io)?.len();
    let mut head = vec![0u8; HEADER_LEN.min(len as usize)];
    f.read_exact(&mut head).map_err(io)?;
    let g = snapshot::decode_header(&head)?;
    let max = max_file_len(&g);
    if len > max {
        return Err(KvError::Invalid {
            section: "file",
            offset: max,
            why: format!("{len} bytes is more than any snapshot of this shape can hold ({max})"),
        });
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
        Some((g, tokens)) if g == *want => tokens,
        _ => Vec::new(),
    }
}

/// What [`SnapshotFile::save`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SaveKind {
    /// The file already held these tokens.
    Unchanged,
    /// One record of the new positions was appended.
    Appended { positions: usize, bytes: u64 },
    /// The file was rewritten whole (new file, or the session no longer extends it).
    Rewritten { positions: usize, bytes: u64 },
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
    /// Tokens the file holds.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Restores the file's positions into `kv` (which must have this snapshot's shape) and
    /// returns the torn tail that was dropped, if any. A missing file restores nothing. On
    /// error `kv` may hold some rows but no tokens are claimed: the caller starts empty.
    pub fn load(&mut self, kv: &mut KvCache) -> Result<Option<TornTail>, KvError> {
        self.tokens.clear();
        self.valid_len = None;
        if !self.path.exists() {
            return Ok(None);
        }
        let (bytes, parsed) = read(&self.path)?;
        parsed.geometry.check_matches(&self.geometry)?;
        let cache_shape = (kv.n_layer(), kv.kv_dim(), kv.ty(), kv.n_ctx());
        let g = &self.geometry;
        if cache_shape
            != (
                g.n_layer as usize,
                g.kv_dim as usize,
                g.dtype,
                g.n_ctx as usize,
            )
        {
            return Err(KvError::Mismatch {
                field: "cache shape",
                file: format!("{:?}", (g.n_layer, g.kv_dim, g.dtype, g.n_ctx)),
                expected: format!("{cache_shape:?}"),
            });
        }
        for r in &parsed.records {
            if !kv.read_rows(r.first as usize, &bytes[r.kv.clone()]) {
                return Err(KvError::Invalid {
                    section: "record K/V rows",
                    offset: r.kv.start as u64,
                    why: "rows do not fit the cache".into(),
                });
            }
        }
        self.tokens = parsed.tokens;
        self.valid_len = Some(parsed.valid_len);
        Ok(parsed.torn)
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
            Some(end) if tokens.starts_with(&self.tokens) => {
                if tokens.len() == self.tokens.len() {
                    return Ok(SaveKind::Unchanged);
                }
                self.append(kv, tokens, end)
            }
            _ => self.rewrite(kv, tokens),
        }
    }

    fn record(&self, kv: &KvCache, tokens: &[u32], first: usize) -> Vec<u8> {
        let mut rows = Vec::new();
        kv.write_rows(first..tokens.len(), &mut rows);
        let mut out = Vec::with_capacity(rows.len() + 32 + 4 * tokens.len());
        snapshot::encode_record(
            &self.geometry,
            first as u32,
            &tokens[first..],
            &rows,
            &mut out,
        );
        out
    }

    fn append(&mut self, kv: &KvCache, tokens: &[u32], end: u64) -> Result<SaveKind, KvError> {
        let first = self.tokens.len();
        let rec = self.record(kv, tokens, first);
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
            f.write_all(&rec)?;
            f.sync_data()
        })();
        if let Err(e) = written {
            // Best effort: leave the file at its last complete record.
            let _ = f.set_len(end).and_then(|_| f.sync_data());
            return Err(io(e));
        }
        self.tokens.extend_from_slice(&tokens[first..]);
        self.valid_len = Some(end + rec.len() as u64);
        Ok(SaveKind::Appended {
            positions: tokens.len() - first,
            bytes: rec.len() as u64,
        })
    }

    fn rewrite(&mut self, kv: &KvCache, tokens: &[u32]) -> Result<SaveKind, KvError> {
        let mut bytes = snapshot::encode_header(&self.geometry).to_vec();
        if !tokens.is_empty() {
            bytes.extend_from_slice(&self.record(kv, tokens, 0));
        }
        replace_file(&self.path, &bytes)?;
        self.tokens = tokens.to_vec();
        self.valid_len = Some(bytes.len() as u64);
        Ok(SaveKind::Rewritten {
            positions: tokens.len(),
            bytes: bytes.len() as u64,
        })
    }
}

/// Replaces `path` by `bytes` atomically: a temporary file in the same directory, `fsync`,
/// `rename` over `path`, `fsync` of the directory. A crash leaves the old or the new file.
pub fn replace_file(path: &Path, bytes: &[u8]) -> Result<(), KvError> {
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
        f.write_all(bytes)
            .and_then(|_| f.sync_all())
            .map_err(|e| KvError::io(&tmp, e))?;
        drop(f);
        std::fs::rename(&tmp, path).map_err(|e| KvError::io(path, e))?;
        sync_dir(&dir)
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
