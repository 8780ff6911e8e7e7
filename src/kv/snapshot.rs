//! The KV snapshot format (see `docs/kv-format.md`): a checksummed file header followed by an
//! append-only log of checksummed records, one per saved turn. Pure functions over bytes, so
//! hostile inputs are tested without files. Every length is checked before it is used; no input
//! makes these functions panic or allocate more than the input's own size.

use crc::{CRC_32_ISCSI, Crc, Table};
use std::fmt;
use std::ops::Range;

/// File magic.
pub const MAGIC: [u8; 8] = *b"EDGEKV\0\0";
/// The format version this build writes. Version 1 (no sliding window: every record holds
/// every layer's rows) is still read.
pub const VERSION: u32 = 2;
/// Bytes of the file header (version 1: 64).
pub const HEADER_LEN: usize = 72;
/// Record magic.
pub const RECORD_MAGIC: [u8; 4] = *b"KVRC";
/// Bytes of a record header (version 1: 20).
pub const RECORD_HEADER_LEN: usize = 24;
/// Record kind: positions appended after the previous record.
pub const KIND_APPEND: u32 = 1;

/// Slice-by-16 tables (16 KiB): several times the byte-at-a-time speed, which matters when a
/// restart checks a 23 MB system prompt snapshot. Same checksum values.
const CRC32C: Crc<u32, Table<16>> = Crc::<u32, Table<16>>::new(&CRC_32_ISCSI);

/// CRC-32C (Castagnoli) of `bytes`.
pub fn crc32c(bytes: &[u8]) -> u32 {
    CRC32C.checksum(bytes)
}

/// Errors of KV snapshots: each says what is wrong and where.
#[derive(Debug, thiserror::Error)]
pub enum KvError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{section} at offset {offset}: needs {need} bytes, the file has {have}")]
    Truncated {
        section: &'static str,
        offset: u64,
        need: u64,
        have: u64,
    },
    #[error("{section} at offset {offset}: bad magic (not an edgellm KV snapshot)")]
    BadMagic { section: &'static str, offset: u64 },
    #[error(
        "format version {found} is newer than this edgellm reads ({supported}); upgrade edgellm or delete the file"
    )]
    FutureVersion { found: u32, supported: u32 },
    #[error("format version {found} is not supported (this edgellm reads version {supported})")]
    BadVersion { found: u32, supported: u32 },
    #[error(
        "{section} at offset {offset}: checksum mismatch (stored {stored:#010x}, computed {computed:#010x})"
    )]
    Checksum {
        section: &'static str,
        offset: u64,
        stored: u32,
        computed: u32,
    },
    #[error("{section} at offset {offset}: {why}")]
    Invalid {
        section: &'static str,
        offset: u64,
        why: String,
    },
    #[error(
        "the snapshot was made by another model or quantization (file fingerprint {file}, model {model})"
    )]
    WrongModel { file: String, model: String },
    #[error("the snapshot's {field} is {file} but this engine has {expected}")]
    Mismatch {
        field: &'static str,
        file: String,
        expected: String,
    },
}

impl KvError {
    pub(crate) fn io(path: &std::path::Path, source: std::io::Error) -> KvError {
        KvError::Io {
            path: path.display().to_string(),
            source,
        }
    }
}

#[path = "snapshot_header.rs"]
mod header;
pub use header::{Geometry, decode_header, encode_header, hex};
use header::{truncated, u32_at};

/// Appends one record (positions `first..first + tokens.len()`, the sliding layers' rows for
/// the last `window_rows` of them) to `out`, in the version we write. `kv` is what
/// [`super::KvCache::write_rows`] wrote for those positions.
pub fn encode_record(
    g: &Geometry,
    first: u32,
    tokens: &[u32],
    window_rows: u32,
    kv: &[u8],
    out: &mut Vec<u8>,
) {
    assert_eq!(
        Some(kv.len() as u64),
        g.rows_bytes(tokens.len() as u64, window_rows as u64),
        "K/V bytes do not match the positions"
    );
    assert!(window_rows as usize <= tokens.len());
    let mut h = [0u8; RECORD_HEADER_LEN];
    h[0..4].copy_from_slice(&RECORD_MAGIC);
    h[4..8].copy_from_slice(&KIND_APPEND.to_le_bytes());
    h[8..12].copy_from_slice(&first.to_le_bytes());
    h[12..16].copy_from_slice(&(tokens.len() as u32).to_le_bytes());
    h[16..20].copy_from_slice(&window_rows.to_le_bytes());
    let c = crc32c(&h[..20]);
    h[20..24].copy_from_slice(&c.to_le_bytes());
    out.extend_from_slice(&h);
    let t0 = out.len();
    for t in tokens {
        out.extend_from_slice(&t.to_le_bytes());
    }
    let c = crc32c(&out[t0..]);
    out.extend_from_slice(&c.to_le_bytes());
    out.extend_from_slice(kv);
    out.extend_from_slice(&crc32c(kv).to_le_bytes());
}

/// One valid record of a parsed snapshot.
#[derive(Clone, Debug)]
pub struct RecordInfo {
    /// Offset of the record header in the file.
    pub offset: u64,
    pub first: u32,
    pub count: u32,
    /// Positions, the last of the record, whose rows the sliding layers hold (`count`
    /// without a window).
    pub window_rows: u32,
    /// Byte range of the K/V rows in the file.
    pub kv: Range<usize>,
}

impl RecordInfo {
    /// Bytes of the whole record.
    pub fn len(&self) -> u64 {
        self.kv.end as u64 + 4 - self.offset
    }
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }
}

/// The end of a snapshot that did not hold a complete record: what a write interrupted by a
/// crash or power cut leaves. It is dropped; the snapshot is at its last complete record.
#[derive(Debug)]
pub struct TornTail {
    pub offset: u64,
    pub bytes: u64,
    pub reason: KvError,
}

impl fmt::Display for TornTail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "incomplete last record ({} bytes from offset {}) dropped: {}",
            self.bytes, self.offset, self.reason
        )
    }
}

/// A structurally valid snapshot.
#[derive(Debug)]
pub struct Parsed {
    pub geometry: Geometry,
    /// Tokens of positions `0..tokens.len()`, from the valid records.
    pub tokens: Vec<u32>,
    pub records: Vec<RecordInfo>,
    /// Bytes up to the end of the last valid record (where the next record goes).
    pub valid_len: u64,
    pub torn: Option<TornTail>,
    /// The first position from which the sliding layers' rows run to the end (0 without a
    /// window); see [`Geometry::window_covers`].
    pub window_from: usize,
}

/// Where the sliding layers' rows start after a record, given where they started before it:
/// the record's rows continue them only when it holds all its positions' rows.
pub fn window_from_after(before: usize, rec: &RecordInfo) -> usize {
    let end = (rec.first + rec.count) as usize;
    if rec.first == 0 || rec.window_rows < rec.count {
        end - rec.window_rows as usize
    } else {
        before
    }
}

/// The error for a snapshot whose sliding layers' rows do not reach back far enough.
pub fn window_short(g: &Geometry, from: usize, n: usize) -> KvError {
    KvError::Invalid {
        section: "records",
        offset: g.header_len() as u64,
        why: format!(
            "the sliding-window rows start at position {from}, too late for the token at {n} \
             (its window starts at {})",
            (n + 1).saturating_sub(g.window.map_or(0, |w| w.size))
        ),
    }
}

/// Parses and checks a whole snapshot: header, then records in order (checksums, contiguous
/// positions from 0, bounded by the context, the sliding layers' rows reaching back to the
/// window of the next token). A fault in the last record — one that reaches the end of the
/// file — is a torn write: the snapshot ends before it ([`Parsed::torn`]). A fault anywhere
/// else is corruption and an error.
pub fn parse(b: &[u8]) -> Result<Parsed, KvError> {
    let geometry = decode_header(b)?;
    let mut at = geometry.header_len();
    let mut p = Parsed {
        tokens: Vec::new(),
        records: Vec::new(),
        valid_len: at as u64,
        torn: None,
        window_from: 0,
        geometry,
    };
    while at < b.len() {
        match parse_record(
            &p.geometry,
            &b[at..],
            at,
            b.len() - at,
            p.tokens.len(),
            true,
        ) {
            Ok(mut rec) => {
                rec.info.offset = at as u64;
                rec.info.kv = at + rec.info.kv.start..at + rec.info.kv.end;
                at += rec.end;
                p.tokens.extend_from_slice(&rec.tokens);
                p.window_from = window_from_after(p.window_from, &rec.info);
                p.records.push(rec.info);
                p.valid_len = at as u64;
            }
            Err(Fault::Torn(reason)) => {
                p.torn = Some(TornTail {
                    offset: at as u64,
                    bytes: (b.len() - at) as u64,
                    reason,
                });
                break;
            }
            Err(Fault::Corrupt(e)) => return Err(e),
        }
    }
    // The writer always leaves the window covered; a torn tail may not (the restore then
    // recomputes), anything else is damage.
    let n = p.tokens.len();
    if p.torn.is_none() && !p.geometry.window_covers(p.window_from, n) {
        return Err(window_short(&p.geometry, p.window_from, n));
    }
    Ok(p)
}

/// Why a record cannot be used.
#[derive(Debug)]
pub enum Fault {
    /// The last write, interrupted: the snapshot ends before this record.
    Torn(KvError),
    /// Damage before the end: the snapshot is unusable.
    Corrupt(KvError),
}

/// A checked record, as [`check_record`] returns it.
#[derive(Debug)]
pub struct Rec {
    /// Its K/V range is relative to the bytes given to [`check_record`].
    pub info: RecordInfo,
    pub tokens: Vec<u32>,
    /// Bytes of the record.
    pub end: usize,
}

/// Bytes a reader needs from the start of a record to check it, given its first
/// `min(RECORD_HEADER_LEN, rest)` bytes `h` and the `rest` bytes from it to the end of the file:
/// the whole record when its header holds, else just the header. Never more than `rest`.
pub fn record_extent(g: &Geometry, h: &[u8], rest: u64) -> u64 {
    let hl = g.record_header_len();
    let header = (hl as u64).min(rest);
    if h.len() < hl || h[..4] != RECORD_MAGIC || u32_at(h, hl - 4) != crc32c(&h[..hl - 4]) {
        return header;
    }
    let (count, window_rows) = counts(g, h);
    if count > g.n_ctx || window_rows > count {
        return header;
    }
    record_len(g, count, window_rows).map_or(header, |n| n.min(rest))
}

/// A record header's `count` and `window_rows` (`count` in version 1).
fn counts(g: &Geometry, h: &[u8]) -> (u32, u32) {
    let count = u32_at(h, 12);
    (count, if g.version == 1 { count } else { u32_at(h, 16) })
}

/// Checks one record for a reader that streams the file: `b` holds the record's first
/// [`record_extent`] bytes, `at` is its offset, `rest` the bytes from it to the end of the file
/// and `have` the positions before it. The same rules as [`parse`].
pub fn check_record(g: &Geometry, b: &[u8], at: u64, rest: u64, have: usize) -> Result<Rec, Fault> {
    let rest = usize::try_from(rest).unwrap_or(usize::MAX);
    let mut rec = parse_record(g, b, at as usize, rest, have, true)?;
    rec.info.offset = at;
    Ok(rec)
}

/// The tokens of a snapshot whose K/V rows cannot be used (a corrupt record, a torn tail):
/// those of the leading records whose header and token checksums hold, K/V rows unchecked, with
/// the file's geometry, so that a caller that finds the model right can recompute the
/// conversation from them. `None` when the file header itself is bad.
pub fn salvage_tokens(b: &[u8]) -> Option<(Geometry, Vec<u32>)> {
    let g = decode_header(b).ok()?;
    let mut tokens = Vec::new();
    let mut at = g.header_len();
    while at < b.len() {
        match parse_record(&g, &b[at..], at, b.len() - at, tokens.len(), false) {
            Ok(rec) => {
                at += rec.end;
                tokens.extend_from_slice(&rec.tokens);
            }
            Err(_) => break,
        }
    }
    Some((g, tokens))
}

/// Checks the record at offset `at` of a file with `rest` bytes from there to its end; `b`
/// holds its first [`record_extent`] bytes (or more). Offsets in `Rec` are relative to `b`.
fn parse_record(
    g: &Geometry,
    b: &[u8],
    at: usize,
    rest: usize,
    have: usize,
    check_kv: bool,
) -> Result<Rec, Fault> {
    let hl = g.record_header_len();
    if rest < hl || b.len() < hl {
        return Err(Fault::Torn(truncated("record header", at, hl, rest)));
    }
    let h = &b[..hl];
    let first = u32_at(h, 8);
    let (count, window_rows) = counts(g, h);
    // A torn write is the last record of an append, cut short or with unwritten pages. The
    // first record (position 0) is never appended: a rewrite writes it, whole and synced
    // before the file is renamed into place, so once its bytes are all there a power cut
    // cannot have damaged them, and a bad byte in them is corruption wherever the file ends.
    let appended = have > 0;
    // A header that fails its checksum cannot say how long its record is: it is the torn tail
    // unless more bytes follow than any record could hold (then a later record exists, and
    // this is corruption).
    let len = record_len(g, count, window_rows);
    let room = (g.n_ctx as usize).saturating_sub(have) as u32;
    let may_be_tail = appended && record_len(g, room, room).is_none_or(|n| rest as u64 <= n);
    let fault = |e: KvError| {
        if may_be_tail {
            Fault::Torn(e)
        } else {
            Fault::Corrupt(e)
        }
    };
    if h[..4] != RECORD_MAGIC {
        return Err(fault(KvError::BadMagic {
            section: "record header",
            offset: at as u64,
        }));
    }
    let (stored, computed) = (u32_at(h, hl - 4), crc32c(&h[..hl - 4]));
    if stored != computed {
        return Err(fault(KvError::Checksum {
            section: "record header",
            offset: at as u64,
            stored,
            computed,
        }));
    }
    let invalid = |why: String| KvError::Invalid {
        section: "record header",
        offset: at as u64,
        why,
    };
    // A valid header checksum means the header is what was written: its faults are corruption.
    let kind = u32_at(h, 4);
    if kind != KIND_APPEND {
        return Err(Fault::Corrupt(invalid(format!(
            "unknown record kind {kind}"
        ))));
    }
    if first as usize != have {
        return Err(Fault::Corrupt(invalid(format!(
            "record starts at position {first}, but the records before it end at {have}"
        ))));
    }
    let end_pos = first as u64 + count as u64;
    if count == 0 || end_pos > g.n_ctx as u64 {
        return Err(Fault::Corrupt(invalid(format!(
            "record of {count} positions from {first} does not fit the context of {}",
            g.n_ctx
        ))));
    }
    // Without a window the sliding rows are all rows: one form only.
    if window_rows > count || (g.window.is_none() && window_rows != count) {
        return Err(Fault::Corrupt(invalid(format!(
            "record of {count} positions with {window_rows} sliding-window rows"
        ))));
    }
    let len = len.expect("bounded by n_ctx, so no overflow");
    if len > rest as u64 || len > b.len() as u64 {
        return Err(Fault::Torn(truncated(
            "record",
            at,
            len as usize,
            rest.min(b.len()),
        )));
    }
    // Checked above: the whole record is in `b`. With a valid header, a bad section is a torn
    // write only in the last record, and only if it was appended.
    let is_last = appended && len == rest as u64;
    let fault = |e: KvError| {
        if is_last {
            Fault::Torn(e)
        } else {
            Fault::Corrupt(e)
        }
    };
    let t0 = hl;
    let t1 = t0 + 4 * count as usize;
    let (stored, computed) = (u32_at(b, t1), crc32c(&b[t0..t1]));
    if stored != computed {
        return Err(fault(KvError::Checksum {
            section: "record tokens",
            offset: (at + t0) as u64,
            stored,
            computed,
        }));
    }
    let k0 = t1 + 4;
    let k1 = len as usize - 4;
    let (stored, computed) = (u32_at(b, k1), crc32c(&b[k0..k1]));
    if check_kv && stored != computed {
        return Err(fault(KvError::Checksum {
            section: "record K/V rows",
            offset: (at + k0) as u64,
            stored,
            computed,
        }));
    }
    let tokens = b[t0..t1]
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    Ok(Rec {
        info: RecordInfo {
            offset: at as u64,
            first,
            count,
            window_rows,
            kv: k0..k1,
        },
        tokens,
        end: len as usize,
    })
}

/// Bytes of a record of `count` positions whose sliding layers hold `window_rows`, or `None`
/// on overflow.
pub fn record_len(g: &Geometry, count: u32, window_rows: u32) -> Option<u64> {
    let kv = g.rows_bytes(count as u64, window_rows as u64)?;
    (g.record_header_len() as u64 + 4 * count as u64 + 4 + 4).checked_add(kv)
}
